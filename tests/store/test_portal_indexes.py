"""Per-portal HNSW indexes (sql/029, store/portal_indexes.py, issue 40: search at a million under a
portal filter that leaves 5-50% of the catalogue): dataset_vectors holds each copy's portal (an
existing database's filled by the migration), a large portal gets its own partial index after its
run (not one that is nearly the whole catalogue), an index of another model, of a portal that shrank
or is gone, or left invalid is dropped (and rebuilt), a second maintenance of the same portal skips,
and search scans the index and finds what exact search finds. Real PostgreSQL and pgvector; a few
hundred datasets and 3-dimension vectors written directly (no run, no embedding), the threshold set
low through the settings."""
from __future__ import annotations

import psycopg
import psycopg.sql
import pytest

from harvester.store import migrations, portal_indexes, vectors
from harvester.store.portal_indexes import PortalIndexSettings
from harvester.store.search import SearchFilters, SearchSettings, explain_vector_side, search
from harvester.testing.search_rows import GivenVectors, insert_datasets, insert_vectors, spiral_vector as _vector

MODEL, OTHER = "test-portal-index-3", "test-portal-index-other-3"
BIG, MID, SMALL = "https://x.org/it's", "https://b.example/a%20b%(x)s", "https://c.example"
SIZES = {BIG: 300, MID: 150, SMALL: 50}
LOW = PortalIndexSettings(min_datasets=100, max_share=0.9, build_timeout=60, lock_timeout=10)


def fill(conn, models=(MODEL,), copy=True) -> None:
    """SIZES' datasets (portals interleaved), each text with its vector of each model; with ``copy``
    the copies for search written and each portal checked for the first model."""
    portals = [p for p, size in SIZES.items() for _ in range(size)]
    insert_datasets(conn, portals)
    for model in models:
        insert_vectors(conn, len(portals), model)
    if copy:
        for portal in SIZES:
            vectors.copy_for_search(conn, portal, models[0])
    conn.execute("ANALYZE")


def test_029_fills_the_portal_of_an_existing_databases_copies(empty_database_url, migrate_before):
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrate_before(conn, 29)
        fill(conn, copy=False)
        conn.execute("INSERT INTO dataset_vectors (dataset_id, model, content_hash, embedding)"
                     " SELECT d.id, e.model, e.content_hash, e.embedding::vector FROM datasets d"
                     " JOIN embeddings e ON e.content_hash = d.content_hash")
        before = conn.execute("SELECT dataset_id, embedding::text FROM dataset_vectors ORDER BY 1").fetchall()
        assert migrate_before(conn, 30) == ["029_portal_vector_indexes.sql"]
        assert conn.execute("SELECT count(*) FROM dataset_vectors v JOIN datasets d ON d.id = v.dataset_id"
                            " WHERE v.portal_url = d.portal_url").fetchone()[0] == sum(SIZES.values())
        assert conn.execute("SELECT dataset_id, embedding::text FROM dataset_vectors ORDER BY 1").fetchall() == before
        assert conn.execute("SELECT count(*) FROM portal_indexes").fetchone()[0] == 0
        # 041 keeps the portal as the copy's scope
        migrations.migrate(conn)
        assert conn.execute("SELECT count(*) FROM dataset_vectors v JOIN datasets d ON d.id = v.dataset_id"
                            " JOIN vector_scopes k ON k.id = v.scope"
                            " WHERE k.portal_url = d.portal_url").fetchone()[0] == sum(SIZES.values())
        # the writers set it from now on
        conn.execute("DELETE FROM dataset_vectors")
        vectors.copy_for_search(conn, MID, MODEL)
        assert conn.execute("SELECT DISTINCT k.portal_url FROM dataset_vectors v"
                            " JOIN vector_scopes k ON k.id = v.scope").fetchall() == [(MID,)]


def _valid(conn) -> dict[str, str]:
    """index name -> its predicate, of the valid per-portal indexes."""
    return dict(conn.execute(
        "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = 'dataset_vectors'::regclass AND i.indisvalid AND starts_with(c.relname, 'dataset_vectors_p_')"
    ).fetchall())


