"""Per-portal HNSW indexes over search's copies of the vectors (sql/029, issue 40).

A portal filter that leaves more datasets than search ranks exactly (HARVESTER_SEARCH_EXACT_LIMIT)
used to scan the model's shared HNSW index with the filter checked per vector: when the portal
holds 5-50% of the catalogue, pgvector's iterative scan under that filter found 84-94% of the true
ten nearest, or gave up and ranked the portal exactly (64-120 ms at p95 at a million). A partial
HNSW index on ``dataset_vectors`` holding one portal's copies of one model's vectors (``WHERE
scope = <id>``: vector_scopes, sql/041) answers such a query with nothing to reject.

The life cycle (``maintain``), after each run of a portal commits (pipeline/steps.py ``upsert``)
or from ``harvester embeddings portal-indexes --build``:

- the portal gets an index of the active model when its live datasets exceed ``min_datasets``
  (default: exact_limit, where the exact path stops), hold at most ``max_share`` of the catalogue's
  live datasets (a portal that is nearly the whole catalogue is served as well by the shared index:
  its filter rejects few vectors, and a second graph of the same vectors would double the storage
  for nothing; 0.9: with a tenth of the catalogue elsewhere the filtered scan of the shared index
  still rejects one vector in ten at most), and its copies were last checked complete for the model
  (dataset_vectors_checked: an index over copies still being written would miss datasets);
- built with CREATE INDEX CONCURRENTLY (nobody's writes or searches wait for it) under a
  statement_timeout and a lock_timeout (the build first waits for every transaction older than it,
  another portal's merge: bounded, and the next run tries again);
- an index of another model (after a model switch), or of a portal that fell below the threshold,
  grew past the share, or has no live dataset any more, is dropped concurrently; an invalid index
  left by a build that failed or was stopped is dropped and built again by the next run;
- two maintenances of one portal never run at once (a session advisory lock, tried: the second
  skips), and a failure is a warning, never a failed run: the run's data is committed already.

Search (store/search.py ``_vector_side``) uses an index only when it is recorded in portal_indexes,
valid in pg_index, and the portal's copies are checked for its model (``usable``).
"""
from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

from psycopg import sql

from harvester.config.settings import env_values

log = logging.getLogger(__name__)

PREFIX = "dataset_vectors_p_"
# What a portal's index holds: the halfvec vectors themselves, ranked by cosine distance, whatever
# the models' shared indexes hold (HARVESTER_INDEX_KIND, store/vectors.py).
KIND = "halfvec"
# pg_try_advisory_lock(LOCK_CLASS, hashtext(portal)): two keys, apart from the one-key locks elsewhere
LOCK_CLASS = 40029


@dataclass(frozen=True)
class PortalIndexSettings:
    min_datasets: int = 20000         # 0: never build (and drop what was built)
    max_share: float = 0.9
    build_timeout: float = 1800.0     # seconds (statement_timeout of the build)
    lock_timeout: float = 60.0        # seconds (waiting for older transactions, for a lock)

    @classmethod
    def from_env(cls, environ=None) -> "PortalIndexSettings":
        got = env_values(("HARVESTER_PORTAL_INDEX_MIN_DATASETS", "HARVESTER_PORTAL_INDEX_MAX_SHARE",
                          "HARVESTER_PORTAL_INDEX_BUILD_TIMEOUT_SECS", "HARVESTER_PORTAL_INDEX_LOCK_TIMEOUT_SECS",
                          "HARVESTER_SEARCH_EXACT_LIMIT"), environ)
        least = got["HARVESTER_PORTAL_INDEX_MIN_DATASETS"]
        return cls(min_datasets=got["HARVESTER_SEARCH_EXACT_LIMIT"] if least is None else least,
                   max_share=got["HARVESTER_PORTAL_INDEX_MAX_SHARE"],
                   build_timeout=got["HARVESTER_PORTAL_INDEX_BUILD_TIMEOUT_SECS"],
                   lock_timeout=got["HARVESTER_PORTAL_INDEX_LOCK_TIMEOUT_SECS"])


def index_name(portal_url: str, model: str) -> str:
    """A short name from a hash of the portal and the model (a URL is no identifier)."""
    return PREFIX + hashlib.sha1(f"{portal_url}\0{model}".encode()).hexdigest()[:16]


