"""A SQL function as an earlier migration defined it, for tests that compare a migration's new
definition with the one it replaces (same rows, same keys): the definition is read from the
migration file itself and created under another name in pg_temp."""
from __future__ import annotations

import re

from harvester.store import migrations


def earlier_definition(prefix: str, name: str, as_name: str, calls: dict[str, str] | None = None) -> str:
    """The CREATE [OR REPLACE] FUNCTION ``name`` statement of the migration whose file name starts
    with ``prefix`` (e.g. "018_"), renamed to pg_temp.``as_name``; ``calls`` renames the functions
    its body calls (old name -> new name: pg_temp functions are called by their schema too)."""
    path = next((p for _, p in migrations.migration_files() if p.name.startswith(prefix)), None)
    assert path is not None, f"no migration starting with {prefix!r}"
    body = re.search(rf"CREATE (?:OR REPLACE )?FUNCTION {name}\(.*?\n\$\$;", path.read_text(), re.S)
    assert body, f"{path}: {name}'s definition not found"
    text = re.sub(rf"CREATE (?:OR REPLACE )?FUNCTION {name}\(", f"CREATE FUNCTION pg_temp.{as_name}(", body.group(0))
    for old, new in (calls or {}).items():
        text = text.replace(f"{old}(", f"{new}(")
    return text
