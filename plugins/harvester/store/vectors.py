"""Vectors, content-addressed: one per (content_hash, model), shared by every dataset with that text.

Each model gets a partial HNSW index over its rows, so models of different sizes live side by side
and one can replace another without dropping data. Vectors are stored in half precision
(``halfvec``, sql/019: 2 bytes a dimension; a provider's float32 values are rounded once, as they
are stored). What the index holds is ``HARVESTER_INDEX_KIND`` (IndexSettings.kind):

- ``halfvec`` (default): the vectors, ranked by cosine distance (up to 4,000 dimensions).
- ``bit``: their signs, one bit a dimension (``binary_quantize(embedding)::bit(D)``, Hamming
  distance, up to 64,000 dimensions): 96 bytes at 768 dimensions where the halfvec index holds
  1,536, so about a fifth of the room (398 bytes a vector on disk against about 2,050). Search takes
  the nearest few hundred by the bits and ranks them by their stored halfvec (``nearest``): the
  bits choose the candidates, never the order. What that loses depends on the data: nothing
  measurable on the million search bench's stand-in vectors, but on vectors with many near-ties
  the exact top 10 is not always among the 1,000 nearest by the bits (bench/README.md, "The
  models' index over the bits").

A change of kind is built by the next upsert (restore_index) beside the index it replaces, under
a name of its own; searches scan the old one (``search_kind``) until the new one is valid, and it
is dropped then.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import shlex
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator, Sequence

import numpy as np
from psycopg import sql

from harvester.config.settings import fields_from_env
from harvester.domain.run import format_duration
from harvester.domain.sizes import build_memory, format_size, hnsw_graph_bytes, parse_size

KINDS = ("halfvec", "bit")  # what a model's shared index may hold (IndexSettings.kind); an index of
# full-precision vectors (``vector``, before sql/019) is no use to search and is dropped

log = logging.getLogger(__name__)

# A model's id, in a statement with a ``%(model)s`` parameter (its name): what an embeddings row holds
# instead of the name (sql/042). Evaluated once per statement, and the key's index takes it. A
# statement that must match a model's partial index takes the id itself as a parameter (model_id).
MODEL_ID = "(SELECT m.id FROM embedding_models m WHERE m.name = %(model)s)"


@dataclass(frozen=True)
class IndexSettings:
    """How the models' HNSW indexes are kept. A model's index is shared by every portal: no run
    drops it. A run that brings at least ``bulk_min`` new vectors, and at least ``bulk_share`` of
    what the model will hold after it, while the model has no index yet (its first load, a model
    switch), is a bulk load: its vectors, and those of any other run meanwhile, are written with no
    index, and it is built once, concurrently, by the upsert of the last bulk load still running:
    building costs about a quarter of inserting row by row into a live graph. A model that has its
    index takes every run's vectors into it, however many. A build's maintenance_work_mem is what
    its graph needs (domain.sizes.hnsw_graph_bytes, plus a tenth), at least ``build_memory`` and at
    most ``build_memory_max``; it and ``build_workers`` (max_parallel_maintenance_workers) are set
    for the build only.
    ``build_timeout`` bounds a build (it is concurrent: nobody waits for it but the upsert that
    started it), ``build_wait`` how long that upsert waits for it after its commit before leaving
    it to finish in the server."""
    kind: str = "halfvec"
    bulk_min: int = 10000
    bulk_share: float = 0.25
    build_memory: str = "1GB"
    build_memory_max: str = "4GB"
    build_workers: int = 2
    build_timeout: float = 4 * 3600.0   # seconds a build may take (its statement_timeout)
    build_wait: float = 1800.0          # seconds an upsert waits for the build it started, after its commit

    @classmethod
    def from_env(cls, environ=None) -> "IndexSettings":
        """The HARVESTER_INDEX_* variables (config/settings.py: their ranges and messages)."""
        return fields_from_env(cls, "HARVESTER_INDEX_", environ)



def bulk_load_wanted(held: int, incoming: int, settings: IndexSettings) -> bool:
    """Whether ``incoming`` new vectors, against ``held`` already indexed, are written with the
    index dropped and built once afterwards, rather than inserted one by one into the live index."""
    return incoming >= max(1, settings.bulk_min) and incoming >= settings.bulk_share * (held + incoming)


def _slug(model: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", model.lower()).strip("_")


def index_name(model: str, kind: str | None = None) -> str:
    """The model's HNSW index: a readable slug and a hash of the exact model name, so two models
    whose slugs agree (a shared long prefix, "a-b" and "a.b") never share a name; at most 63
    characters, PostgreSQL's limit. ``kind`` (default: the configured one): an index over the bits
    has a name of its own, so that either kind is built beside the other it replaces."""
    digest = hashlib.sha256(model.encode("utf-8")).hexdigest()[:10]
    prefix = "embeddings_bits" if (kind or index_kind()) == "bit" else "embeddings_hnsw"
    return f"{prefix}_{_slug(model)[:36]}_{digest}"


class DimensionMismatch(ValueError):
    """Vectors stored under a model have another size than the model now gives."""

    def __init__(self, model: str, stored: int, new: int):
        self.model, self.stored, self.new = model, stored, new
        super().__init__(
            f"vectors of model {model!r} in the database have {stored} dimensions, but the model now gives "
            f"{new}: one model's vectors must all have one size. If the model really changed, drop its old "
            f"vectors with `harvester embeddings invalidate --model {shlex.quote(model)}` (its datasets are "
            f"embedded again by the next runs) or give the new model a name of its own; otherwise configure "
            f"the model that made the stored vectors again")


def index_kind(dimension: int | None = None) -> str:
    """What the models' shared indexes hold: HARVESTER_INDEX_KIND (halfvec or bit), whatever the
    dimension."""
    return IndexSettings.from_env().kind


def index_expression(dimension: int, kind: str | None = None) -> sql.Composable:
    """The indexed expression of an index of ``kind`` (bit: the vector's signs; halfvec: the vector);
    a query's ORDER BY must use it, ``distance`` and query_cast to use the index."""
    kind = kind or index_kind()
    if kind == "bit":
        return sql.SQL("(binary_quantize(embedding)::bit({}))").format(sql.Literal(int(dimension)))
    return sql.SQL("(embedding::{}({}))").format(sql.SQL(kind), sql.Literal(int(dimension)))


def query_cast(dimension: int, placeholder: str = "query", kind: str | None = None) -> sql.Composable:
    """``%(placeholder)s`` (a float32 vector) as an index of ``kind`` holds it."""
    kind = kind or index_kind()
    if kind == "bit":
        return sql.SQL("binary_quantize(%({})s::halfvec({}))::bit({})").format(
            sql.SQL(placeholder), sql.Literal(int(dimension)), sql.Literal(int(dimension)))
    return sql.SQL("%({})s::{}({})").format(sql.SQL(placeholder), sql.SQL(kind), sql.Literal(int(dimension)))


def distance(kind: str | None = None) -> sql.Composable:
    """The operator an index of ``kind`` orders by: Hamming distance for bits, cosine otherwise."""
    return sql.SQL("<~>" if (kind or index_kind()) == "bit" else "<=>")


def opclass(dimension: int, kind: str | None = None) -> str:
    kind = kind or index_kind()
    return "bit_hamming_ops" if kind == "bit" else f"{kind}_cosine_ops"


def nearest(dimension: int, kind: str | None = None, condition: sql.Composable = sql.SQL("true"),
            query: str = "query") -> sql.Composable:
    """The statement of the nearest vectors of the model ``%(model_id)s`` (model_id: a parameter, so
    that the planner matches the model's partial index) to ``%(query)s`` that meet ``condition``
    (on ``embeddings e``), as (content_hash as bytes, cosine distance, candidates), nearest
    first, at most ``%(n)s``; ``candidates``: over the bits, how many the index scan gave to rank (fewer than
    ``%(rerank)s`` when the filtered scan stopped early), else NULL.
    ``kind``: that of the model's index (search_kind; None: none, ranked as halfvec). Over the
    bits, the index scan takes the
    ``%(rerank)s`` nearest by Hamming distance that meet the condition, and they are ranked by the
    cosine distance of their stored halfvec (read from the rows the scan returns): the bits
    choose the candidates, never the order. Over an earlier version's halfvec index (or none: a
    sequential scan, exact), the scan ranks by the cosine distance itself."""
    q = query_cast(dimension, query, kind="halfvec")
    if kind == "bit":
        return sql.SQL(
            """
            SELECT c.content_hash, c.distance, count(*) OVER () AS candidates FROM (
                SELECT e.content_hash, e.embedding <=> {q} AS distance
                FROM embeddings e
                WHERE e.model = %(model_id)s::integer AND {condition}
                ORDER BY {bits} <~> {query_bits}
                LIMIT %(rerank)s
            ) c
            ORDER BY c.distance
            LIMIT %(n)s
            """).format(q=q, condition=condition, bits=index_expression(dimension, "bit"),
                        query_bits=query_cast(dimension, query, kind="bit"))
    expr = index_expression(dimension, "halfvec")
    return sql.SQL(
        """
        SELECT e.content_hash, {expr} <=> {q} AS distance, NULL::bigint AS candidates
        FROM embeddings e
        WHERE e.model = %(model_id)s::integer AND {condition}
        ORDER BY {expr} <=> {q}
        LIMIT %(n)s
        """).format(expr=expr, q=q, condition=condition)


def search_kind(conn, model: str) -> str | None:
    """The kind of the model's index search scans: the configured one (index_kind) once it is
    valid, else the other while an index of that kind is (HARVESTER_INDEX_KIND changed, the new
    index not built yet), else None (no index: exact scans). One look at the catalogue
    (pg_index), well under a millisecond."""
    kinds = {kind for _, _, _, kind, state in _model_indexes(conn, model) if state == "valid"}
    wanted = index_kind()
    return next((kind for kind in (wanted, *KINDS) if kind in kinds), None)


def _model_indexes(conn, model: str) -> list[tuple[str, str, int, str, str]]:
    """(schema, name, dimension, type: bit, halfvec or vector, state) of each HNSW index on embeddings
    whose predicate is exactly ``model = <the model's id>`` (sql/042), whatever its name. ``state``:
    ``valid``, ``building`` (CREATE INDEX CONCURRENTLY under way on some connection) or ``dead``
    (invalid and nobody builds it: a build that failed or whose server process was stopped)."""
    return conn.execute(
        """
        SELECT n.nspname, c.relname, a.atttypmod, format_type(a.atttypid, NULL),
               CASE WHEN i.indisvalid THEN 'valid'
                    WHEN EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = c.oid)
                    THEN 'building' ELSE 'dead' END
        FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_am am ON am.oid = c.relam AND am.amname = 'hnsw'
        JOIN pg_attribute a ON a.attrelid = i.indexrelid AND a.attnum = 1
        WHERE i.indrelid = 'embeddings'::regclass
          AND pg_get_expr(i.indpred, i.indrelid) = (SELECT '(model = ' || m.id || ')' FROM embedding_models m
                                                    WHERE m.name = %s)
        ORDER BY c.relname = %s DESC, c.relname
        """, (model, index_name(model))).fetchall()


def indexed_models(conn) -> set[str]:
    """The models that have an HNSW index on embeddings (every model that ever stored a vector gets
    one): read from the catalog, without touching the table."""
    return set(model_indexes(conn).values())


def model_indexes(conn) -> dict[str, str]:
    """{index name: model} of the HNSW indexes on embeddings whose predicate names a model
    (``model = <its id in embedding_models>``, sql/042), whatever their state."""
    rows = conn.execute(
        """
        SELECT c.relname, pg_get_expr(i.indpred, i.indrelid)
        FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid
        JOIN pg_am am ON am.oid = c.relam AND am.amname = 'hnsw'
        WHERE i.indrelid = 'embeddings'::regclass AND i.indpred IS NOT NULL
        """).fetchall()
    ids = {}
    for index, predicate in rows:
        found = re.fullmatch(r"\(model = (\d+)\)", predicate or "")
        if found:
            ids[index] = int(found.group(1))
    if not ids:
        return {}
    names = dict(conn.execute("SELECT id, name FROM embedding_models WHERE id = ANY(%s)",
                              (sorted(set(ids.values())),)).fetchall())
    return {index: names[number] for index, number in ids.items() if number in names}


def _other_dimension(conn, model: str, dimension: int) -> int | None:
    row = conn.execute(f"SELECT dimension FROM embeddings WHERE model = {MODEL_ID} AND dimension <> %(dimension)s LIMIT 1",
                       {"model": model, "dimension": dimension}).fetchone()
    return None if row is None else int(row[0])


def check_dimension(conn, model: str, dimension: int) -> None:
    """Raise DimensionMismatch if vectors of ``model`` with another dimension are stored. Cheap
    when the model has its index of ``dimension`` (every stored vector fits it); otherwise one
    look at the table."""
    indexes = _model_indexes(conn, model)
    if indexes and all(size == dimension and state == "valid" for _, _, size, _, state in indexes):
        return
    stored = _other_dimension(conn, model, dimension)
    if stored is not None:
        raise DimensionMismatch(model, stored, dimension)


class IndexBuildError(RuntimeError):
    """Building a model's HNSW index failed; the index is left for the next upsert to build."""


def _drop_concurrently(conn, schema: str, index: str) -> None:
    """DROP INDEX CONCURRENTLY: waits for the transactions using the index, blocks nobody."""
    conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(schema, index)))


