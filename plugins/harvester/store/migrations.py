"""Schema migrations: sql/NNN_*.sql applied in order, once each, recorded in schema_migrations."""
from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parents[3] / "sql"
_NAME = re.compile(r"^(\d{3})_[A-Za-z0-9_]+\.sql$")
# Any constant works: it only keeps two processes from migrating at once.
_LOCK_KEY = 0x4841525653  # "HARVS"


def migration_files(sql_dir: Path = SQL_DIR) -> list[tuple[int, Path]]:
    files = []
    for path in sorted(sql_dir.glob("*.sql")):
        match = _NAME.match(path.name)
        if not match:
            raise RuntimeError(f"migration file {path.name} must be named NNN_description.sql")
        files.append((int(match.group(1)), path))
    versions = [v for v, _ in files]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations in {sql_dir} share a number: {versions}")
    return files


def migrate(conn, sql_dir: Path = SQL_DIR) -> list[str]:
    """Apply pending migrations, each in its own transaction; return the names applied."""
    applied_now: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
        for version, path in migration_files(sql_dir):
            if version in done:
                continue
            log.info("applying migration %s", path.name)
            conn.execute(path.read_text(encoding="utf-8"))
            conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, path.name))
            applied_now.append(path.name)
    return applied_now
