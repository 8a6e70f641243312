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
        SELECT s.content_hash, s.title, s.description
        FROM staging_records s
        WHERE s.run_id = %(run)s AND s.outcome IN ('created', 'updated')
        UNION ALL
        SELECT d.content_hash, d.title, d.description
        FROM datasets d
        WHERE d.portal_url = %(portal)s AND d.removed_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM staging_records s
                          WHERE s.run_id = %(run)s AND s.source_id = d.source_id
                            AND s.outcome IN ('created', 'updated'))
    ) t
    WHERE NOT EXISTS (SELECT 1 FROM embeddings e WHERE e.content_hash = t.content_hash AND e.model = %(model)s)
"""


def count_pending(conn, run_id: int, portal_url: str, model: str) -> int:
    """Distinct texts of the portal without a vector for ``model``: this run's changes and
    anything earlier runs left pending."""
    params = {"run": run_id, "portal": portal_url, "model": model}
    return conn.execute(f"SELECT count(DISTINCT content_hash) {_PENDING}", params).fetchone()[0]


def iter_pending(conn, run_id: int, portal_url: str, model: str, batch_size: int) -> Iterator[list[tuple]]:
    """(content_hash, title, description) of each pending text, once each, in batches, streamed
    through a server-side cursor (``conn`` must be a connection of its own)."""
    params = {"run": run_id, "portal": portal_url, "model": model}
    with conn.transaction():
        with conn.cursor(name="harvester_pending_texts") as cur:
            cur.itersize = batch_size
            cur.execute(f"SELECT DISTINCT ON (content_hash) content_hash, title, description {_PENDING}"
                        " ORDER BY content_hash", params)
            while rows := cur.fetchmany(batch_size):
                yield rows


def count_reused(conn, run_id: int, model: str) -> int:
    """Records of this run whose new text already had a vector: no provider call needed."""
    return conn.execute(
        """
        SELECT count(*) FROM staging_records s
        WHERE s.run_id = %s AND s.outcome IN ('created', 'updated') AND s.content_changed
          AND EXISTS (SELECT 1 FROM embeddings e WHERE e.content_hash = s.content_hash AND e.model = %s)
        """, (run_id, model)).fetchone()[0]


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