def drop_other_sizes(conn, model: str, dimension: int) -> list[str]:
    """Before vectors of ``dimension`` are written: the model's indexes of another size would refuse
    them. Called after check_dimension, so no vector of that size is left (`harvester embeddings
    invalidate --model`): the index holds nothing anyone uses; it is dropped concurrently."""
    dropped = []
    for schema, index, size, _, state in _model_indexes(conn, model):
        if size != dimension and state != "building":
            log.info("dropping the HNSW index %s of %s: it is of %d dimensions, and no vector of that size is left",
                     index, model, size)
            _drop_concurrently(conn, schema, index)
            dropped.append(index)
    return dropped


def index_state(conn, model: str) -> str:
    """``ready`` (a valid index of the kind search uses), ``building`` (someone builds it now) or
    ``missing``."""
    states = {(kind == index_kind(size), state) for _, _, size, kind, state in _model_indexes(conn, model)}
    if (True, "valid") in states:
        return "ready"
    return "building" if any(state == "building" for _, state in states) else "missing"


def ensure_index(conn, model: str, dimension: int, settings: IndexSettings | None = None) -> bool:
    """Make sure the model's HNSW index exists, of ``dimension``; True when this call built it.

    Never in anyone's way: the index is built with CREATE INDEX CONCURRENTLY, which lets every
    portal go on writing vectors and searching meanwhile (searches of the model rank by exact scans
    until it is valid), and an index that is no use any more is dropped concurrently. When another
    connection is building it already, this returns at once (False): the index is theirs to
    finish. A build left invalid by a failure or a stopped server process is dropped and built
    again. An index of the model under an earlier version's name is renamed, not built twice; one
    of another size is dropped when no vector of that size is left (``harvester embeddings
    invalidate --model``); one of full-precision vectors (an earlier version's) is dropped. One
    of the other kind (``settings.kind`` changed: halfvec to bit or back) keeps serving searches
    while the new one is built beside it, and is dropped once that one is valid: no search goes
    without an index. Raises DimensionMismatch when vectors of the model with another dimension
    are stored, IndexBuildError when the build fails (its leftover is dropped; the index of the
    other kind is kept).

    ``conn`` must be in autocommit mode with no transaction open (CONCURRENTLY cannot run in one).
    The build waits for the transactions older than it (another portal's merge): its session has
    no lock_timeout, and ``settings.build_timeout`` bounds the whole statement."""
    settings = settings or IndexSettings.from_env()
    check_dimension(conn, model, dimension)
    kind = settings.kind
    name = index_name(model, kind)
    fitting, replaced = None, []
    for schema, index, size, held_as, state in _model_indexes(conn, model):
        if state == "building":
            log.info("the HNSW index %s of %s is being built by another connection: leaving it to that one", index,
                     model)
            return False
        if state == "dead":
            log.warning("dropping the invalid HNSW index %s of %s, left by a build that did not finish", index, model)
            _drop_concurrently(conn, schema, index)
        elif size == dimension and held_as in KINDS and held_as != kind:
            replaced.append((schema, index, held_as))  # serves searches until its successor is valid
        elif size != dimension or held_as != kind:
            # no vector of that size is left (check_dimension): the index would refuse new ones; or an
            # index of full-precision vectors made by an earlier version
            _drop_concurrently(conn, schema, index)
        elif fitting is None:
            fitting = (schema, index)
    if fitting is not None:
        if fitting[1] != name:  # the name an earlier version gave it
            conn.execute(sql.SQL("ALTER INDEX {} RENAME TO {}").format(sql.Identifier(*fitting), sql.Identifier(name)))
        _drop_replaced(conn, model, replaced, kind)
        return False
    for _, index, held_as in replaced:
        log.info("replacing the HNSW index %s of %s (%s) by one of %s (%s, HARVESTER_INDEX_KIND), built beside it: "
                 "searches use the old one until the new one is valid", index, model, held_as, kind, name)
    built = _build(conn, model, dimension, name, kind, settings)
    if built:
        _drop_replaced(conn, model, replaced, kind)
    return built


