"""The storage migrations of issue 26 applied to a database written before them (at 018): sql/019
(vectors stored in half precision) and sql/020 (a version's title and description kept once, in its
snapshot). What users see (search in each mode, with and without filters; versions, changes, the
export) is the same before and after, nothing is re-harvested or re-embedded, and the next run builds
the index the migration dropped. Real PostgreSQL + pgvector, the local CKAN portal, the real
google-genai SDK against the local Gemini-protocol server."""
from __future__ import annotations

import copy
import shutil
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from harvester.config.portals import Portal
from harvester.pipeline import steps as pipeline
from harvester.store import db as store_db
from harvester.store import export, history, migrations, search, vectors
from harvester.testing.runs import COPY_DRIFT
from harvester.testing.samples import distinct_records

# what the migrations since 018 changed: vectors in half precision (019), a version's text kept once (020)
# (023 gives databases that applied 020's first text, on PostgreSQL 18, the same schema: here a no-op;
# 032 is what reads 020's functions since the current version's snapshot is its dataset's row, 031;
# 034 replaces 032's view, 045 replaces 034's)
MIGRATIONS = ["019_half_precision_vectors.sql", "020_version_text_once.sql", "023_version_text_functions.sql",
              "032_current_snapshot_readers.sql", "034_current_last_seen_readers.sql", "045_last_seen_readers.sql"]