def _state(conn, name: str) -> str | None:
    """None (no such index), ``valid``, ``building`` (CREATE INDEX CONCURRENTLY under way) or ``dead``."""
    row = conn.execute(
        """
        SELECT CASE WHEN i.indisvalid THEN 'valid'
                    WHEN EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = c.oid)
                    THEN 'building' ELSE 'dead' END
        FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
        WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace
        """, (name,)).fetchone()
    return row[0] if row else None


def usable(conn, portal_url: str, model: str) -> int | None:
    """The scope (vector_scopes, sql/041) whose predicate the portal's index of ``model`` has, when
    search may scan that index: recorded, valid, and the portal's copies last checked complete for
    the model (a model switch or a first sync still copying leaves it unchecked: search takes the
    shared index until the next full pass). None otherwise."""
    row = conn.execute(
        """
        SELECT v.id FROM portal_indexes r
        JOIN pg_class c ON c.relname = r.index_name AND c.relnamespace = current_schema()::regnamespace
        JOIN pg_index i ON i.indexrelid = c.oid AND i.indisvalid
        JOIN dataset_vectors_checked k ON k.portal_url = r.portal_url AND k.model = r.model
        JOIN vector_scopes v ON v.portal_url = r.portal_url AND v.model = r.model
        WHERE r.portal_url = %s AND r.model = %s
        """, (portal_url, model)).fetchone()
    return None if row is None else int(row[0])


def listing(conn) -> list[dict]:
    """The recorded indexes, with their state now (``valid``, ``building``, ``dead``, ``missing``),
    their size now and whether search uses them."""
    rows = conn.execute(
        """
        SELECT r.portal_url, r.model, r.index_name, r.dimension, r.datasets, r.build_seconds, r.built_at,
               coalesce(pg_relation_size(c.oid), 0),
               CASE WHEN c.oid IS NULL THEN 'missing' WHEN i.indisvalid THEN 'valid'
                    WHEN EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = c.oid)
                    THEN 'building' ELSE 'dead' END,
               EXISTS (SELECT 1 FROM dataset_vectors_checked k WHERE k.portal_url = r.portal_url AND k.model = r.model)
        FROM portal_indexes r
        LEFT JOIN pg_class c ON c.relname = r.index_name AND c.relnamespace = current_schema()::regnamespace
        LEFT JOIN pg_index i ON i.indexrelid = c.oid
        ORDER BY r.portal_url, r.model
        """).fetchall()
    keys = ("portal_url", "model", "index_name", "dimension", "datasets", "build_seconds", "built_at", "bytes",
            "state", "checked")
    out = [dict(zip(keys, row)) for row in rows]
    for row in out:
        row["searched"] = row["state"] == "valid" and row["checked"]
    return out


def _drop(conn, name: str, settings: PortalIndexSettings) -> None:
    """DROP INDEX CONCURRENTLY (waits for the queries using it, blocks nobody), bounded by lock_timeout."""
    conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(settings.lock_timeout * 1000)}ms",))
    conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
    conn.execute("DELETE FROM portal_indexes WHERE index_name = %s", (name,))


def _live(conn, portal_url: str, settings: PortalIndexSettings) -> tuple[int, int | None]:
    """(the portal's live datasets, the catalogue's): the catalogue is counted only for a portal over
    the threshold (a run of a small portal pays one count of its own datasets)."""
    portal = conn.execute("SELECT count(*) FROM datasets WHERE portal_url = %s AND removed_at IS NULL",
                          (portal_url,)).fetchone()[0]
    if not settings.min_datasets or portal <= settings.min_datasets:
        return portal, None
    return portal, conn.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL").fetchone()[0]


def wanted(portal_live: int, catalogue_live: int | None, settings: PortalIndexSettings) -> bool:
    """Whether a portal of ``portal_live`` live datasets, in a catalogue of ``catalogue_live``, gets its index."""
    return bool(settings.min_datasets) and portal_live > settings.min_datasets and catalogue_live is not None \
        and portal_live <= settings.max_share * catalogue_live


