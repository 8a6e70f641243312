"""Rows for search tests written straight into the tables (no run, no embedding): datasets of given
portals, a 3-dimension vector for each one's text, and a provider that is never asked to embed (the
tests give search() every query's vector)."""
from __future__ import annotations

import math


class GivenVectors:
    """search()'s provider when the test gives every query's vector: nothing is embedded."""

    def __init__(self, model: str):
        self.model = model

    def embed_query(self, text):  # pragma: no cover - never called
        raise AssertionError("the test gives the query's vector")


def spiral_vector(n: int) -> list[float]:
    """Dataset ``n``'s vector: 3 dimensions, on a spiral, each distinct from its neighbours'."""
    angle = n * 0.37
    return [math.cos(angle), math.sin(angle), 0.1 + (n % 11) / 10]


def insert_datasets(conn, portals: list[str]) -> None:
    """A dataset for each entry of ``portals`` (its portal), in that order: source id ``ds-<n>``,
    title ``dataset <n>``, content hash md5('c' || n). (Also on a database before sql/044, whose
    datasets.last_seen_at is NOT NULL: set there as the runs then set it.)"""
    seen = conn.execute("SELECT 1 FROM pg_attribute WHERE attrelid = 'datasets'::regclass"
                        " AND attname = 'last_seen_at' AND NOT attisdropped").fetchone()
    conn.execute(
        f"""
        INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,
                              first_seen_at, updated_at{", last_seen_at" if seen else ""}, raw)
        SELECT (%(portals)s::text[])[n + 1], 'ds-' || n, 'https://x/' || n, md5('u' || n), md5('c' || n),
               md5('m' || n), 'dataset ' || n, now(), now(){", now()" if seen else ""}, '{{}}'
        FROM generate_series(0, %(n)s - 1) n ORDER BY n
        """, {"portals": list(portals), "n": len(portals)})


def insert_texts(conn, rows: list[tuple[str, str, str, str]], config: str = "english") -> None:
    """Datasets with texts to search: ``rows`` of (portal, source id, title, description), each
    searched with the text search ``config``; then dataset_search vacuumed and analyzed."""
    with conn.cursor() as cur:
        cur.executemany(
            """
            INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,
                                  description, first_seen_at, updated_at, raw, search_config)
            VALUES (%(p)s, %(s)s, %(p)s || '/' || %(s)s, md5(%(p)s || %(s)s), md5('c' || %(p)s || %(s)s),
                    md5('m' || %(s)s), %(t)s, %(d)s, now(), now(), '{}', %(c)s)
            """, [{"p": p, "s": s, "t": t, "d": d, "c": config} for p, s, t, d in rows])
    conn.execute("VACUUM ANALYZE dataset_search")


def insert_vectors(conn, count: int, model: str) -> None:
    """The vector of ``model`` (``spiral_vector``) for the texts of datasets 0 to ``count`` - 1, in
    a database of today's schema or (migration tests) one from before sql/042."""
    from harvester.store import vectors

    if not conn.execute("SELECT to_regclass('embedding_models') IS NOT NULL").fetchone()[0]:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO embeddings (content_hash, model, dimension, embedding)"
                            " VALUES (md5('c' || %s), %s, 3, %s::vector)",
                            [(str(n), model, str(spiral_vector(n))) for n in range(count)])
        return
    number = vectors.model_id(conn, model, create=True)
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO embeddings (model, dimension, content_hash, embedding)"
                        " VALUES (%s, 3, decode(md5('c' || %s), 'hex'), %s::halfvec)",
                        [(number, str(n), str(spiral_vector(n))) for n in range(count)])