def column_types(conn) -> dict[str, str]:
    return dict(conn.execute(
        "SELECT c.relname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " WHERE c.relname IN ('embeddings', 'dataset_vectors') AND a.attname = 'embedding'").fetchall())


def old_connection(url: str, sql_dir):
    """A connection to a database brought to the schema of ``sql_dir``'s migrations (those before
    sql/019), set up as store_db.prepare sets one up but for migrating (prepare would apply 019)."""
    from pgvector.psycopg import register_vector

    conn = psycopg.connect(url, autocommit=True)
    migrations.migrate(conn, sql_dir)
    register_vector(conn)
    return conn


OLD_VERSION_WRITER = """
CREATE FUNCTION test_version_text() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.title := coalesce(NEW.snapshot ->> 'title', '');
    NEW.description := coalesce(NEW.snapshot ->> 'description', '');
    RETURN NEW;
END $$;
CREATE TRIGGER test_version_text BEFORE INSERT OR UPDATE ON dataset_versions
    FOR EACH ROW EXECUTE FUNCTION test_version_text();
"""


def what_users_see(conn, portal_url: str, provider, queries: list[str], dataset_ids: list[int]) -> dict:
    """Search results (ids in order, scores to 3 places) of each query in each mode, alone and
    filtered; every version and change of ``dataset_ids``; the changes feed; the exported rows."""
    seen: dict = {"search": {}, "scores": {}}
    organization = conn.execute("SELECT organization FROM datasets WHERE organization IS NOT NULL"
                                " GROUP BY 1 ORDER BY count(*) DESC LIMIT 1").fetchone()[0]
    for query in queries:
        for mode in ("hybrid", "vector", "text"):
            for label, filters in (("none", None), ("portal", search.SearchFilters(portal_url=portal_url)),
                                   ("organization", search.SearchFilters(organization=organization))):
                result = search.search(conn, query, mode=mode, filters=filters, limit=10, provider=provider)
                key = f"{mode}/{label}/{query}"
                seen["search"][key] = [(i["portal_url"], i["source_id"]) for i in result.items]
                seen["scores"][key] = [i["score"] for i in result.items]
    seen["versions"] = {i: history.list_versions(conn, i) for i in dataset_ids}
    seen["changes"] = history.list_changes(conn, portal_url)
    with export.snapshot(conn):
        seen["export"] = [row for batch in export.dataset_batches(conn, include_removed=True, raw=True)
                          for row in batch]
    return seen


def store_current_snapshots(conn) -> None:
    """The code before sql/031 stored every current version's snapshot; today's writer leaves it to
    the dataset's row. Stored here as that code stored them, on the database it wrote."""
    from harvester.domain import changes as ch
    from harvester.store.staging import as_jsonb

    rows = conn.execute("SELECT v.dataset_id, d.title, d.description, d.raw FROM dataset_versions v"
                        " JOIN datasets d ON d.id = v.dataset_id WHERE v.is_current AND v.snapshot IS NULL").fetchall()
    with conn.cursor() as cur:
        cur.executemany("UPDATE dataset_versions SET snapshot = %s WHERE dataset_id = %s AND is_current",
                        [(as_jsonb(ch.snapshot(title, description, raw)), i) for i, title, description, raw in rows])


def unseen(versions: dict) -> dict:
    return {i: [{k: v for k, v in version.items() if k != "last_seen_at"} for version in vs]
            for i, vs in versions.items()}


def test_half_precision_keeps_what_users_see_and_the_next_run_builds_the_index(
        empty_database_url, portal_server, samples, gemini, tmp_path, monkeypatch):
    from harvester.embeddings import get_provider

    url = empty_database_url
    monkeypatch.setenv("HARVESTER_DATABASE_URL", url)
    before_019 = tmp_path / "sql"
    before_019.mkdir()
    for version, path in migrations.migration_files():
        # before 019, and the later ones that leave 019 and 020's tables alone but that today's
        # code (writing the old database here) reads: sql/021's embedding_failures, 024's staging_attempt
        # (023 follows 020, 032 reads its functions, 034 replaces 032's view, 045 034's)
        if version < 19 or (version > 20 and version not in (23, 32, 34, 45)):
            shutil.copy(path, before_019 / path.name)
    assert all((migrations.SQL_DIR / name).exists() for name in MIGRATIONS)

    records = distinct_records(samples, 60)
    portal_server.set_records(records)
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    later = (datetime.now(timezone.utc) + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S.%f")

    # -- written before sql/019: full precision, two runs (one editing five datasets) ------------
    with old_connection(url, before_019) as conn, old_connection(url, before_019) as reader:
        assert column_types(conn) == {"embeddings": "vector", "dataset_vectors": "vector"}
        # Before 020 the writer also filled a version's title and description columns, with the
        # strings its snapshot holds (store/history.write_history); today's writer leaves them to
        # 020's generated columns. Filled here as it filled them, on the schema it wrote to.
        conn.execute(OLD_VERSION_WRITER)
        pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider)
        for rec in records[:5]:
            edited = copy.deepcopy(rec)
            edited["title"] += " (revised)"
            edited["metadata_modified"] = later
            portal_server.upsert_record(edited)
        pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider)
        store_current_snapshots(conn)
        assert vectors.index_state(conn, provider.model) == "ready"
        ids = [r[0] for r in conn.execute("SELECT id FROM datasets WHERE source_id = ANY(%s) OR id < 4 ORDER BY id",
                                          ([r["id"] for r in records[:5]],))]
        queries = [records[0]["title"], records[7]["title"], "water quality", "saúde"]
        before = what_users_see(conn, portal.url, provider, queries, ids)
        counts = conn.execute("SELECT (SELECT count(*) FROM embeddings), (SELECT count(*) FROM dataset_vectors),"
                              " (SELECT count(*) FROM dataset_versions), (SELECT count(*) FROM dataset_changes)"
                              ).fetchone()
        full_precision = conn.execute("SELECT content_hash, embedding::real[] FROM embeddings").fetchall()
    assert counts[0] == 65 and counts[1] == 60 and counts[2] == 65
    assert any(len(v) == 2 for v in before["versions"].values())
    assert all(before["search"][f"vector/none/{q}"] for q in queries)

    # -- the migration -----------------------------------------------------------------------------
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TRIGGER test_version_text ON dataset_versions; DROP FUNCTION test_version_text()")
        assert migrations.migrate(conn) == MIGRATIONS
    with store_db.prepare(store_db.connect_url(url)) as conn, store_db.prepare(store_db.connect_url(url)) as reader:
        assert column_types(conn) == {"embeddings": "halfvec", "dataset_vectors": "halfvec"}
        # no columns: functions of the row compute them from the snapshot when read
        assert conn.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = 'dataset_versions'::regclass"
                            " AND attname IN ('title', 'description') AND NOT attisdropped").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_proc WHERE proname IN ('title', 'description')"
                            " AND proargtypes[0] = 'dataset_versions'::regtype").fetchone()[0] == 2
        assert conn.execute("SELECT (SELECT count(*) FROM embeddings), (SELECT count(*) FROM dataset_vectors),"
                            " (SELECT count(*) FROM dataset_versions), (SELECT count(*) FROM dataset_changes)"
                            ).fetchone() == counts
        # each vector rounded once: as near its full-precision value as half precision allows
        halves = dict(conn.execute("SELECT content_hash, embedding::vector::real[] FROM embeddings").fetchall())
        for content_hash, full in full_precision:
            half = halves[content_hash]
            assert max(abs(a - b) for a, b in zip(full, half)) <= 2 ** -11 * max(1.0, max(map(abs, full)))
        assert conn.execute(COPY_DRIFT, {"model": provider.model}).fetchone()[0] == 0
        # the index was dropped with the old column: searches rank by exact scans meanwhile
        assert vectors.index_state(conn, provider.model) == "missing"
        after = what_users_see(conn, portal.url, provider, queries, ids)
        assert after["search"] == before["search"]
        for key, scores in before["scores"].items():
            assert after["scores"][key] == pytest.approx(scores, abs=2e-3), key
        assert after["versions"] == before["versions"]
        assert after["changes"] == before["changes"]
        assert after["export"] == before["export"]

        # -- the next run: nothing re-embedded, the index built again, the same answers -------------
        texts_before = len(gemini.texts)  # (the searches embedded their queries)
        summary = pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider)
        assert summary["embedded"] == 0 and len(gemini.texts) == texts_before
        assert vectors.index_state(conn, provider.model) == "ready"
        again = what_users_see(conn, portal.url, provider, queries, ids)
        assert again["search"] == before["search"]
        assert unseen(again["versions"]) == unseen(before["versions"])  # the run saw them: last_seen_at moved

        # -- and an edit afterwards: stored in half precision, its history next to the old one ------
        edited = copy.deepcopy(records[0])
        edited["title"] += " (second revision)"
        edited["metadata_modified"] = (datetime.now(timezone.utc) + timedelta(minutes=10)).strftime(
            "%Y-%m-%dT%H:%M:%S.%f")
        portal_server.upsert_record(edited)
        pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider)
        first = conn.execute("SELECT id FROM datasets WHERE source_id = %s", (records[0]["id"],)).fetchone()[0]
        versions = history.list_versions(conn, first)
        assert [v["version_number"] for v in versions] == [3, 2, 1]
        # the versions from before the migration, unchanged but that they are no longer the current one
        assert unseen({first: versions[1:]}) == unseen({first: [{**v, "is_current": False}
                                                                 for v in before["versions"][first]]})
        assert conn.execute(COPY_DRIFT, {"model": provider.model}).fetchone()[0] == 0
        # its new vector, searched for, finds it first, through the rebuilt index and filtered (exact)
        own = conn.execute("SELECT e.embedding::vector::real[] FROM embeddings e JOIN datasets d"
                           " ON decode(d.content_hash, 'hex') = e.content_hash"
                           " AND e.model = (SELECT id FROM embedding_models WHERE name = %s) WHERE d.id = %s",
                           (provider.model, first)).fetchone()[0]
        for filters in (None, search.SearchFilters(portal_url=portal.url)):
            found = search.search(conn, "", mode="vector", limit=1, provider=provider, query_vector=own,
                                  filters=filters).items
            assert found[0]["source_id"] == records[0]["id"]