def maintain(conn, portal_url: str, model: str, dimension: int | None = None,
             settings: PortalIndexSettings | None = None, deadline: float | None = None) -> dict:
    """Bring the portal's indexes in line with the rule (module docstring). ``conn``: autocommit, no
    transaction open (CONCURRENTLY). ``deadline``: a time.monotonic() value the build's
    statement_timeout must not pass. Returns what it did: {"action": "built" | "dropped" | "kept" |
    "none" | "skipped" | "unchecked" | "failed", "index": name, "seconds", "datasets", "bytes",
    "dropped": [names], "reason"}. Raises psycopg errors (``after_run`` logs them)."""
    from harvester.store import vectors

    settings = settings or PortalIndexSettings.from_env()
    name = index_name(portal_url, model)
    out = {"action": "none", "index": name, "dropped": []}
    if not conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (LOCK_CLASS, portal_url)).fetchone()[0]:
        return {**out, "action": "skipped", "reason": "another connection maintains this portal's index now"}
    before = conn.execute("SELECT current_setting('lock_timeout'), current_setting('statement_timeout'),"
                          " current_setting('maintenance_work_mem'),"
                          " current_setting('max_parallel_maintenance_workers')").fetchone()
    try:
        portal_live, catalogue_live = _live(conn, portal_url, settings)
        keep = wanted(portal_live, catalogue_live, settings)
        # another model's index (a model switch), or this one when the portal is no longer wanted
        for (other,) in conn.execute("SELECT index_name FROM portal_indexes WHERE portal_url = %s"
                                     " AND (model <> %s OR NOT %s)", (portal_url, model, keep)).fetchall():
            _drop(conn, other, settings)
            out["dropped"].append(other)
        state = _state(conn, name)
        if state == "dead" or (state is not None and not keep):
            _drop(conn, name, settings)   # an earlier build that failed or was stopped; or unrecorded and unwanted
            if name not in out["dropped"]:
                out["dropped"].append(name)
            state = None
        if not keep:
            return {**out, "action": "dropped" if out["dropped"] else "none", "datasets": portal_live}
        if state == "building":
            return {**out, "action": "skipped", "reason": "its build is under way on another connection"}
        if state == "valid":
            if conn.execute("SELECT NOT EXISTS (SELECT 1 FROM portal_indexes WHERE index_name = %s)",
                            (name,)).fetchone()[0]:
                _record(conn, portal_url, model, name, dimension, portal_live, 0.0)  # built before the record
            return {**out, "action": "kept", "datasets": portal_live}
        if not vectors.copies_checked(conn, portal_url, model):
            return {**out, "action": "unchecked", "datasets": portal_live,
                    "reason": "the portal's copies of the model's vectors are not complete yet"}
        if dimension is None:
            dimension = vectors.stored_dimension(conn, model)
            if dimension is None:
                return {**out, "action": "none", "reason": "no vector of the model"}
        return {**out, **_build(conn, portal_url, model, name, dimension, portal_live, settings, deadline)}
    finally:
        if not conn.closed:
            conn.execute("SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false),"
                         " set_config('maintenance_work_mem', %s, false),"
                         " set_config('max_parallel_maintenance_workers', %s, false)", before)
            conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (LOCK_CLASS, portal_url))


def _build(conn, portal_url, model, name, dimension, portal_live, settings, deadline) -> dict:
    import psycopg

    from harvester.domain.sizes import build_memory, format_size, hnsw_graph_bytes, parse_size
    from harvester.store import vectors

    timeout = settings.build_timeout
    if deadline is not None:
        timeout = min(timeout, deadline - time.monotonic())
        if timeout < 1:
            return {"action": "skipped", "datasets": portal_live, "reason": "the task's time is up"}
    index = vectors.IndexSettings.from_env()
    graph = hnsw_graph_bytes(portal_live, dimension, KIND)
    memory = format_size(build_memory(graph, parse_size(index.build_memory), parse_size(index.build_memory_max)))
    conn.execute("SELECT set_config('maintenance_work_mem', %s, false),"
                 " set_config('max_parallel_maintenance_workers', %s, false),"
                 " set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)",
                 (memory, str(index.build_workers), f"{int(settings.lock_timeout * 1000)}ms", f"{int(timeout * 1000)}ms"))
    scope = vectors.existing_scope(conn, portal_url, model)
    if scope is None:
        return {"action": "none", "datasets": portal_live, "reason": "no copy of the model's vectors"}
    statement = sql.SQL(
        "CREATE INDEX CONCURRENTLY {name} ON dataset_vectors USING hnsw ({expr} {ops})"
        " WHERE scope = {scope}").format(
        name=sql.Identifier(name), expr=vectors.index_expression(dimension, KIND),
        ops=sql.SQL(vectors.opclass(dimension, KIND)), scope=sql.Literal(scope))
    log.info("building the HNSW index %s of portal %s, model %s: about %d vectors; maintenance_work_mem %s, "
             "statement_timeout %.0fs, lock_timeout %.0fs (it first waits for the transactions older than it)",
             name, portal_url, model, portal_live, memory, timeout, settings.lock_timeout)
    started = time.perf_counter()
    try:
        conn.execute(statement)
    except psycopg.Error:
        if not conn.closed and _state(conn, name) == "dead":
            try:
                _drop(conn, name, settings)
            except psycopg.Error:
                pass  # left invalid: the next maintenance drops it
        raise
    seconds = time.perf_counter() - started
    size = _record(conn, portal_url, model, name, dimension, portal_live, seconds)
    return {"action": "built", "seconds": seconds, "datasets": portal_live, "bytes": size}