def _drop_replaced(conn, model: str, replaced: list[tuple[str, str, str]], kind: str) -> None:
    for schema, index, held_as in replaced:
        log.info("dropping the HNSW index %s of %s (%s): its index of %s is valid", index, model, held_as, kind)
        _drop_concurrently(conn, schema, index)


def _build(conn, model: str, dimension: int, name: str, kind: str, settings: IndexSettings) -> bool:
    """CREATE INDEX CONCURRENTLY of the model's index, with the memory its graph needs; True when
    it is valid afterwards."""
    import psycopg

    number = model_id(conn, model, create=True)  # (autocommit: a model's index may come before its vectors)
    statement = sql.SQL(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON embeddings USING hnsw ({expr} {ops}) WHERE model = {model}"
    ).format(name=sql.Identifier(name), expr=index_expression(dimension, kind),
             ops=sql.SQL(opclass(dimension, kind)), model=sql.Literal(number))

    vectors_held = held(conn, model)
    graph = hnsw_graph_bytes(vectors_held, dimension, kind)
    memory = format_size(build_memory(graph, parse_size(settings.build_memory), parse_size(settings.build_memory_max)))
    log.info("building the HNSW index %s of %s: %d vectors of %d dimensions (%s), a graph of about %s; "
             "maintenance_work_mem %s, %d parallel workers at most, statement_timeout %s", name, model, vectors_held,
             dimension, kind, _mb(graph), memory, settings.build_workers,
             format_duration(timedelta(seconds=settings.build_timeout)))
    if graph * 1.1 > parse_size(memory):
        log.warning("the HNSW graph of %s (about %s) does not fit in HARVESTER_INDEX_BUILD_MEMORY_MAX=%s: the build "
                    "will be several times slower; raise it if the database server has the memory", model,
                    _mb(graph), settings.build_memory_max)
    settings_sql = ("SELECT set_config('maintenance_work_mem', %s, false),"
                    " set_config('max_parallel_maintenance_workers', %s, false),"
                    " set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)")
    before = conn.execute("SELECT current_setting('maintenance_work_mem'), current_setting('max_parallel_maintenance_workers'),"
                          " current_setting('lock_timeout'), current_setting('statement_timeout')").fetchone()
    conn.execute(settings_sql, (memory, str(settings.build_workers), "0",
                                f"{int(settings.build_timeout * 1000)}ms"))
    def notice(diag) -> None:  # pgvector says when the graph outgrew maintenance_work_mem: the slow path
        log.warning("PostgreSQL, building the HNSW index %s: %s (maintenance_work_mem %s)", name,
                    diag.message_primary, memory)

    conn.add_notice_handler(notice)
    try:
        conn.execute(statement)
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
        return False  # another connection created it between our look and ours: theirs to finish
    except psycopg.Error as exc:
        with contextlib.suppress(psycopg.Error):
            if not conn.closed:
                for schema, index, _, _, state in _model_indexes(conn, model):
                    if state == "dead":
                        _drop_concurrently(conn, schema, index)
        raise IndexBuildError(f"building the HNSW index {name} of {model} failed: {type(exc).__name__}: "
                              f"{str(exc).strip()} (HARVESTER_INDEX_BUILD_TIMEOUT_SECS={settings.build_timeout:g}); "
                              "the next run's upsert builds it again, searches use exact scans until then") from exc
    finally:
        conn.remove_notice_handler(notice)
        if not conn.closed:
            with contextlib.suppress(psycopg.Error):
                conn.execute(settings_sql, before)
    return index_state(conn, model) == "ready"