def test_large_portals_get_their_index_and_lose_it_when_no_longer_wanted(db):
    conn = db
    fill(conn, models=(MODEL, OTHER))
    # over the threshold: built (the quote in the URL is a literal's, the name a hash's)
    done = portal_indexes.maintain(conn, BIG, MODEL, settings=LOW)
    assert done["action"] == "built" and done["datasets"] == 300, done
    name = portal_indexes.index_name(BIG, MODEL)
    scope = vectors.existing_scope(conn, BIG, MODEL)
    assert _valid(conn)[name] == f"(scope = {scope})"
    assert conn.execute("SELECT portal_url, model FROM vector_scopes WHERE id = %s", (scope,)).fetchone() == (BIG, MODEL)
    assert portal_indexes.usable(conn, BIG, MODEL) == scope
    assert [(r["portal_url"], r["state"], r["searched"]) for r in portal_indexes.listing(conn)] == [(BIG, "valid", True)]
    assert portal_indexes.maintain(conn, BIG, MODEL, settings=LOW)["action"] == "kept"
    # below it: none; a portal that is the whole catalogue's 90% or more: none
    assert portal_indexes.maintain(conn, SMALL, MODEL, settings=LOW)["action"] == "none"
    assert portal_indexes.maintain(conn, BIG, MODEL, settings=PortalIndexSettings(
        min_datasets=100, max_share=0.5))["dropped"] == [name]
    assert not _valid(conn) and portal_indexes.usable(conn, BIG, MODEL) is None
    assert portal_indexes.maintain(conn, BIG, MODEL, settings=LOW)["action"] == "built"

    # a model switch: the old model's index dropped; the new one's waits for the copies to be complete
    done = portal_indexes.maintain(conn, BIG, OTHER, settings=LOW)
    assert done["action"] == "unchecked" and done["dropped"] == [name], done
    vectors.copy_for_search(conn, BIG, OTHER)
    assert portal_indexes.maintain(conn, BIG, OTHER, settings=LOW)["action"] == "built"
    assert list(_valid(conn)) == [portal_indexes.index_name(BIG, OTHER)]

    # a portal that shrank below the threshold, and one that is gone
    vectors.copy_for_search(conn, MID, MODEL)
    assert portal_indexes.maintain(conn, MID, MODEL, settings=LOW)["action"] == "built"
    conn.execute("UPDATE datasets SET removed_at = now() WHERE portal_url = %s AND source_id <> 'ds-350'", (MID,))
    assert portal_indexes.drop_orphans(conn, LOW) == []
    assert portal_indexes.maintain(conn, MID, MODEL, settings=LOW)["dropped"] == [portal_indexes.index_name(MID, MODEL)]
    conn.execute("UPDATE datasets SET removed_at = now() WHERE portal_url = %s", (BIG,))
    assert portal_indexes.drop_orphans(conn, LOW) == [portal_indexes.index_name(BIG, OTHER)]
    assert not _valid(conn) and portal_indexes.listing(conn) == []


def test_an_invalid_index_is_dropped_and_built_again_and_a_held_portal_is_skipped(db, database_url):
    conn = db
    fill(conn)
    name = portal_indexes.index_name(BIG, MODEL)
    assert portal_indexes.maintain(conn, BIG, MODEL, settings=LOW)["action"] == "built"
    # what a build that timed out or whose server process was stopped leaves behind
    conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass", (name,))
    assert portal_indexes.usable(conn, BIG, MODEL) is None
    assert portal_indexes.listing(conn)[0]["state"] == "dead"
    done = portal_indexes.maintain(conn, BIG, MODEL, settings=LOW)
    assert done["action"] == "built" and name in done["dropped"], done
    assert portal_indexes.usable(conn, BIG, MODEL) is not None

    # another connection maintains the portal's index: this one skips, and does nothing
    conn.execute(psycopg.sql.SQL("DROP INDEX {}").format(psycopg.sql.Identifier(name)))
    with psycopg.connect(database_url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (portal_indexes.LOCK_CLASS, BIG))
        assert portal_indexes.maintain(conn, BIG, MODEL, settings=LOW)["action"] == "skipped"
        assert not _valid(conn)
        other.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (portal_indexes.LOCK_CLASS, BIG))
    assert portal_indexes.maintain(conn, BIG, MODEL, settings=LOW)["action"] == "built"


