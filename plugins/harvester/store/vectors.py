"""Vectors, content-addressed: one per (content_hash, model), shared by every dataset with that text.

Each model gets a partial HNSW cosine index over its rows, cast to its dimension (halfvec above
2000 dimensions, pgvector's limit for vector), so models of different sizes live side by side
and one can replace another without dropping data.
"""
from __future__ import annotations

import re
from typing import Iterator, Sequence

import numpy as np
from psycopg import sql

HNSW_MAX_VECTOR_DIMS = 2000


def index_name(model: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", model.lower()).strip("_")[:40]
    return f"embeddings_hnsw_{slug}"


def index_expression(dimension: int) -> sql.Composable:
    kind = "vector" if dimension <= HNSW_MAX_VECTOR_DIMS else "halfvec"
    return sql.SQL("(embedding::{}({}))").format(sql.SQL(kind), sql.Literal(int(dimension)))


def opclass(dimension: int) -> str:
    return "vector_cosine_ops" if dimension <= HNSW_MAX_VECTOR_DIMS else "halfvec_cosine_ops"


def ensure_index(conn, model: str, dimension: int) -> None:
    """Create the model's HNSW index if it does not exist yet (idempotent)."""
    statement = sql.SQL(
        "CREATE INDEX IF NOT EXISTS {name} ON embeddings USING hnsw ({expr} {ops}) WHERE model = {model}"
    ).format(name=sql.Identifier(index_name(model)), expr=index_expression(dimension),
             ops=sql.SQL(opclass(dimension)), model=sql.Literal(model))
    conn.execute(statement)


_PENDING = """
    FROM (
        SELECT s.content_hash, s.title, s.description, true AS from_run
        FROM staging_records s
        WHERE s.run_id = %(run)s AND s.outcome IN ('created', 'updated')
        UNION ALL
        SELECT d.content_hash, d.title, d.description, false AS from_run
        FROM datasets d
        WHERE d.portal_url = %(portal)s AND d.removed_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM staging_records s
                          WHERE s.run_id = %(run)s AND s.source_id = d.source_id
                            AND s.outcome IN ('created', 'updated'))
    ) t
    WHERE NOT EXISTS (SELECT 1 FROM embeddings e WHERE e.content_hash = t.content_hash AND e.model = %(model)s)
      AND get_byte(decode(t.content_hash, 'hex'), 0) %% %(shards)s = %(shard)s
"""


def count_pending(conn, run_id: int, portal_url: str, model: str, shard: int = 0, shards: int = 1) -> int:
    """Distinct texts of the portal without a vector for ``model``: this run's changes and
    anything earlier runs left pending (in one shard of ``shards``, by content hash)."""
    params = {"run": run_id, "portal": portal_url, "model": model, "shard": shard, "shards": shards}
    return conn.execute(f"SELECT count(DISTINCT content_hash) {_PENDING}", params).fetchone()[0]


def iter_pending(conn, run_id: int, portal_url: str, model: str, batch_size: int, *, shard: int = 0,
                 shards: int = 1, backlog_limit: int | None = None) -> Iterator[list[tuple]]:
    """(content_hash, title, description) of each pending text, once each, in batches: this run's
    changes first, then at most ``backlog_limit`` texts left pending by earlier runs (a model
    switch re-embeds a portal over several runs). Streamed through a server-side cursor: ``conn``
    must be a connection of its own."""
    params = {"run": run_id, "portal": portal_url, "model": model, "shard": shard, "shards": shards}
    backlog = 0
    with conn.transaction():
        with conn.cursor(name="harvester_pending_texts") as cur:
            cur.itersize = batch_size
            cur.execute("SELECT content_hash, title, description, from_run FROM ("
                        f" SELECT DISTINCT ON (content_hash) content_hash, title, description, from_run {_PENDING}"
                        " ORDER BY content_hash, from_run DESC) p ORDER BY from_run DESC, content_hash", params)
            while rows := cur.fetchmany(batch_size):
                if backlog_limit is not None:
                    kept = []
                    for row in rows:
                        if not row[3]:
                            if backlog >= backlog_limit:
                                break
                            backlog += 1
                        kept.append(row)
                    if kept:
                        yield [r[:3] for r in kept]
                    if len(kept) < len(rows):
                        return
                else:
                    yield [r[:3] for r in rows]


def reuse(conn, run_id: int, model: str, started_at) -> dict:
    """This run's new texts that already had a vector when the run began (another portal, a
    reverted edit, a failed earlier run): no provider call, and what that saved, estimated at
    four characters a token."""
    reused, tokens = conn.execute(
        """
        SELECT count(*), coalesce(sum(ceil((length(s.title) + length(s.description) + 2) / 4.0)), 0)
        FROM staging_records s
        JOIN embeddings e ON e.content_hash = s.content_hash AND e.model = %s AND e.created_at < %s
        WHERE s.run_id = %s AND s.outcome IN ('created', 'updated') AND s.content_changed
        """, (model, started_at, run_id)).fetchone()
    return {"embeddings_reused": int(reused), "embedding_tokens_saved": int(tokens)}


def write(conn, model: str, dimension: int, hashes: Sequence[str], vectors: Sequence[Sequence[float]]) -> int:
    """Store vectors, committed at once: paid-for vectors are kept even if the run fails later."""
    if len(hashes) != len(vectors):
        raise ValueError(f"{len(hashes)} texts but {len(vectors)} vectors")
    rows = []
    for content_hash, vector in zip(hashes, vectors):
        array = np.asarray(vector, dtype=np.float32)
        if array.shape != (dimension,):
            raise ValueError(f"model {model} returned a vector of shape {array.shape}, expected ({dimension},)")
        rows.append((content_hash, model, dimension, array))
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO embeddings (content_hash, model, dimension, embedding) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (content_hash, model) DO NOTHING", rows)
    return len(rows)
