"""Search's exact path reads a portal filter's datasets from one index (sql/028, issue 40: search at
a million datasets): the live datasets of the portal with their content hash, in id order, from
an index-only scan instead of rows scattered over dataset_search. Results stay those of exact
search: removed datasets, other portals and copies of an older text are left out. Real PostgreSQL
and pgvector; 600 datasets and 3-dimension vectors written directly (no run, no embedding)."""
from __future__ import annotations

import psycopg

from harvester.store import migrations, vectors
from harvester.store.search import SearchFilters, SearchSettings, explain_vector_side, search
from harvester.testing.search_rows import GivenVectors, insert_datasets, insert_vectors, spiral_vector as _vector

MODEL = "test-portal-rows-3"
PORTALS = ("https://a.example", "https://b.example", "https://c.example")
N = 600


def fill(conn) -> None:
    """N datasets over three portals (interleaved, as a worst case: each portal's rows scattered),
    each with its vector and its copy; then dataset 7 removed and dataset 10's text changed with
    its new vector not written yet (its copy is of the older text)."""
    insert_datasets(conn, [PORTALS[n % 3] for n in range(N)])
    insert_vectors(conn, N, MODEL)
    for portal in PORTALS:
        vectors.copy_for_search(conn, portal, MODEL)
    conn.execute("UPDATE datasets SET removed_at = now() WHERE source_id = 'ds-7'")
    conn.execute("UPDATE datasets SET content_hash = md5('changed') WHERE source_id = 'ds-10'")
    conn.execute("VACUUM ANALYZE dataset_search")  # the visibility map set, as autovacuum leaves it


def _exact(conn, portal: str, query: list[float], k: int) -> list[str]:
    """The truth: every live dataset of the portal whose current text has a vector, by distance."""
    return [r[0] for r in conn.execute(
        "SELECT d.source_id FROM datasets d JOIN embeddings e ON e.content_hash = decode(d.content_hash, 'hex')"
        " AND e.model = (SELECT id FROM embedding_models WHERE name = %s)"
        " WHERE d.portal_url = %s AND d.removed_at IS NULL"
        " ORDER BY e.embedding <=> %s::halfvec, d.id LIMIT %s", (MODEL, portal, str(query), k)).fetchall()]


def test_a_portal_filter_is_read_from_the_portals_index_and_ranked_exactly(db):
    conn = db
    if True:
        fill(conn)
        query = _vector(10)  # dataset 10's older text: its copy would be first, were it used
        portal = PORTALS[10 % 3]
        assert portal == PORTALS[7 % 3]  # the removed dataset is on that portal too
        conn.execute("SET enable_seqscan = off")  # a small table: what a large one's plan is
        conn.execute("SET enable_bitmapscan = off")
        plan = explain_vector_side(conn, MODEL, 3, query, SearchFilters(portal_url=portal), exact=True)
        assert "Index Only Scan using dataset_search_portal_rows" in plan, plan
        found = search(conn, "x", mode="vector", filters=SearchFilters(portal_url=portal), limit=10,
                       settings=SearchSettings(), query_vector=query, provider=GivenVectors(MODEL))
        ids = [i["source_id"] for i in found.items]
        assert ids == _exact(conn, portal, query, 10)
        assert "ds-7" not in ids and "ds-10" not in ids and all(i["portal_url"] == portal for i in found.items)


def test_028_indexes_the_live_datasets_of_an_existing_database(empty_database_url, migrate_before):
    """The upgrade keeps every row and indexes what was already there, in place of 007's index."""
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 28)
        conn.execute(
            "INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,"
            " first_seen_at, updated_at, last_seen_at, removed_at, raw)"
            " SELECT 'https://p.example', 's' || n, 'u', 'h' || n, 'c' || n, 'm', 't', now(), now(), now(),"
            " CASE WHEN n = 2 THEN now() END, '{\"notes\": \"kept\"}' FROM generate_series(1, 3) n")
        assert migrations.migrate(conn)[0].startswith("028_")
        indexes = dict(conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'dataset_search'"
                                    ).fetchall())
        assert "(portal_url, dataset_id) INCLUDE (content_hash, removed_at)" in indexes["dataset_search_portal_rows"]
        assert "dataset_search_portal" not in indexes  # replaced: portal_url leads the new one
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_bitmapscan = off")
        rows = conn.execute("SELECT s.content_hash FROM dataset_search s WHERE s.portal_url = 'https://p.example'"
                            " AND s.removed_at IS NULL ORDER BY s.dataset_id").fetchall()
        assert [r[0] for r in rows] == [bytes.fromhex("c1"), bytes.fromhex("c3")]  # as bytes since sql/043
        assert conn.execute("SELECT count(*) FROM datasets WHERE raw ->> 'notes' = 'kept'").fetchone()[0] == 3


def test_the_text_side_of_a_small_filter_reads_its_rows_and_finds_what_the_index_finds(db):
    """A filter leaving few datasets against a stage matching many (any word of the query): the
    text side reads the filter's rows and checks each text (no bitmap of every dataset holding a
    common word); same matches, same ranks, removed datasets left out as through the index."""
    from harvester.store.search import _text_side, filter_sql, text_query

    db.execute(
        """
        INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title, description,
                              first_seen_at, updated_at, raw)
        SELECT CASE WHEN n % 40 = 0 THEN 'https://small.example' ELSE 'https://big.example' END, 'ds-' || n,
               'https://x/' || n, md5('u' || n), md5('c' || n), md5('m' || n),
               'county data ' || n, CASE WHEN n % 3 = 0 THEN 'water quality of the county' ELSE 'roads' END,
               now(), now(), '{}'
        FROM generate_series(0, 1999) n
        """)
    db.execute("UPDATE datasets SET removed_at = now() WHERE source_id = 'ds-120'")
    db.execute("ANALYZE dataset_search")
    where, params = filter_sql(SearchFilters(portal_url="https://small.example"))
    for stage in text_query(db, "water county data").stages:
        through_index = _text_side(db, stage, where, params, 30, exclude=[], cap=10000, few=False)
        through_rows = _text_side(db, stage, where, params, 30, exclude=[], cap=10000, few=True)
        assert through_rows == through_index and through_rows
        assert db.execute("SELECT id FROM datasets WHERE source_id = 'ds-120'").fetchone()[0] not in dict(through_rows)
    found = search(db, "water county data", mode="text", filters=SearchFilters(portal_url="https://small.example"),
                   limit=10, settings=SearchSettings())
    assert len(found.items) == 10 and all(i["portal_url"] == "https://small.example" for i in found.items)
