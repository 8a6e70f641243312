"""Schema migrations: sql/NNN_*.sql applied in order, once each, recorded in schema_migrations."""
from __future__ import annotations

import logging
import re
import time
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
    """A migration failed: it was rolled back, the ones before it stay applied. Transient when the
    database got in its way (a lock waited on too long, a deadlock, a connection lost, the server
    shutting down or out of resources: a later try may pass); terminal when its SQL fails."""

    @property
    def transient(self) -> bool:
        import psycopg

        cause = self.__cause__
        return isinstance(cause, psycopg.OperationalError) and (  # class 08, 40, 53, 55, 57; None: no answer
            cause.sqlstate is None or cause.sqlstate[:2] in ("08", "40", "53", "55", "57"))


# A migration's statements may each wait this long for a lock (an ALTER TABLE waits for every
# transaction using the table, and everyone else then queues behind it): short, and tried again.
LOCK_TIMEOUT = "5s"
LOCK_ATTEMPTS = 6


def _applied(conn) -> set[int]:
    import psycopg

    try:
        with conn.transaction():
            return {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
    except psycopg.errors.UndefinedTable:  # an empty database
        return set()


def migrate(conn, sql_dir: Path = SQL_DIR) -> list[str]:
    """Apply pending migrations in order, each in its own transaction, and return the names applied.
    A failing migration is rolled back and named (MigrationError); those before it stay applied and
    recorded. Safe while runs are in flight, from any number of processes: each migration runs
    under a transaction-level advisory lock (so a connection pooler in transaction mode is fine)
    and checks again that nobody applied it meanwhile; its statements wait at most LOCK_TIMEOUT for
    a lock, and on a timeout it is rolled back and tried again, LOCK_ATTEMPTS times, before it
    fails (the task that ran it is retried later). Call it with no transaction open."""
    import psycopg

    files = migration_files(sql_dir)
    done = _applied(conn)
    applied_now: list[str] = []
    if not done:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
    for version, path in files:
        if version in done:
            continue
        for attempt in range(1, LOCK_ATTEMPTS + 1):
            try:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                    if conn.execute("SELECT 1 FROM schema_migrations WHERE version = %s", (version,)).fetchone():
                        break  # another process applied it while we waited
                    log.info("applying migration %s", path.name)
                    conn.execute("SELECT set_config('lock_timeout', %s, true)", (LOCK_TIMEOUT,))
                    conn.execute(path.read_text(encoding="utf-8"))
                    conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                                 (version, path.name))
                applied_now.append(path.name)
                break
            except psycopg.errors.LockNotAvailable as exc:
                if attempt < LOCK_ATTEMPTS:
                    log.warning("migration %s waited more than %s for a lock (attempt %d of %d): %s; trying again",
                                path.name, LOCK_TIMEOUT, attempt, LOCK_ATTEMPTS, str(exc).strip())
                    time.sleep(min(2.0 * attempt, 10.0))
                    continue
                raise MigrationError(_failed(path, applied_now, exc)) from exc
            except Exception as exc:
                raise MigrationError(_failed(path, applied_now, exc)) from exc
    log.info("schema migrations: %s", f"applied {', '.join(applied_now)}" if applied_now
             else f"up to date ({len(files)} applied)")
    return applied_now


def _failed(path: Path, applied_now: list[str], exc: BaseException) -> str:
    before = f"; applied before it: {', '.join(applied_now)}" if applied_now else ""
    return f"migration {path.name} failed and was rolled back{before}: {type(exc).__name__}: {exc}"


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
