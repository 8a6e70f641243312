"""Schema migrations: sql/NNN_*.sql applied in order, once each, recorded in schema_migrations."""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parents[3] / "sql"
_NAME = re.compile(r"^(\d{3})_[A-Za-z0-9_]+\.sql$")
# Any constant works: it only keeps two processes from migrating at once.
_LOCK_KEY = 0x4841525653  # "HARVS"


# A migration that writes a table anew in place (ALTER TABLE ... TYPE) leaves no page of it marked
# all-visible, and no inserted or dead rows for autovacuum to count: index-only scans of it then read
# the heap for every row (search's portal filters: sql/028) until something vacuums it. Such a
# migration names the table on a line of its own, "--! vacuum after: <table>", and migrate vacuums
# it once the migration has committed (VACUUM cannot run inside a transaction).
_VACUUM_AFTER = re.compile(r"^--! vacuum after: ([a-z_][a-z0-9_]*)[ \t]*$", re.M)


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


class UnsupportedServer(MigrationError):
    """The server, or its pgvector, is not one Harvester supports: nothing was migrated. Terminal
    (trying again changes nothing); the message is one line naming what is missing and what is
    supported."""


# What Harvester supports (docs/operations.md, "Supported versions"): PostgreSQL 15 to 18, the ones
# CI runs on (15 and 18) and those between; pgvector 0.8.0 or newer (hnsw.iterative_scan, which
# filtered searches use, came in 0.8.0; halfvec in 0.7.0).
SUPPORTED_MAJORS = (15, 16, 17, 18)
MIN_VECTOR = (0, 8, 0)
SUPPORTED = (f"Harvester supports PostgreSQL {SUPPORTED_MAJORS[0]} to {SUPPORTED_MAJORS[-1]} with pgvector "
             f"{'.'.join(map(str, MIN_VECTOR))} or newer")


@dataclass(frozen=True)
class ServerFacts:
    """What the pre-migration check reads: the server's version, pgvector as the server offers it
    (the default version of the extension's files: None when they are not installed) and as the
    database has it (None when CREATE EXTENSION was never run), and who asks where."""

    version_num: int  # server_version_num: 150004 is 15.4
    version: str  # server_version, as the server says it
    vector_available: str | None
    vector_installed: str | None
    database: str
    role: str

    @property
    def major(self) -> int:
        return self.version_num // 10000


