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


class MigrationError(RuntimeError):
    """A migration failed: it was rolled back, the ones before it stay applied."""


def migrate(conn, sql_dir: Path = SQL_DIR) -> list[str]:
    """Apply pending migrations in order, each in its own transaction, and return the names applied.
    A failing migration is rolled back and named (MigrationError); those before it stay applied and
    recorded. A session advisory lock keeps two processes from migrating at once. Call it with no
    transaction open (an autocommit connection, or one idle)."""
    files = migration_files(sql_dir)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
    try:
        with conn.transaction():
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
        applied_now: list[str] = []
        for version, path in files:
            if version in done:
                continue
            log.info("applying migration %s", path.name)
            try:
                with conn.transaction():
                    conn.execute(path.read_text(encoding="utf-8"))
                    conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                                 (version, path.name))
            except Exception as exc:
                before = f"; applied before it: {', '.join(applied_now)}" if applied_now else ""
                raise MigrationError(f"migration {path.name} failed and was rolled back{before}: "
                                     f"{type(exc).__name__}: {exc}") from exc
            applied_now.append(path.name)
    finally:
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
        except Exception:  # the session is gone, and its lock with it: keep the original error
            log.debug("could not release the migration lock", exc_info=True)
    log.info("schema migrations: %s", f"applied {', '.join(applied_now)}" if applied_now
             else f"up to date ({len(files)} applied)")
    return applied_now


def pending(conn, sql_dir: Path = SQL_DIR) -> list[str]:
    """The names of the migrations not applied yet. Waits for a migration under way (the shared
    side of migrate's lock), then reads schema_migrations once."""
    import psycopg

    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", (_LOCK_KEY,))
            done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
    except psycopg.errors.UndefinedTable:  # an empty database
        done = set()
    return [path.name for version, path in migration_files(sql_dir) if version not in done]