def test_a_failed_build_is_a_warning_and_its_leftover_is_dropped_and_built_again(db, database_url, caplog,
                                                                                  monkeypatch):
    conn = db
    fill(conn)
    monkeypatch.setenv("HARVESTER_PORTAL_INDEX_MIN_DATASETS", "100")
    monkeypatch.setenv("HARVESTER_PORTAL_INDEX_LOCK_TIMEOUT_SECS", "0.5")
    monkeypatch.setenv("HARVESTER_PORTAL_INDEX_BUILD_TIMEOUT_SECS", "5")
    name = portal_indexes.index_name(BIG, MODEL)
    with psycopg.connect(database_url) as writer:
        # a transaction writing dataset_vectors (another portal's merge): the build waits for it, in vain
        writer.execute("LOCK TABLE dataset_vectors IN ROW EXCLUSIVE MODE")
        assert portal_indexes.after_run(conn, BIG, MODEL) is None
        assert "harvester embeddings portal-indexes --build" in caplog.text
        assert portal_indexes.usable(conn, BIG, MODEL) is None and portal_indexes.listing(conn) == []
        left = conn.execute("SELECT count(*) FROM pg_class WHERE relname = %s", (name,)).fetchone()[0]
        writer.rollback()
    assert not _valid(conn)
    done = portal_indexes.after_run(conn, BIG, MODEL)
    assert done["action"] == "built" and (name in done["dropped"]) == bool(left), (done, left)
    assert portal_indexes.usable(conn, BIG, MODEL) is not None


@pytest.mark.parametrize("portal", [BIG, MID])
def test_search_scans_the_portals_index_and_finds_what_exact_search_finds(db, portal):
    conn = db
    fill(conn)
    for p in SIZES:
        portal_indexes.maintain(conn, p, MODEL, settings=LOW)
    assert portal_indexes.usable(conn, portal, MODEL) is not None
    filters = SearchFilters(portal_url=portal)
    conn.execute("SET enable_seqscan = off")
    plan = explain_vector_side(conn, MODEL, 3, _vector(5), filters, portal_index=True)
    assert f"Index Scan using {portal_indexes.index_name(portal, MODEL)}" in plan, plan
    conn.execute("RESET enable_seqscan")
    # exact_limit 0: the filter goes to the index scans; the truth ranks the portal exactly
    indexed = SearchSettings(exact_limit=0, portal_ef_search=1000, ef_search=1000)
    exact = SearchSettings(exact_limit=10**9)

    def scans() -> int:  # the portal's index's scans so far (this session's counts flushed first)
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return conn.execute("SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = %s",
                            (portal_indexes.index_name(portal, MODEL),)).fetchone()[0]

    before = scans()
    search(conn, "x", mode="vector", filters=filters, limit=10, settings=indexed, query_vector=_vector(1),
           provider=GivenVectors(MODEL))
    assert scans() == before + 1
    for n in (3, 120, 260):
        query = _vector(n)
        got = search(conn, "x", mode="vector", filters=filters, limit=10, settings=indexed, query_vector=query,
                     provider=GivenVectors(MODEL))
        truth = search(conn, "x", mode="vector", filters=filters, limit=10, settings=exact, query_vector=query,
                       provider=GivenVectors(MODEL))
        assert [i["dataset_id"] for i in got.items] == [i["dataset_id"] for i in truth.items]
        assert [i["similarity"] for i in got.items] == [i["similarity"] for i in truth.items]
        assert all(i["portal_url"] == portal for i in got.items)
    # a copy behind (the portal unchecked): the shared index answers, the same
    conn.execute("DELETE FROM dataset_vectors_checked WHERE portal_url = %s", (portal,))
    assert portal_indexes.usable(conn, portal, MODEL) is None
    got = search(conn, "x", mode="vector", filters=filters, limit=10, settings=indexed, query_vector=_vector(3),
                 provider=GivenVectors(MODEL))
    truth = search(conn, "x", mode="vector", filters=filters, limit=10, settings=exact, query_vector=_vector(3),
                   provider=GivenVectors(MODEL))
    assert [i["dataset_id"] for i in got.items] == [i["dataset_id"] for i in truth.items]