def _mb(size: float) -> str:
    return f"{size / 2 ** 30:.1f} GB" if size >= 2 ** 30 else f"{size / 2 ** 20:.0f} MB"


def held(conn, model: str) -> int:
    """How many vectors of ``model`` are stored (what its index holds)."""
    return conn.execute(f"SELECT count(*) FROM embeddings WHERE model = {MODEL_ID}", {"model": model}).fetchone()[0]


def drop_index(conn, model: str) -> list[str]:
    """Drop the model's HNSW index(es), concurrently; returns their names. Runs never do this
    (their index is shared by every portal); it is for operators and tests. Until ensure_index
    builds it again, searches of this model rank by exact scans: the same results, slower."""
    dropped = []
    for schema, index, _, _, _ in _model_indexes(conn, model):
        _drop_concurrently(conn, schema, index)
        dropped.append(index)
    return dropped


def index_missing(conn, model: str) -> int | None:
    """The dimension of ``model``'s stored vectors when they have no valid HNSW index of the kind
    search uses and nobody is building one (after a model's first vectors, a bulk load, a build that
    failed, or an index an earlier version made of full-precision vectors); None when there is
    nothing to build."""
    if index_state(conn, model) != "missing":
        return None
    return stored_dimension(conn, model)


def stored_dimension(conn, model: str) -> int | None:
    """The dimension of ``model``'s stored vectors (one look at the table), None when it has none."""
    row = conn.execute(f"SELECT dimension FROM embeddings WHERE model = {MODEL_ID} LIMIT 1", {"model": model}).fetchone()
    return None if row is None else int(row[0])


def restore_index(conn, model: str, settings: IndexSettings | None = None) -> bool:
    """Build the model's HNSW index if index_missing says so; True when it built one."""
    dimension = index_missing(conn, model)
    if dimension is None:
        return False
    started = time.monotonic()
    built = ensure_index(conn, model, dimension, settings)
    if built:
        log.info("built the HNSW index %s over the %d vectors of %s in %.1fs (concurrently: nobody waited for it)",
                 index_name(model), held(conn, model), model, time.monotonic() - started)
    return built


# A text the provider answered an unusable vector for lately (sql/021, store/claims.py refuse):
# waiting for its retry, or given up. Not pending work: no run reads, counts or sends it.
_HELD_BACK = """EXISTS (SELECT 1 FROM embedding_failures f WHERE f.content_hash = t.content_hash
                        AND f.model = %(model)s AND (f.retry_at IS NULL OR f.retry_at > now()))"""


def _pending(checked: bool, held_back: bool = False) -> str:
    """The texts of a run's portal without a vector of the model: this run's created and updated
    records, and the portal's other live datasets; less those held back by an earlier refusal
    (``held_back``: only those). With ``checked`` (copies_checked: a pass found
    every live dataset with its copy of the model, sql/010 and sql/012), a dataset still linked to
    its current text (embedded_content_hash = content_hash) has that model's vector, so only the
    unlinked ones are looked at, through the datasets_pending partial index: a no-change run no
    longer probes embeddings once per dataset of the portal."""
    unlinked = "AND d.embedded_content_hash IS DISTINCT FROM d.content_hash" if checked else ""
    held = f"AND {_HELD_BACK}" if held_back else f"AND NOT {_HELD_BACK}"
    return f"""
    FROM (
        SELECT s.content_hash, s.title, s.description, true AS from_run
        FROM staging_records s
        WHERE s.run_id = %(run)s AND s.outcome IN ('created', 'updated')
        UNION ALL
        SELECT d.content_hash, d.title, d.description, false AS from_run
        FROM datasets d
        WHERE d.portal_url = %(portal)s AND d.removed_at IS NULL {unlinked}
          AND NOT EXISTS (SELECT 1 FROM staging_records s
                          WHERE s.run_id = %(run)s AND s.source_id = d.source_id
                            AND s.outcome IN ('created', 'updated'))
    ) t
    WHERE NOT EXISTS (SELECT 1 FROM embeddings e WHERE e.content_hash = decode(t.content_hash, 'hex')
                        AND e.model = {MODEL_ID})
      AND get_byte(decode(t.content_hash, 'hex'), 0) %% %(shards)s = %(shard)s
      {held}
"""