def test_embeddings_reindex_builds_a_missing_index_now(database_url, db, reader, portal_server, samples, gemini,
                                                        capsys):
    """What an operator runs after the migration rather than wait for the next run's upsert."""
    from harvester.cli.main import main
    from harvester.embeddings import get_provider

    portal_server.set_records(distinct_records(samples, 12))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    assert vectors.drop_index(db, provider.model) and vectors.index_state(db, provider.model) == "missing"

    assert main(["embeddings", "reindex"]) == 0
    assert capsys.readouterr().out.strip() == f"{provider.model}: index built over 12 vectors"
    assert vectors.index_state(db, provider.model) == "ready"
    assert main(["embeddings", "reindex", "--model", provider.model]) == 0
    assert capsys.readouterr().out.strip() == f"{provider.model}: index ready"
    assert main(["embeddings", "reindex", "--model", "no-such-model"]) == 2
    assert "no vector of model 'no-such-model' is stored" in capsys.readouterr().err


# 020 as it was first written (PostgreSQL 18 only), which databases on 18 applied; 023 follows it.
VIRTUAL_020 = """
UPDATE dataset_versions
SET snapshot = snapshot || jsonb_build_object('title', title, 'description', description)
WHERE snapshot ->> 'title' IS DISTINCT FROM title OR snapshot ->> 'description' IS DISTINCT FROM description;
DROP VIEW current_datasets;
ALTER TABLE dataset_versions DROP COLUMN title, DROP COLUMN description;
ALTER TABLE dataset_versions
    ADD COLUMN title text GENERATED ALWAYS AS (coalesce(snapshot ->> 'title', '')) VIRTUAL,
    ADD COLUMN description text GENERATED ALWAYS AS (coalesce(snapshot ->> 'description', '')) VIRTUAL;
ALTER TABLE dataset_versions ALTER COLUMN first_seen_at TYPE timestamptz USING first_seen_at + interval '0';
CREATE VIEW current_datasets AS
SELECT d.id AS dataset_id, d.portal_url, d.source_id, d.name, d.url,
       v.version_number, v.title, v.description, v.content_hash, v.metadata_hash, v.snapshot,
       v.change_type, v.first_seen_at AS version_first_seen_at, v.last_seen_at AS version_last_seen_at,
       d.first_seen_at, d.last_seen_at
FROM datasets d
JOIN dataset_versions v ON v.dataset_id = d.id AND v.is_current
WHERE d.removed_at IS NULL;
"""


