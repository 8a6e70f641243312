"""Search at a million datasets (issue 40), on a small catalogue where the exact answer is known: the
vector side pre-ranks by binary quantization (the model's HNSW index on bit vectors; the bit copies
of dataset_vectors, sql/027, for filters that leave few datasets) and ranks its candidates exactly;
the text side ranks a bounded set of matches; an upgrade from the schema before sql/027 keeps every
vector and every answer. Real PostgreSQL + pgvector; the vectors are written directly (no provider)."""
from __future__ import annotations

import shutil

import numpy as np
import psycopg
import pytest

from harvester.store import db as store_db
from harvester.store import migrations, vectors
from harvester.store.search import SearchFilters, SearchSettings, search
from harvester.testing.runs import COPY_DRIFT

MODEL, DIM, N = "test/binary", 256, 2000
SHARES = (0.001, 0.01, 0.05, 0.15, 0.5)  # the filters' shares of the catalogue, one portal each


class Provider:
    model = MODEL

    def embed_query(self, text):  # never called: every search gives its vector
        raise AssertionError("no embedding expected")


def portal_of(n: int) -> str:
    """Datasets 0-1 on the 0.1% portal, 2-21 on the 1% one ... the rest on a last portal."""
    edge = 0
    for share in SHARES:
        edge += int(share * N)
        if n < edge:
            return f"https://share{share}.example"
    return "https://rest.example"


def catalogue_vectors() -> np.ndarray:
    """Vectors shaped like sentence embeddings: mostly in a low-dimensional subspace, and each
    portal's datasets near a direction of their own (a filter is a region of meaning)."""
    rng = np.random.default_rng(4)
    basis = np.linalg.qr(rng.standard_normal((DIM, 12)))[0].T
    centres = {p: rng.standard_normal(12) for p in {portal_of(n) for n in range(N)}}
    out = np.stack([(centres[portal_of(n)] + rng.standard_normal(12)) @ basis + 0.2 * rng.standard_normal(DIM)
                    for n in range(N)])
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def fill(conn, with_copies: str | None) -> np.ndarray:
    """N datasets with their vectors; ``with_copies``: 'bits' (today's dataset_vectors, written by
    copy_for_search) or 'halfvec' (the schema before sql/027, written as its writer did)."""
    vecs = catalogue_vectors()
    words = ["water", "roads", "schools", "budget", "census"]
    conn.execute(
        """
        INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title, description,
                              first_seen_at, updated_at, last_seen_at, embedded_content_hash, raw)
        SELECT p, 'ds-' || n, 'https://x/' || n, md5('u' || n), md5('c' || n), md5('m' || n),
               'dataset ' || n || ' ' || w, 'common words for all ' || w || ' rare' || n, now(), now(), now(),
               md5('c' || n), '{}'
        FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS t(p, w, k), LATERAL (SELECT k - 1 AS n) i
        """, ([portal_of(n) for n in range(N)], [words[n % len(words)] for n in range(N)]))
    from pgvector import HalfVector

    with conn.cursor() as cur, cur.copy("COPY embeddings (content_hash, model, dimension, embedding) FROM STDIN"
                                        " (FORMAT BINARY)") as copy:
        copy.set_types(["text", "text", "int4", "halfvec"])
        for n in range(N):
            import hashlib

            copy.write_row((hashlib.md5(f"c{n}".encode()).hexdigest(), MODEL, DIM, HalfVector(vecs[n])))
    if with_copies == "bits":
        with conn.transaction():
            for portal in {portal_of(n) for n in range(N)}:
                vectors.copy_for_search(conn, portal, MODEL)
    elif with_copies == "halfvec":
        conn.execute("INSERT INTO dataset_vectors (dataset_id, model, content_hash, embedding)"
                     " SELECT d.id, e.model, e.content_hash, e.embedding FROM datasets d"
                     " JOIN embeddings e ON e.content_hash = d.content_hash ORDER BY d.id")
    conn.execute("ANALYZE")
    return vecs


def exact(conn, query, portal: str | None, k: int = 10) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT d.id FROM datasets d JOIN embeddings e ON e.content_hash = d.content_hash"
        " WHERE (%s::text IS NULL OR d.portal_url = %s) ORDER BY e.embedding <=> %s::halfvec, d.id LIMIT %s",
        (portal, portal, query, k)).fetchall()]


def queries(vecs) -> list[np.ndarray]:
    rng = np.random.default_rng(9)
    picks = [vecs[i] + 0.3 * rng.standard_normal(DIM).astype(np.float32) / np.sqrt(DIM) for i in (0, 3, 30, 150, 700)]
    return [q / np.linalg.norm(q) for q in picks]


@pytest.fixture
def catalogue(db):
    vecs = fill(db, "bits")
    assert vectors.ensure_index(db, MODEL, DIM)
    db.execute("ANALYZE embeddings")
    return db, vecs


def vector_ids(conn, query, filters=None, settings=None) -> list[int]:
    return [i["dataset_id"] for i in search(conn, "", mode="vector", filters=filters or SearchFilters(), limit=10,
                                            settings=settings or SearchSettings(), query_vector=query,
                                            provider=Provider()).items]