@contextlib.contextmanager
def _through_pending_index(conn, checked: bool):
    """While _pending(checked=True) runs: no sequential scans for the session. PostgreSQL estimates
    ``embedded_content_hash IS DISTINCT FROM content_hash`` (two columns compared) at nearly every
    row, where the partial index datasets_pending holds exactly the rows it means, usually none; at
    1,000,000 datasets it planned a parallel scan of the whole table (2.7 GB, 430 ms in every
    no-change run, bench/scale_bench.py) instead of that index (0.03 ms). Restored afterwards
    (within a transaction that fails, PostgreSQL reverts the setting itself)."""
    if not checked:  # every live dataset is looked at: a scan is the right plan
        yield
        return
    import psycopg

    before = conn.execute("SELECT current_setting('enable_seqscan')").fetchone()[0]
    conn.execute("SELECT set_config('enable_seqscan', 'off', false)")
    try:
        yield
    finally:
        with contextlib.suppress(psycopg.Error):
            if not conn.closed:
                conn.execute("SELECT set_config('enable_seqscan', %s, false)", (before,))


def count_pending(conn, run_id: int, portal_url: str, model: str, shard: int = 0, shards: int = 1) -> int:
    """Distinct texts of the portal without a vector for ``model``: this run's changes and
    anything earlier runs left pending (in one shard of ``shards``, by content hash)."""
    params = {"run": run_id, "portal": portal_url, "model": model, "shard": shard, "shards": shards}
    checked = copies_checked(conn, portal_url, model)
    with _through_pending_index(conn, checked):
        return conn.execute(f"SELECT count(DISTINCT content_hash) {_pending(checked)}", params).fetchone()[0]


def count_held_back(conn, run_id: int, portal_url: str, model: str, shard: int = 0,
                    shards: int = 1) -> tuple[int, int, object]:
    """The portal's texts without a vector of ``model`` (in this shard) that are not pending work
    because the provider answered unusable vectors for them (store/claims.py refuse): (waiting for
    their retry, given up, the earliest retry). No pass over the portal when the model has none."""
    if not conn.execute("SELECT EXISTS (SELECT 1 FROM embedding_failures WHERE model = %s)", (model,)).fetchone()[0]:
        return 0, 0, None
    params = {"run": run_id, "portal": portal_url, "model": model, "shard": shard, "shards": shards}
    checked = copies_checked(conn, portal_url, model)
    with _through_pending_index(conn, checked):
        waiting, given_up, first = conn.execute(
            "SELECT count(*) FILTER (WHERE f.retry_at IS NOT NULL), count(*) FILTER (WHERE f.retry_at IS NULL),"
            " min(f.retry_at)"
            f" FROM (SELECT DISTINCT t.content_hash {_pending(checked, held_back=True)}) p"
            " JOIN embedding_failures f ON f.content_hash = p.content_hash AND f.model = %(model)s",
            params).fetchone()
    return int(waiting), int(given_up), first


def count_run_pending(conn, run_id: int, portal_url: str, model: str) -> tuple[int, int]:
    """The portal's distinct pending texts of ``model`` split: (this run's new and changed ones,
    those earlier runs left pending), in one pass."""
    params = {"run": run_id, "portal": portal_url, "model": model, "shard": 0, "shards": 1}
    checked = copies_checked(conn, portal_url, model)
    with _through_pending_index(conn, checked):
        own, backlog = conn.execute(
            f"SELECT count(*) FILTER (WHERE r), count(*) FILTER (WHERE NOT r) FROM ("
            f" SELECT content_hash, bool_or(from_run) AS r {_pending(checked)} GROUP BY content_hash) p",
            params).fetchone()
    return int(own), int(backlog)


def iter_pending(conn, run_id: int, portal_url: str, model: str, batch_size: int, *, shard: int = 0,
                 shards: int = 1, backlog_limit: int | None = None) -> Iterator[list[tuple]]:
    """(content_hash, title, description, retried) of each pending text, once each, in batches
    (``retried``: the provider answered an unusable vector for it before, and its backoff is over:
    the embed step sends it alone); this run's changes first, then at most ``backlog_limit``
    texts left pending by earlier runs (a model switch re-embeds a portal over several runs). Read through a cursor WITH HOLD: the query runs
    to its end in a short transaction and the rows wait in the server, so no transaction stays open
    while the texts are embedded (one would hold back vacuum and every concurrent index build of
    every portal). ``conn`` must be a connection of its own."""
    params = {"run": run_id, "portal": portal_url, "model": model, "shard": shard, "shards": shards,
              "backlog": backlog_limit}
    checked = copies_checked(conn, portal_url, model)
    pending = _pending(checked)
    cur = conn.cursor(name="harvester_pending_texts", withhold=True)
    try:
        with _through_pending_index(conn, checked), conn.transaction():
            cur.execute(
                "WITH p AS MATERIALIZED ("
                f" SELECT DISTINCT ON (content_hash) content_hash, title, description, from_run {pending}"
                "  ORDER BY content_hash, from_run DESC)"
                " SELECT content_hash, title, description, EXISTS (SELECT 1 FROM embedding_failures f"
                "  WHERE f.content_hash = q.content_hash AND f.model = %(model)s) FROM ("
                "  SELECT * FROM p WHERE from_run"
                "  UNION ALL (SELECT * FROM p WHERE NOT from_run ORDER BY content_hash LIMIT %(backlog)s)"
                " ) q ORDER BY from_run DESC, content_hash", params)
        while rows := cur.fetchmany(batch_size):
            yield [tuple(r) for r in rows]
    finally:
        if not conn.closed:
            cur.close()


def reuse(conn, run_id: int, model: str, started_at=None) -> dict:
    """This run's new texts whose vector this run did not pay for (another portal's run, even one
    that wrote it while this run waited for its claim; a reverted edit; a failed earlier run): no
    provider call, and what that saved, estimated at four characters a token. A vector written
    before sql/016 (no run recorded) counts when it is older than the run (``started_at``)."""
    reused, tokens = conn.execute(
        f"""
        SELECT count(*), coalesce(sum(ceil((length(s.title) + length(s.description) + 2) / 4.0)), 0)
        FROM staging_records s
        JOIN embeddings e ON e.content_hash = decode(s.content_hash, 'hex') AND e.model = {MODEL_ID}
        WHERE s.run_id = %(run)s AND s.outcome IN ('created', 'updated') AND s.content_changed
          AND (e.run_id <> %(run)s OR (e.run_id IS NULL AND e.created_at < %(started)s))
        """, {"model": model, "started": started_at, "run": run_id}).fetchone()
    return {"embeddings_reused": int(reused), "embedding_tokens_saved": int(tokens)}