def _record(conn, portal_url, model, name, dimension, portal_live, seconds) -> int:
    from harvester.store import vectors

    if dimension is None:
        dimension = vectors.stored_dimension(conn, model)
    size = conn.execute("SELECT pg_relation_size(%s::regclass)", (name,)).fetchone()[0]
    conn.execute(
        """
        INSERT INTO portal_indexes (portal_url, model, index_name, dimension, datasets, build_seconds, bytes)
        VALUES (%s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (portal_url, model) DO UPDATE SET index_name = EXCLUDED.index_name,
            dimension = EXCLUDED.dimension, datasets = EXCLUDED.datasets, build_seconds = EXCLUDED.build_seconds,
            bytes = EXCLUDED.bytes, built_at = now()
        """, (portal_url, model, name, int(dimension), portal_live, seconds, size))
    return int(size)


def drop_orphans(conn, settings: PortalIndexSettings | None = None) -> list[str]:
    """Drop the recorded indexes of portals with no live dataset left (a portal removed)."""
    settings = settings or PortalIndexSettings.from_env()
    gone = [r[0] for r in conn.execute(
        "SELECT r.index_name FROM portal_indexes r WHERE NOT EXISTS"
        " (SELECT 1 FROM datasets d WHERE d.portal_url = r.portal_url AND d.removed_at IS NULL)").fetchall()]
    for name in gone:
        _drop(conn, name, settings)
    return gone


def after_run(conn, portal_url: str, model: str, deadline: float | None = None) -> dict | None:
    """After a run of the portal committed: ``maintain``, and the orphans dropped; logged, never raised."""
    try:
        settings = PortalIndexSettings.from_env()
        done = maintain(conn, portal_url, model, settings=settings, deadline=deadline)
        done["dropped"] += drop_orphans(conn, settings)
    except Exception as exc:  # noqa: BLE001 - the run's data is committed: a failure here must not fail it
        log.warning("the per-portal HNSW index of %s (model %s) was not brought up to date: %s: %s. Searches "
                    "filtered on the portal use the shared index meanwhile; the next run of the portal tries again, "
                    "or run `harvester embeddings portal-indexes --build --portal %s` (raise "
                    "HARVESTER_PORTAL_INDEX_BUILD_TIMEOUT_SECS / HARVESTER_PORTAL_INDEX_LOCK_TIMEOUT_SECS if it "
                    "timed out)", portal_url, model, type(exc).__name__, str(exc).strip(), portal_url)
        return None
    if done["action"] == "built":
        log.info("per-portal HNSW index %s of %s built over %d datasets in %.1fs (%.0f bytes a dataset): searches "
                 "filtered on the portal scan it", done["index"], portal_url, done["datasets"], done["seconds"],
                 done["bytes"] / max(1, done["datasets"]))
    elif done["action"] in ("skipped", "unchecked"):
        log.info("per-portal HNSW index of %s not built now: %s", portal_url, done.get("reason"))
    if done["dropped"]:
        log.info("per-portal HNSW indexes dropped (another model, a portal below HARVESTER_PORTAL_INDEX_MIN_DATASETS "
                 "or above HARVESTER_PORTAL_INDEX_MAX_SHARE, or gone): %s", ", ".join(done["dropped"]))
    return done
