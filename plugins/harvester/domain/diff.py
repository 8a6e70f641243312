"""What changed between two versions of a dataset: which versions to compare, their snapshots as
lines, the unified diff of those lines (what `harvester diff` prints and the API's diff answers)
and the fields side by side. Pure: no IO."""
from __future__ import annotations

import difflib
import json
import re
import textwrap

WIDTH = 78
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")
_FIRST = ("title", "description")


def versions_to_compare(current: int | None, from_: int | None = None,
                        to: int | None = None) -> tuple[int | None, int | None]:
    """(from, to): ``to`` defaults to the current version, ``from`` to the version before ``to``
    (None when ``to`` is the first or there is no version)."""
    to_n = to if to is not None else current
    if from_ is not None:
        return from_, to_n
    return (None if to_n is None else to_n - 1 or None), to_n


def _wrapped(text: str) -> list[str]:
    lines = []
    for sentence in _SENTENCE_END.split(text or ""):
        lines.extend(textwrap.wrap(sentence, WIDTH - 2) or [""])
    return lines


def _line(key: str, value) -> str:
    return f"{key}: {json.dumps(value, sort_keys=True, ensure_ascii=False)}"


def snapshot_lines(snapshot: dict | None) -> list[str]:
    """A snapshot as lines fit for a diff: the title, the description wrapped (a sentence or 76
    columns a line), then every other field as JSON, one line per list item and per mapping key."""
    snapshot = snapshot or {}
    lines = [f"title: {snapshot.get('title') or ''}", "description:"]
    lines.extend("  " + line for line in _wrapped(snapshot.get("description") or ""))
    for key in sorted(k for k in snapshot if k not in _FIRST):
        value = snapshot[key]
        if isinstance(value, dict) and value:
            lines.extend(_line(f"{key}.{sub}", value[sub]) for sub in sorted(value, key=str))
        elif isinstance(value, list) and value:
            lines.extend(_line(f"{key}[]", item) for item in value)
        else:
            lines.append(_line(key, value))
    return lines


def unified_diff(old: dict | None, new: dict | None, from_label: str, to_label: str) -> list[str]:
    """The unified diff of two snapshots' lines (no line ends), headed by the two labels; [] when
    the snapshots read the same."""
    return list(difflib.unified_diff(snapshot_lines(old), snapshot_lines(new), fromfile=from_label,
                                     tofile=to_label, lineterm=""))


def field_changes(old: dict | None, new: dict | None) -> list[dict]:
    """Every field of either snapshot (title, description, then the others sorted) as
    ``{"field", "old", "new", "changed"}``. ``old`` None: there is no older version (old values
    None, nothing changed)."""
    before, after = old or {}, new or {}
    keys = [*_FIRST, *sorted((set(before) | set(after)) - set(_FIRST))]
    return [{"field": key, "old": before.get(key) if old is not None else None, "new": after.get(key),
             "changed": old is not None and before.get(key) != after.get(key)} for key in keys]