# Why a vector cannot be stored (screen): reason codes, as recorded in embedding_failures (sql/021).
UNUSABLE = {
    "not-finite": "a value that is not a number (NaN or infinite)",
    "out-of-range": "a value beyond +-65504, which half precision cannot hold",
    "wrong-dimension": "another number of dimensions than the model's",
    "empty": "no values at all",
    "zero": "only zeros (no direction: cosine search cannot rank it)",
    "count-mismatch": "a batch answered with another number of vectors than texts sent: none can be matched to "
                      "its text",
}


def screen(dimension: int, vectors: Sequence[Sequence[float]]) -> list[tuple[str, str] | None]:
    """For each vector: None when it can be stored as a vector of ``dimension``, else (reason, what
    is wrong): a reason of UNUSABLE and a few words naming the bad value. Pure arithmetic, no IO."""
    out: list[tuple[str, str] | None] = []
    for vector in vectors:
        try:
            array = np.asarray(vector if vector is not None else [], dtype=np.float32).reshape(-1)
        except (TypeError, ValueError):
            out.append(("not-finite", "values that are not numbers"))
            continue
        if array.size == 0:
            out.append(("empty", "a vector of no values"))
        elif array.size != dimension:
            out.append(("wrong-dimension", f"a vector of {array.size} dimensions, expected {dimension}"))
        elif not np.isfinite(array).all():
            bad = int((~np.isfinite(array)).sum())
            out.append(("not-finite", f"{bad} of its {array.size} values not finite (NaN or infinite)"))
        elif np.abs(array).max(initial=0.0) > HALFVEC_MAX:
            out.append(("out-of-range", f"a value of {float(np.abs(array).max()):g}, beyond +-{HALFVEC_MAX:g}"))
        elif not array.any():
            out.append(("zero", "a vector of zeros"))
        else:
            out.append(None)
    return out


def write(conn, model: str, dimension: int, hashes: Sequence[str], vectors: Sequence[Sequence[float]],
          run_id: int | None = None) -> int:
    """Store vectors, committed at once: paid-for vectors are kept even if the run fails later.
    ``run_id``: the run that paid for them (its claims of these texts end in the same transaction,
    store/claims.py). Rows go in content-hash order, so two writers of overlapping texts cannot
    deadlock; a deadlock or serialization failure all the same (a writer of another version) is
    retried, never losing a paid batch. A text's refusals (embedding_failures, sql/021) end with
    its vector, in the same transaction. Callers screen the vectors first (``screen``: the embed
    step stores a batch's usable vectors and refuses the others); an unusable one here raises
    ValueError and nothing is stored."""
    if len(hashes) != len(vectors):
        raise ValueError(f"{len(hashes)} texts but {len(vectors)} vectors")
    rows = []
    for content_hash, vector in zip(hashes, vectors):
        array = np.asarray(vector, dtype=np.float32)
        if array.shape != (dimension,):
            raise ValueError(f"model {model} returned a vector of shape {array.shape}, expected ({dimension},)")
        if not np.isfinite(array).all() or np.abs(array).max(initial=0.0) > HALFVEC_MAX:
            raise ValueError(f"model {model} returned a vector with a value that half precision cannot store "
                             f"(beyond +-{HALFVEC_MAX:g}, or not a number) for text {content_hash}: vectors are "
                             "stored as halfvec; nothing of this batch was stored")
        rows.append((content_hash, keys([content_hash])[0], dimension, array, run_id))
    rows.sort(key=lambda row: row[1])
    import psycopg

    for attempt in range(1, _WRITE_ATTEMPTS + 1):
        try:
            with conn.transaction(), conn.cursor() as cur:
                number = model_id(conn, model, create=True)
                cur.executemany(
                    "INSERT INTO embeddings (model, dimension, content_hash, embedding, run_id)"
                    " VALUES (%s, %s, %s, %b, %s) ON CONFLICT (content_hash, model) DO NOTHING",
                    [(number, d, key, array, run) for _, key, d, array, run in rows])
                if run_id is not None:
                    cur.execute("DELETE FROM embedding_claims WHERE model = %s AND run_id = %s"
                                " AND content_hash = ANY(%s::text[])", (model, run_id, [r[0] for r in rows]))
                cur.execute("DELETE FROM embedding_failures WHERE model = %s AND content_hash = ANY(%s::text[])",
                            (model, [r[0] for r in rows]))
            return len(rows)
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
            if attempt == _WRITE_ATTEMPTS:
                raise
            log.warning("writing %d vectors of %s met %s (attempt %d of %d); writing them again", len(rows),
                        model, type(exc).__name__, attempt, _WRITE_ATTEMPTS)
            time.sleep(0.1 * attempt)
    return len(rows)


_WRITE_ATTEMPTS = 5
HALFVEC_MAX = 65504.0  # the largest finite half-precision value


def copy_for_search(conn, portal_url: str, model: str, dataset_ids: Sequence[int] | None = None) -> int:
    """Inside the caller's transaction (a run's upsert): ``dataset_vectors`` (sql/010) brought up to
    date, in one statement, with a copy of the ``model`` vector of each dataset's current text where
    its copy is missing, of another model or of an older text: for ``dataset_ids``, or with None for
    every dataset of the portal. Written in dataset id order, the order search's exact path reads
    them in. After a pass over every dataset, the portal is marked checked for ``model`` when each
    of its live datasets has its copy (a model switch still embedding, or texts waiting for their
    vector, leave it unmarked: the next run checks again). Returns the copies written."""
    written, behind, _ = _copy(conn, """
        b AS MATERIALIZED (
            SELECT s.dataset_id, s.content_hash, s.removed_at FROM dataset_search s
            WHERE s.portal_url = %(portal)s AND (%(ids)s::bigint[] IS NULL OR s.dataset_id = ANY(%(ids)s::bigint[]))
              AND NOT EXISTS (SELECT 1 FROM dataset_vectors c WHERE c.dataset_id = s.dataset_id
                                AND c.scope = %(scope)s AND c.content_hash = s.content_hash)
        )""", {"portal": portal_url, "model": model, "scope": scope(conn, portal_url, model),
               "ids": None if dataset_ids is None else list(dataset_ids)})
    if dataset_ids is None:
        if behind:
            conn.execute("DELETE FROM dataset_vectors_checked WHERE portal_url = %s", (portal_url,))
        else:
            conn.execute("INSERT INTO dataset_vectors_checked (portal_url, model) VALUES (%s, %s)"
                         " ON CONFLICT (portal_url) DO UPDATE SET model = EXCLUDED.model, checked_at = now()",
                         (portal_url, model))
    return int(written)