def test_a_large_portals_run_builds_its_index_after_its_commit(db, reader, portal_server, samples, gemini,
                                                                monkeypatch, capsys):
    """The hook in the upsert: a portal over the threshold gets its index from its own run (a
    single-portal catalogue is the whole catalogue: MAX_SHARE 1 lets it have one here)."""
    from harvester.config.portals import Portal
    from harvester.embeddings import get_provider
    from harvester.pipeline import steps as pipeline
    from harvester.testing.samples import distinct_records

    monkeypatch.setenv("HARVESTER_PORTAL_INDEX_MIN_DATASETS", "20")
    portal_server.set_records(distinct_records(samples, 30))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    assert portal_indexes.usable(db, portal.url, provider.model) is None  # the whole catalogue: none
    monkeypatch.setenv("HARVESTER_PORTAL_INDEX_MAX_SHARE", "1")
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    assert portal_indexes.usable(db, portal.url, provider.model) is not None
    assert [r["datasets"] for r in portal_indexes.listing(db)] == [30]
    # an operator sees it, and can rebuild it, without SQL
    from harvester.cli.main import main

    db.execute(psycopg.sql.SQL("DROP INDEX {}").format(psycopg.sql.Identifier(portal_indexes.index_name(
        portal.url, provider.model))))
    capsys.readouterr()
    assert main(["embeddings", "portal-indexes", "--build", "--portal", portal.url]) == 0
    out = capsys.readouterr().out
    assert f"{portal.url}: built" in out and "valid" in out and "yes" in out, out


def _three_paths(conn):
    """A vector search through each of the vector side's statements: the portal's own index, the
    shared index, and the exact ranking of a filter expected to leave few datasets."""
    indexed = SearchSettings(exact_limit=0, portal_ef_search=300, ef_search=300, max_scan_tuples=5000)
    for filters, settings in ((SearchFilters(portal_url=BIG), indexed), (SearchFilters(), indexed),
                              (SearchFilters(portal_url=SMALL), SearchSettings(exact_limit=10**9))):
        found = search(conn, "x", mode="vector", filters=filters, limit=10, settings=settings,
                       query_vector=_vector(7), provider=GivenVectors(MODEL))
        assert len(found.items) == 10


def _scan_settings(conn) -> tuple:
    return conn.execute("SELECT current_setting('hnsw.ef_search'), current_setting('hnsw.iterative_scan'),"
                        " current_setting('hnsw.max_scan_tuples')").fetchone()


def test_the_vector_side_leaves_the_callers_settings_as_they_were(db):
    """The HNSW scans' settings (ef_search, the iterative scan, its bound) hold for the scan alone:
    inside a caller's open transaction (the vector side's own is then a savepoint, and a released
    savepoint keeps what SET LOCAL set) the caller's values come back; after it, the session's."""
    conn = db
    fill(conn)
    portal_indexes.maintain(conn, BIG, MODEL, settings=LOW)
    assert portal_indexes.usable(conn, BIG, MODEL) is not None
    conn.execute("SELECT set_config('hnsw.ef_search', '55', false), set_config('hnsw.max_scan_tuples', '7000', false)")
    session = _scan_settings(conn)
    assert session == ("55", "off", "7000")
    with conn.transaction():
        conn.execute("SELECT set_config('hnsw.ef_search', '77', true),"
                     " set_config('hnsw.iterative_scan', 'strict_order', true)")
        _three_paths(conn)
        assert _scan_settings(conn) == ("77", "strict_order", "7000")
    assert _scan_settings(conn) == session
    _three_paths(conn)
    assert _scan_settings(conn) == session


def test_vector_statements_are_planned_for_their_values_never_prepared(db):
    """As the text side's (test_search_text_title.py): psycopg prepares a query text run five times
    on a connection, and PostgreSQL may then plan it once for any filter; searched ten times through
    each path, none of the vector side's statements is a prepared statement."""
    conn = db
    fill(conn)
    portal_indexes.maintain(conn, BIG, MODEL, settings=LOW)
    for _ in range(10):
        _three_paths(conn)
    prepared = [r[0] for r in conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()]
    assert not [s for s in prepared if "<=>" in s], prepared