def test_a_database_that_applied_the_virtual_columns_reaches_the_same_schema(
        empty_database_url, portal_server, samples, gemini, tmp_path, monkeypatch):
    """On PostgreSQL 18, 020's first text made title and description VIRTUAL generated columns; 023
    drops them for the functions 020 now creates: every reader sees the same titles and descriptions
    (the history, the current_datasets view, SQL naming `v.title`), and the schema is the one a new
    database gets on any version."""
    from harvester.embeddings import get_provider

    version = psycopg.connect(empty_database_url, autocommit=True).execute("SHOW server_version_num").fetchone()[0]
    assert int(version) >= 180000, "VIRTUAL generated columns: this test needs PostgreSQL 18 (the embedded server)"
    url = empty_database_url
    monkeypatch.setenv("HARVESTER_DATABASE_URL", url)
    before = tmp_path / "sql"
    before.mkdir()
    for number, path in migrations.migration_files():
        if number not in (23, 32, 34, 45):  # (after it: today's code, writing here, reads them; 032 reads 023's)
            (before / path.name).write_text(VIRTUAL_020 if number == 20 else path.read_text())
    records = distinct_records(samples, 20)
    portal_server.set_records(records)
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    with old_connection(url, before) as conn, old_connection(url, before) as reader:
        pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider)
        edited = copy.deepcopy(records[3])
        edited["title"] += " (revised)"
        edited["metadata_modified"] = (datetime.now(timezone.utc) + timedelta(minutes=5)).strftime(
            "%Y-%m-%dT%H:%M:%S.%f")
        portal_server.upsert_record(edited)
        pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider)
        store_current_snapshots(conn)
        ids = [r[0] for r in conn.execute("SELECT id FROM datasets ORDER BY id")]
        versions = {i: history.list_versions(conn, i) for i in ids}
        view = conn.execute("SELECT dataset_id, version_number, title, description, content_hash FROM current_datasets"
                            " ORDER BY dataset_id").fetchall()
        named = conn.execute("SELECT v.dataset_id, v.version_number, v.title, v.description"
                             " FROM dataset_versions v ORDER BY 1, 2").fetchall()
    assert len(named) == 21 and {r[2] for r in named} >= {records[3]["title"], edited["title"]}

    with psycopg.connect(url, autocommit=True) as conn:
        assert migrations.migrate(conn) == ["023_version_text_functions.sql", "032_current_snapshot_readers.sql",
                                            "034_current_last_seen_readers.sql", "045_last_seen_readers.sql"]
        assert conn.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = 'dataset_versions'::regclass"
                            " AND attname IN ('title', 'description') AND NOT attisdropped").fetchone()[0] == 0
        assert conn.execute("SELECT dataset_id, version_number, title, description, content_hash FROM current_datasets"
                            " ORDER BY dataset_id").fetchall() == view
        assert conn.execute("SELECT v.dataset_id, v.version_number, v.title, v.description"
                            " FROM dataset_versions v ORDER BY 1, 2").fetchall() == named
    with store_db.prepare(store_db.connect_url(url)) as conn:
        assert {i: history.list_versions(conn, i) for i in ids} == versions
        assert history.get_version(conn, ids[3], 2)["title"] == edited["title"]