@pytest.mark.parametrize("path", ["copies", "index"])
def test_filtered_search_at_each_share_returns_the_exact_top_10(catalogue, path):
    """Near (the query from the portal's region) and far (from another's), each share: the exact top
    10, by the bit copies of the datasets the filter leaves (``copies``) or by the binary HNSW index
    with the filter inside its scan (``index``), each re-ranked exactly."""
    conn, vecs = catalogue
    settings = SearchSettings(exact_limit=10**6 if path == "copies" else 0, rerank=200)
    for share in SHARES:
        portal = f"https://share{share}.example"
        for q in queries(vecs):
            assert vector_ids(conn, q, SearchFilters(portal_url=portal), settings) == exact(conn, q, portal), \
                (share, path)


def test_unfiltered_search_pre_ranks_through_the_binary_index_and_ranks_exactly(catalogue):
    from harvester.store.search import explain_vector_side

    conn, vecs = catalogue
    definition = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s",
                              (vectors.index_name(MODEL),)).fetchone()[0]
    assert "binary_quantize(embedding)" in definition and "bit_hamming_ops" in definition
    conn.execute("SET enable_seqscan = off")  # 2,000 rows: the plan a catalogue of a million takes
    assert f"Index Scan using {vectors.index_name(MODEL)}" in explain_vector_side(conn, MODEL, DIM, vecs[0])
    conn.execute("RESET enable_seqscan")
    for q in queries(vecs):
        assert vector_ids(conn, q, settings=SearchSettings(rerank=200)) == exact(conn, q, None)
        # rerank 0: no index, every dataset ranked exactly
        assert vector_ids(conn, q, settings=SearchSettings(rerank=0)) == exact(conn, q, None)


def test_the_text_side_ranks_a_bounded_set_of_a_common_words_matches(catalogue):
    conn, vecs = catalogue

    def text_ids(query, cap):
        return [i["dataset_id"] for i in search(conn, query, mode="text", limit=10,
                                                settings=SearchSettings(text_cap=cap)).items]

    # a word in a fifth of the catalogue: ranked among the first 50 matches only, still 10 results
    capped, full = text_ids("schools", 50), text_ids("schools", 0)
    assert len(capped) == len(full) == 10
    first = {r[0] for r in conn.execute("SELECT dataset_id FROM dataset_search WHERE document @@ "
                                        "plainto_tsquery('simple', 'schools') LIMIT 50")}
    assert set(capped) <= first
    # rare words (fewer matches than the cap): exactly as without a cap
    for query in ("rare17", "rare1999 budget", "dataset 5"):
        assert text_ids(query, 50) == text_ids(query, 0)


def test_the_upgrade_to_bit_copies_keeps_every_vector_and_every_answer(empty_database_url, tmp_path):
    """A database written before sql/027 (halfvec copies, the halfvec HNSW index): the migration
    turns each copy into its bit vector in place, embeddings untouched; searches give the same
    answers before the new index is built (exact scans), and after ensure_index has built it (and
    dropped the old one)."""
    before_027 = tmp_path / "sql"
    before_027.mkdir()
    for version, path in migrations.migration_files():
        if version < 27:
            shutil.copy(path, before_027 / path.name)
    url = empty_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn, before_027)
        from pgvector.psycopg import register_vector

        register_vector(conn)
        vecs = fill(conn, "halfvec")
        conn.execute(f"CREATE INDEX {vectors.index_name(MODEL)} ON embeddings USING hnsw"
                     f" ((embedding::halfvec({DIM})) halfvec_cosine_ops) WHERE model = '{MODEL}'")
        stored = conn.execute("SELECT content_hash, embedding::text FROM embeddings ORDER BY 1").fetchall()
        truth = {(share, i): exact(conn, q, f"https://share{share}.example")
                 for share in SHARES for i, q in enumerate(queries(vecs))}
        truth.update({(None, i): exact(conn, q, None) for i, q in enumerate(queries(vecs))})

    with store_db.prepare(store_db.connect_url(url)) as conn:  # applies 027 (and any later one)
        assert "027_binary_search_vectors.sql" in conn.execute(
            "SELECT array_agg(name) FROM schema_migrations").fetchone()[0]
        assert conn.execute("SELECT content_hash, embedding::text FROM embeddings ORDER BY 1").fetchall() == stored
        assert conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid ="
                            " 'dataset_vectors'::regclass AND attname = 'bits'").fetchone()[0] == "bit varying"
        assert conn.execute("SELECT count(*) FROM dataset_vectors").fetchone()[0] == N
        assert conn.execute(COPY_DRIFT, {"model": MODEL}).fetchone()[0] == 0
        assert vectors.index_state(conn, MODEL) == "missing"  # the halfvec index serves nothing now

        def answers():
            out = {}
            for share in SHARES + (None,):
                filters = SearchFilters(portal_url=f"https://share{share}.example") if share else SearchFilters()
                for i, q in enumerate(queries(vecs)):
                    out[(share, i)] = vector_ids(conn, q, filters, SearchSettings(rerank=200))
            return out

        assert answers() == truth
        assert vectors.restore_index(conn, MODEL)
        assert [r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'embeddings'"
                                           " AND indexdef LIKE '%%hnsw%%'")] == [vectors.index_name(MODEL)]
        assert answers() == truth