def link(conn, portal_url: str, model: str) -> int:
    """Inside the caller's transaction (merge): every dataset of the portal whose current text has
    a ``model`` vector and is not linked to it yet gets linked (embedded_content_hash), and its
    copy for search written (copy_for_search), in one statement: the linked ids never travel to
    this process (100,000 of them on a first sync). Returns the datasets linked."""
    _, _, linked = _copy(conn, """
        l AS (
            UPDATE datasets d SET embedded_content_hash = d.content_hash
            WHERE d.portal_url = %(portal)s AND d.embedded_content_hash IS DISTINCT FROM d.content_hash
              AND EXISTS (SELECT 1 FROM embeddings e WHERE e.content_hash = decode(d.content_hash, 'hex')
                            AND e.model = """ + MODEL_ID + """)
            RETURNING d.id, d.content_hash, d.removed_at
        ), b AS MATERIALIZED (
            SELECT l.id AS dataset_id, decode(l.content_hash, 'hex') AS content_hash, l.removed_at FROM l
            WHERE NOT EXISTS (SELECT 1 FROM dataset_vectors c WHERE c.dataset_id = l.id
                                AND c.scope = %(scope)s AND c.content_hash = decode(l.content_hash, 'hex'))
        )""", {"portal": portal_url, "model": model, "scope": scope(conn, portal_url, model)},
        count="(SELECT count(*) FROM l)")
    return int(linked)


def _copy(conn, behind: str, params: dict, count: str = "0") -> tuple:
    """The copies of the datasets of ``behind`` (CTEs ending in ``b``: dataset_id, content_hash as
    bytes, removed_at of datasets of the portal ``params["portal"]`` whose copy is missing or behind)
    written, each with the scope of its portal and model (``params["scope"]``; sql/041: the per-portal
    indexes' predicate) and its text's hash as bytes; returns (copies written, live datasets of b
    left without one, ``count``)."""
    return conn.execute(
        f"""
        WITH {behind}, w AS (
            INSERT INTO dataset_vectors AS v (dataset_id, scope, embedding, content_hash)
            SELECT b.dataset_id, %(scope)s, e.embedding, e.content_hash
            FROM b JOIN embeddings e ON e.content_hash = b.content_hash AND e.model = {MODEL_ID}
            ORDER BY b.dataset_id
            ON CONFLICT (dataset_id) DO UPDATE SET
                scope = EXCLUDED.scope, content_hash = EXCLUDED.content_hash, embedding = EXCLUDED.embedding
            RETURNING v.dataset_id
        )
        SELECT (SELECT count(*) FROM w),
               (SELECT count(*) FROM b WHERE b.removed_at IS NULL
                  AND NOT EXISTS (SELECT 1 FROM w WHERE w.dataset_id = b.dataset_id)),
               {count}
        """, params).fetchone()


def scope(conn, portal_url: str, model: str) -> int:
    """The id of the portal's copies of ``model``'s vectors (vector_scopes, sql/041): what a copy's
    row holds instead of the portal's URL and the model's name, and what a per-portal index's
    predicate names. Created on first use, in the caller's transaction (a run's upsert, which one run
    of a portal at a time writes: two runs never wait on each other's new scope)."""
    found = existing_scope(conn, portal_url, model)
    if found is not None:
        return found
    # (only when missing: an INSERT that finds a conflict would still use up an identity value)
    row = conn.execute("INSERT INTO vector_scopes (portal_url, model) VALUES (%s, %s)"
                       " ON CONFLICT (portal_url, model) DO NOTHING RETURNING id", (portal_url, model)).fetchone()
    if row is None:  # another transaction created it after this statement's snapshot: visible now
        return existing_scope(conn, portal_url, model)
    return int(row[0])


def keys(hashes) -> list[bytes]:
    """Texts' content hashes (hexadecimal SHA-256, domain/dataset.py) as embeddings' key holds them
    (sql/042); ValueError naming the first that is not hexadecimal."""
    out = []
    for content_hash in hashes:
        try:
            out.append(bytes.fromhex(content_hash))
        except (TypeError, ValueError):
            raise ValueError(f"text hash {content_hash!r} is not hexadecimal: vectors are keyed by their text's "
                             "SHA-256 (sql/042)") from None
    return out


def model_id(conn, model: str, create: bool = False) -> int | None:
    """The id of ``model`` in embedding_models (sql/042), None when none of its vectors was ever
    stored; with ``create``, made when missing, in the caller's transaction (vectors are written in
    one that commits at once: another writer of the model's first vectors waits for it, then finds
    it)."""
    row = conn.execute("SELECT id FROM embedding_models WHERE name = %s", (model,)).fetchone()
    if row is not None or not create:
        return None if row is None else int(row[0])
    # (only when missing: an INSERT that finds a conflict would still use up an identity value)
    row = conn.execute("INSERT INTO embedding_models (name) VALUES (%s) ON CONFLICT (name) DO NOTHING RETURNING id",
                       (model,)).fetchone()
    if row is None:  # another transaction created it after this statement's snapshot: visible now
        return model_id(conn, model)
    return int(row[0])


def existing_scope(conn, portal_url: str, model: str) -> int | None:
    """The scope of the portal's copies of ``model``'s vectors, None when none was ever written."""
    row = conn.execute("SELECT id FROM vector_scopes WHERE portal_url = %s AND model = %s",
                       (portal_url, model)).fetchone()
    return None if row is None else int(row[0])