def _version_tuple(text: str) -> tuple[int, ...]:
    """'0.8.0' -> (0, 8, 0); a suffix after the numbers ('0.8.0-beta') is ignored."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("-")[0])[:3])


def unsupported(facts: ServerFacts) -> str | None:
    """Why Harvester cannot migrate this database (one line), or None. A server newer than the
    newest supported passes (logged by check_server): PostgreSQL keeps SQL and pgvector compatible."""
    minimum = ".".join(map(str, MIN_VECTOR))
    if facts.major < SUPPORTED_MAJORS[0]:
        return f"PostgreSQL {facts.version} is too old: {SUPPORTED}"
    if facts.vector_installed is not None:
        if _version_tuple(facts.vector_installed) < MIN_VECTOR:
            newer = (facts.vector_available is not None and _version_tuple(facts.vector_available) >= MIN_VECTOR)
            remedy = (f"run ALTER EXTENSION vector UPDATE; in it as its owner or a superuser (the server has "
                      f"{facts.vector_available})" if newer else
                      f"install pgvector {minimum} or newer on the server, then run ALTER EXTENSION vector UPDATE;")
            return (f"pgvector {facts.vector_installed} is installed in database \"{facts.database}\" and Harvester "
                    f"needs {minimum} or newer: {remedy} ({SUPPORTED})")
        return None
    if facts.vector_available is None:
        return (f"the vector extension (pgvector) is not available on PostgreSQL {facts.version}: install pgvector "
                f"{minimum} or newer on the server, or enable it on a managed service ({SUPPORTED})")
    if _version_tuple(facts.vector_available) < MIN_VECTOR:
        return (f"the server offers pgvector {facts.vector_available} and Harvester needs {minimum} or newer: "
                f"upgrade pgvector on the server ({SUPPORTED})")
    return None


def server_facts(conn) -> ServerFacts:
    with conn.transaction():
        row = conn.execute(
            "SELECT current_setting('server_version_num')::int, current_setting('server_version'),"
            " (SELECT default_version FROM pg_available_extensions WHERE name = 'vector'),"
            " (SELECT extversion FROM pg_extension WHERE extname = 'vector'),"
            " current_database(), current_user").fetchone()
    return ServerFacts(*row)


def check_server(conn) -> ServerFacts:
    """Before any migration: the server is a supported PostgreSQL and the database has, or may be given,
    a supported pgvector. When the extension is available but not installed it is created here
    (what the first migration would do): a role that may not create it gets UnsupportedServer
    saying who must, instead of a failed migration. Touches nothing else."""
    import psycopg

    facts = server_facts(conn)
    reason = unsupported(facts)
    if reason:
        raise UnsupportedServer(reason)
    if facts.major > SUPPORTED_MAJORS[-1]:
        log.warning("PostgreSQL %s is newer than Harvester is tested on (%s); going on", facts.version, SUPPORTED)
    if facts.vector_installed is None:
        try:
            with conn.transaction():
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except psycopg.errors.InsufficientPrivilege as exc:
            raise UnsupportedServer(
                f"the vector extension (pgvector {facts.vector_available}) is not installed in database "
                f"\"{facts.database}\" and role \"{facts.role}\" may not create it "
                f"({str(exc).strip().splitlines()[0]}): have a superuser (on a managed service, its admin "
                f"role) run CREATE EXTENSION vector; in that database") from None
        log.info("created the vector extension (pgvector %s) in database %s", facts.vector_available, facts.database)
    return facts


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
    fails (the task that ran it is retried later). First, whatever is pending, the server is checked
    (check_server): an unsupported PostgreSQL or pgvector is UnsupportedServer, before anything is
    touched. Call it with no transaction open."""
    import psycopg

    files = migration_files(sql_dir)
    check_server(conn)
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
                    text = path.read_text(encoding="utf-8")
                    conn.execute(text)
                    conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                                 (version, path.name))
                applied_now.append(path.name)
                _vacuum_after(conn, path.name, _VACUUM_AFTER.findall(text))
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
    if applied_now:
        log.info("schema migrations: applied %s", ", ".join(applied_now))
    else:  # what every task finds once the schema is current: nothing new, so not in its log at INFO
        log.debug("schema migrations: up to date (%d applied)", len(files))
    return applied_now


def _vacuum_after(conn, name: str, tables: list[str]) -> None:
    """VACUUM (not FULL: runs and searches go on) each of ``tables`` that the committed migration
    ``name`` wrote anew (_VACUUM_AFTER), unless it is empty: a new database's tables are left without
    statistics for its first bulk run to analyze (store/datasets.py). A VACUUM that fails (a lock
    waited on past the session's lock_timeout, the connection lost) is a warning, not the migration's
    failure: the table is right, only its index-only scans are slower until it is vacuumed."""
    import psycopg
    from psycopg import sql

    for table in tables:
        started = time.monotonic()
        autocommit = conn.autocommit
        try:
            conn.autocommit = True
            if not conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(table))).fetchone()[0]:
                continue
            conn.execute(sql.SQL("VACUUM (PROCESS_TOAST FALSE) {}").format(sql.Identifier(table)))
            log.info("after migration %s: %s vacuumed in %.1f s (its pages marked all-visible for index-only scans)",
                     name, table, time.monotonic() - started)
        except psycopg.Error as exc:
            message = (exc.diag.message_primary if exc.diag else None) or str(exc).strip()
            log.warning("after migration %s: VACUUM %s failed (%s: %s); its index-only scans read the heap until"
                        " it is vacuumed: run VACUUM %s", name, table, type(exc).__name__, message, table)
        finally:
            try:
                conn.autocommit = autocommit
            except psycopg.Error:  # the connection was lost: the caller's next statement says so
                pass


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