def copies_checked(conn, portal_url: str, model: str) -> bool:
    """Whether a pass over every dataset of the portal last copied ``model``'s vectors: then a run
    copies only the vectors it links, and looks for texts to embed among its unlinked datasets only
    (_pending); otherwise (a model switch, a vector deleted, a database from before sql/010) it
    checks them all."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM dataset_vectors_checked WHERE portal_url = %s AND model = %s)",
                        (portal_url, model)).fetchone()[0]


# -- reading: coverage, query plans, cache administration -------------------------------------------
def coverage(conn, portal_url: str | None = None) -> dict[str, tuple[int, int]]:
    """Per model: (live datasets with a vector of their current text, live datasets)."""
    params = {"portal": portal_url}
    live = conn.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL"
                        " AND (%(portal)s::text IS NULL OR portal_url = %(portal)s)", params).fetchone()[0]
    rows = conn.execute(
        """
        SELECT m.name, count(*) FROM datasets d
        JOIN embeddings e ON e.content_hash = decode(d.content_hash, 'hex')
        JOIN embedding_models m ON m.id = e.model
        WHERE d.removed_at IS NULL AND (%(portal)s::text IS NULL OR d.portal_url = %(portal)s)
        GROUP BY m.name
        """, params).fetchall()
    return {model: (int(n), int(live)) for model, n in rows}


def explain_search(conn, model: str, dimension: int, query_vector) -> str:
    expr, q = index_expression(dimension), query_cast(dimension)
    plan = conn.execute(sql.SQL("EXPLAIN SELECT content_hash FROM embeddings e WHERE e.model = %(model_id)s::integer"
                                " ORDER BY {expr} {op} {q} LIMIT 10").format(expr=expr, op=distance(), q=q),
                        {"model_id": model_id(conn, model), "query": np.asarray(query_vector, dtype=np.float32)}
                        ).fetchall()
    return "\n".join(row[0] for row in plan)


def invalidate(conn, model: str, *, portal_url: str | None = None, source_id: str | None = None,
               all_of_model: bool = False, active_model: str | None = None) -> int:
    """Delete vectors of ``model`` so what they belong to is embedded again on its next run:
    every vector of the model, or those of one portal's datasets, or of one dataset. Datasets
    whose text lost its vector are marked pending (not embedded) again; with ``all_of_model``,
    those whose text still has a vector of ``active_model`` (the model runs link datasets to)
    stay embedded. The texts it names that the provider answered unusable vectors for
    (embedding_failures: waiting for a retry, or given up) are tried again by their next run."""
    _reset_refusals(conn, model, portal_url=portal_url, source_id=source_id, all_of_model=all_of_model)
    if all_of_model:
        # One statement: the UPDATE sees the table as it was before the DELETE, hence the
        # e.model <> model (a vector of the model being deleted does not count).
        return conn.execute(
            """
            WITH gone AS (
                DELETE FROM embeddings WHERE model = """ + MODEL_ID + """ RETURNING content_hash
            ), unlinked AS (
                UPDATE datasets d SET embedded_content_hash = NULL
                FROM gone
                WHERE d.content_hash = encode(gone.content_hash, 'hex') AND d.embedded_content_hash IS NOT NULL
                  AND NOT EXISTS (SELECT 1 FROM embeddings e WHERE e.content_hash = gone.content_hash
                                    AND e.model = (SELECT m.id FROM embedding_models m WHERE m.name = %(active)s)
                                    AND %(active)s::text IS DISTINCT FROM %(model)s::text)
            )
            SELECT count(*) FROM gone
            """, {"model": model, "active": active_model}).fetchone()[0]
    if portal_url is None and source_id is None:
        raise ValueError("name what to invalidate: a portal, a dataset or a model")
    with conn.transaction():
        gone = conn.execute(
            """
            DELETE FROM embeddings e USING datasets d
            WHERE e.model = """ + MODEL_ID + """ AND e.content_hash = decode(d.content_hash, 'hex')
              AND (%(portal)s::text IS NULL OR d.portal_url = %(portal)s)
              AND (%(source)s::text IS NULL OR d.source_id = %(source)s)
            RETURNING encode(e.content_hash, 'hex')
            """, {"model": model, "portal": portal_url, "source": source_id}).fetchall()
        # Every dataset with those texts (in any portal) is pending again.
        conn.execute("UPDATE datasets SET embedded_content_hash = NULL WHERE content_hash = ANY(%s)",
                     ([row[0] for row in gone],))
    return len(gone)


def _reset_refusals(conn, model: str, *, portal_url: str | None, source_id: str | None,
                    all_of_model: bool) -> int:
    """Forget the refusals (sql/021) of ``model`` for what invalidate names: its texts are sent again
    by their next run, alone in their request."""
    if not all_of_model and portal_url is None and source_id is None:
        return 0
    reset = conn.execute(
        """
        DELETE FROM embedding_failures f
        WHERE f.model = %(model)s
          AND (%(all)s OR EXISTS (SELECT 1 FROM datasets d WHERE d.content_hash = f.content_hash
                                    AND (%(portal)s::text IS NULL OR d.portal_url = %(portal)s)
                                    AND (%(source)s::text IS NULL OR d.source_id = %(source)s)))
        """, {"model": model, "all": all_of_model, "portal": portal_url, "source": source_id}).rowcount
    if reset:
        log.info("%d texts whose vectors of %s were refused as unusable will be sent again by their next run", reset,
                 model)
    return reset


def prune(conn) -> int:
    """Delete vectors no dataset (nor a running run's staged record) has the text of, and the
    refusals (sql/021) of such texts."""
    conn.execute(
        """
        DELETE FROM embedding_failures f
        WHERE NOT EXISTS (SELECT 1 FROM datasets d WHERE d.content_hash = f.content_hash)
          AND NOT EXISTS (SELECT 1 FROM staging_records s WHERE s.content_hash = f.content_hash)
        """)
    return conn.execute(
        """
        DELETE FROM embeddings e
        WHERE NOT EXISTS (SELECT 1 FROM datasets d WHERE d.content_hash = encode(e.content_hash, 'hex'))
          AND NOT EXISTS (SELECT 1 FROM staging_records s WHERE s.content_hash = encode(e.content_hash, 'hex'))
        """).rowcount


def cache_stats(conn) -> dict:
    models = conn.execute("SELECT m.name, e.dimension, count(*) FROM embeddings e JOIN embedding_models m ON m.id = e.model"
                          " GROUP BY m.name, e.dimension ORDER BY m.name").fetchall()
    size = conn.execute("SELECT pg_total_relation_size('embeddings')").fetchone()[0]
    return {"models": [{"model": m, "dimension": d, "vectors": n} for m, d, n in models], "bytes": int(size)}
