"""Bulk vector loads and the shared index: a run that brings many vectors while its model has no
HNSW index yet (a first sync, a model switch) writes them with no index, and an upsert builds it
once, concurrently (nobody waits for it); a model's index, once there, is never dropped or rebuilt
by a run, whatever it brings. Real PostgreSQL + pgvector, the local CKAN portal, the real
google-genai SDK against the local Gemini-protocol server."""
import contextlib
import logging
import threading
import time

import psycopg
import pytest
from pgvector.psycopg import register_vector

from harvester.pipeline import steps as pipeline
from harvester.config.portals import Portal
from harvester.store import vectors
from harvester.store.vectors import IndexSettings, bulk_load_wanted

from harvester.testing.samples import distinct_records

MODEL = "gemini-embedding-001@768"


# -- the decision (pure) ---------------------------------------------------------------------------
@pytest.mark.parametrize("held, incoming, wanted", [
    (0, 10000, True),          # a first sync
    (0, 9999, False),          # under bulk_min: the live index takes them
    (30000, 10000, True),      # a quarter of what the index will hold
    (30001, 10000, False),     # less than a quarter: inserting is cheaper than building it all again
    (400000, 12000, False),
    (0, 0, False),
])
def test_bulk_when_the_run_brings_at_least_a_quarter_of_the_index(held, incoming, wanted):
    assert bulk_load_wanted(held, incoming, IndexSettings()) is wanted


def test_bulk_min_zero_still_needs_something_to_load():
    assert bulk_load_wanted(0, 0, IndexSettings(bulk_min=0)) is False
    assert bulk_load_wanted(0, 1, IndexSettings(bulk_min=0)) is True


@pytest.mark.parametrize("env, named", [
    ({"HARVESTER_INDEX_BULK_MIN": "many"}, "HARVESTER_INDEX_BULK_MIN='many'"),
    ({"HARVESTER_INDEX_BULK_SHARE": "1.5"}, "HARVESTER_INDEX_BULK_SHARE='1.5'"),
    ({"HARVESTER_INDEX_BUILD_MEMORY": "lots"}, "HARVESTER_INDEX_BUILD_MEMORY='lots'"),
    ({"HARVESTER_INDEX_BUILD_WORKERS": "-1"}, "HARVESTER_INDEX_BUILD_WORKERS='-1'"),
])
def test_bad_settings_name_the_variable(env, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        IndexSettings.from_env(env)


def test_settings_from_the_environment():
    got = IndexSettings.from_env({"HARVESTER_INDEX_BULK_MIN": "5", "HARVESTER_INDEX_BULK_SHARE": "0.5",
                                  "HARVESTER_INDEX_BUILD_MEMORY": "256MB", "HARVESTER_INDEX_BUILD_WORKERS": "0"})
    assert got == IndexSettings(bulk_min=5, bulk_share=0.5, build_memory="256MB", build_workers=0)


# -- in runs ---------------------------------------------------------------------------------------
def model_indexes(db) -> dict[str, str]:
    """index name -> its model, for the HNSW indexes on embeddings."""
    return vectors.model_indexes(db)


def index_oid(db, model):
    row = db.execute("SELECT to_regclass(%s)::oid", (vectors.index_name(model),)).fetchone()
    return row[0]


def found_by_the_halfvec_index(db, up_to: int) -> int:
    """How many vectors of MODEL a scan of its halfvec HNSW index yields (at most ``up_to``)."""
    with db.transaction():
        db.execute("SET LOCAL enable_seqscan = off")
        db.execute(f"SET LOCAL hnsw.ef_search = {int(up_to)}")
        probe = db.execute("SELECT embedding::vector(768)::real[] FROM embeddings LIMIT 1").fetchone()[0]
        return db.execute("SELECT count(*) FROM (SELECT 1 FROM embeddings WHERE model ="
                          " (SELECT id FROM embedding_models WHERE name = %s)"
                          " ORDER BY embedding::halfvec(768) <=> %s::halfvec(768) LIMIT %s) t",
                          (MODEL, probe, up_to)).fetchone()[0]


def steps(db, reader, portal, provider, full_sync=False):
    """A run step by step (what the DAG's tasks do), returning hash_compare's plan; stops before upsert."""
    run_id = pipeline.begin(db, portal, full_sync=full_sync)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, pipeline.source_for(portal))
    planned = pipeline.hash_compare(db, reader, portal, run_id, provider.model)
    return run_id, planned


def test_a_first_sync_loads_without_the_index_and_builds_it_once(db, reader, portal_server, samples, gemini,
                                                                monkeypatch, caplog):
    from harvester.embeddings import get_provider
    from harvester.store import runs

    monkeypatch.setenv("HARVESTER_INDEX_BULK_MIN", "100")
    portal_server.set_records(distinct_records(samples, 250))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()

    caplog.set_level(logging.INFO, logger="harvester")
    run_id, planned = steps(db, reader, portal, provider)
    assert planned["pending_texts"] == 250 and planned["bulk_index"] is True
    assert all(work["bulk_index"] for work in planned["embed_shards"])
    assert "bulk load: 250 texts to embed against 0 vectors" in caplog.text
    assert [r.run_id for r in runs.bulk_loads_running(db, MODEL)] == [run_id]

    for work in planned["embed_shards"]:
        pipeline.embed_changed(db, reader, portal, run_id, provider, shard=work["shard"], shards=work["shards"],
                               bulk_index=True)
    assert db.execute("SELECT count(*) FROM embeddings WHERE model ="
                      " (SELECT id FROM embedding_models WHERE name = %s)", (MODEL,)).fetchone()[0] == 250
    assert model_indexes(db) == {}, "vectors were written with no index to keep up"

    stats = pipeline.upsert(db, portal, run_id, provider.model, provider.max_batch)
    assert (stats["created"], stats["embedded"]) == (250, 250)
    assert model_indexes(db) == {vectors.index_name(MODEL): MODEL}
    assert vectors.index_state(db, MODEL) == "ready"
    assert runs.bulk_loads_running(db, MODEL) == []
    probe = db.execute("SELECT embedding::vector(768)::real[] FROM embeddings LIMIT 1").fetchone()[0]
    plan = vectors.explain_search(db, MODEL, 768, probe)
    assert f"Index Scan using {vectors.index_name(MODEL)}" in plan, plan
    # the index holds every vector: an index scan finds as many as the table has
    with db.transaction():
        db.execute("SET LOCAL hnsw.ef_search = 400")
        found = db.execute("SELECT count(*) FROM (SELECT 1 FROM embeddings WHERE model ="
                           " (SELECT id FROM embedding_models WHERE name = %s)"
                           " ORDER BY embedding::vector(768) <=> %s::vector(768) LIMIT 300) t",
                           (MODEL, probe)).fetchone()[0]
    assert found == 250

    # A small run afterwards inserts into the live index: the same index (same oid), not dropped.
    oid = index_oid(db, MODEL)
    records = distinct_records(samples, 260)
    portal_server.set_records(records)
    run_id, planned = steps(db, reader, portal, provider, full_sync=True)
    assert planned["pending_texts"] == 10 and planned["bulk_index"] is False
    pipeline.embed_changed(db, reader, portal, run_id, provider, bulk_index=False)
    pipeline.upsert(db, portal, run_id, provider.model, provider.max_batch)
    assert index_oid(db, MODEL) == oid
    assert db.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 260


def test_a_model_that_has_its_index_keeps_it_whatever_a_run_brings(db, reader, portal_server, samples, gemini,
                                                                  monkeypatch):
    """The index is every portal's: a new portal bringing five times what it holds inserts into it."""
    from harvester.testing.ckan_portal import DemoPortal
    from harvester.embeddings import get_provider

    monkeypatch.setenv("HARVESTER_INDEX_BULK_MIN", "10")
    records = distinct_records(samples, 300)
    portal_server.set_records(records[:50])
    small = Portal(name="small", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    pipeline.harvest(db, reader, small, pipeline.source_for(small), provider)
    oid = index_oid(db, MODEL)
    assert oid is not None and vectors.index_state(db, MODEL) == "ready"

    big_server = DemoPortal(records=records[50:])
    big_server.start()
    try:
        big = Portal(name="big", url=big_server.base_url, politeness_delay=0)
        run_id, planned = steps(db, reader, big, provider)
        assert planned["pending_texts"] == 250 and planned["bulk_index"] is False
        assert index_oid(db, MODEL) == oid
        pipeline.embed_changed(db, reader, big, run_id, provider)
        pipeline.upsert(db, big, run_id, provider.model, provider.max_batch)
    finally:
        big_server.stop()
    assert index_oid(db, MODEL) == oid, "the shared index was never dropped"
    assert found_by_the_halfvec_index(db, 400) == 300


def test_a_bulk_load_during_a_change_of_kind_keeps_the_old_index_serving_and_says_so(
        db, reader, portal_server, samples, gemini, monkeypatch, caplog):
    """HARVESTER_INDEX_KIND changed while a run brings many vectors: the model has no index of the new
    kind, so the run is a bulk load, but the index of the old kind is there: it serves searches and
    takes the run's vectors until the upsert has built the new one, which then replaces it."""
    from harvester.embeddings import get_provider

    monkeypatch.setenv("HARVESTER_INDEX_BULK_MIN", "100")
    records = distinct_records(samples, 400)
    portal_server.set_records(records[:150])
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    halfvec_index = vectors.index_name(MODEL, "halfvec")
    assert model_indexes(db) == {halfvec_index: MODEL}

    monkeypatch.setenv("HARVESTER_INDEX_KIND", "bit")
    portal_server.set_records(records)
    caplog.set_level(logging.INFO, logger="harvester")
    caplog.clear()
    run_id, planned = steps(db, reader, portal, provider, full_sync=True)
    assert planned["pending_texts"] == 250 and planned["bulk_index"] is True
    assert ("bulk load: 250 texts to embed against 150 vectors of gemini-embedding-001@768 held, which has no "
            "bit index yet (HARVESTER_INDEX_KIND): its halfvec index serves searches") in caplog.text
    assert "which has no HNSW index yet" not in caplog.text
    pipeline.embed_changed(db, reader, portal, run_id, provider, bulk_index=True)
    assert ("without upkeep of the bit index the upsert builds; its halfvec index, serving searches until then, "
            "takes them") in caplog.text
    assert "without index upkeep" not in caplog.text
    assert model_indexes(db) == {halfvec_index: MODEL}, "nothing dropped while the run loads"
    assert vectors.search_kind(db, MODEL) == "halfvec"
    assert found_by_the_halfvec_index(db, 500) == 400, "the old index took the run's vectors"

    pipeline.upsert(db, portal, run_id, provider.model, provider.max_batch)
    assert model_indexes(db) == {vectors.index_name(MODEL, "bit"): MODEL}
    assert vectors.search_kind(db, MODEL) == "bit" and vectors.index_state(db, MODEL) == "ready"


def test_a_model_switch_is_a_bulk_load_and_leaves_the_other_models_index_alone(
        db, reader, portal_server, samples, gemini, monkeypatch):
    from harvester.embeddings import get_provider

    monkeypatch.setenv("HARVESTER_INDEX_BULK_MIN", "100")
    portal_server.set_records(distinct_records(samples, 150))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    first = get_provider()
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), first)
    old_oid = index_oid(db, first.model)
    assert old_oid is not None

    monkeypatch.setenv("GEMINI_EMBEDDING_DIMENSION", "256")  # another model identity: ...@256
    second = get_provider()
    assert second.model != first.model
    run_id, planned = steps(db, reader, portal, second)
    assert planned["pending_texts"] == 150 and planned["bulk_index"] is True
    assert index_oid(db, first.model) == old_oid, "another model's index is not touched"
    pipeline.embed_changed(db, reader, portal, run_id, second, bulk_index=True)
    pipeline.upsert(db, portal, run_id, second.model, second.max_batch)
    assert model_indexes(db) == {vectors.index_name(first.model): first.model,
                                 vectors.index_name(second.model): second.model}
    assert index_oid(db, first.model) == old_oid


def test_a_run_that_fails_during_a_bulk_load_gets_its_index_back_from_the_next_run(
        db, reader, portal_server, samples, gemini, monkeypatch):
    from harvester.embeddings import get_provider

    monkeypatch.setenv("HARVESTER_INDEX_BULK_MIN", "100")
    portal_server.set_records(distinct_records(samples, 250))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    gemini.fail_next(1, status=None)   # one batch goes through...
    gemini.fail_next(1, status=401)    # ...then the key is refused: the run fails
    with pytest.raises(Exception, match="API key"):
        pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    assert model_indexes(db) == {}
    kept = db.execute("SELECT count(*) FROM embeddings WHERE model ="
                      " (SELECT id FROM embedding_models WHERE name = %s)", (MODEL,)).fetchone()[0]
    # the vectors paid for are kept (with requests in flight together, the last batch may have landed too)
    assert 100 <= kept < 250

    # Under bulk_min now: the next run inserts into an index it builds first over the vectors
    # kept, and its commit leaves every vector indexed.
    monkeypatch.setenv("HARVESTER_INDEX_BULK_MIN", "1000")
    stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), get_provider())
    assert (stats["created"], stats["embedded"]) == (250, 250 - kept)
    assert model_indexes(db) == {vectors.index_name(MODEL): MODEL}


def wait_for(what, check, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextlib.contextmanager
def old_snapshot(database_url):
    """A transaction holding a snapshot: a concurrent index build cannot end before it does."""
    with psycopg.connect(database_url) as blocker:
        blocker.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        blocker.execute("SELECT count(*) FROM sync_runs").fetchone()
        yield blocker
        blocker.rollback()


def backend_waiting(database_url, pid) -> bool:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                            (pid,)).fetchone() == (True,)


def test_the_index_is_built_concurrently_during_the_merge_and_the_commit_does_not_wait_for_it(
        db, reader, database_url, portal_server, samples, gemini, monkeypatch):
    """While the build is under way (held up here by an old snapshot), the run commits, other
    writers store vectors and searches run: nobody waits for the build but the upsert that started
    it, after its commit."""
    from harvester.embeddings import get_provider
    from harvester.store import runs

    monkeypatch.setenv("HARVESTER_INDEX_BULK_MIN", "100")
    portal_server.set_records(distinct_records(samples, 150))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    run_id, planned = steps(db, reader, portal, provider)
    assert planned["bulk_index"] is True
    pipeline.embed_changed(db, reader, portal, run_id, provider, bulk_index=True)
    second = lambda: contextlib.nullcontext(reader)  # noqa: E731

    # A bad setting fails the upsert before anything is committed.
    monkeypatch.setenv("HARVESTER_INDEX_BUILD_MEMORY", "lots")
    with pytest.raises(ValueError, match="HARVESTER_INDEX_BUILD_MEMORY"):
        pipeline.upsert(db, portal, run_id, provider.model, provider.max_batch, open_connection=second)
    monkeypatch.delenv("HARVESTER_INDEX_BUILD_MEMORY")
    assert runs.get(db, run_id).status == "running"
    assert db.execute("SELECT count(*) FROM datasets").fetchone()[0] == 0 and model_indexes(db) == {}

    out, errors = {}, []
    with old_snapshot(database_url):
        def upsert():
            try:
                out.update(pipeline.upsert(db, portal, run_id, provider.model, provider.max_batch,
                                           open_connection=second))
            except Exception as exc:  # surfaced below
                errors.append(exc)

        thread = threading.Thread(target=upsert)
        thread.start()
        with psycopg.connect(database_url, autocommit=True) as other:
            wait_for("the run's commit", lambda: other.execute(
                "SELECT status FROM sync_runs WHERE run_id = %s", (run_id,)).fetchone()[0] == "committed")
            assert other.execute("SELECT count(*) FROM datasets").fetchone()[0] == 150
            wait_for("the build waiting for the old snapshot", lambda: backend_waiting(database_url,
                                                                                      reader.info.backend_pid))
            assert vectors.index_state(other, MODEL) == "building"
            assert thread.is_alive(), "upsert waits for the build it started, after its commit"
            # Meanwhile another portal's vectors go in and searches run, without waiting.
            other.execute("SET lock_timeout = '2s'")
            register_vector(other)
            vectors.write(other, MODEL, 768, ["f" * 64], [[0.5] * 768])
            probe = other.execute("SELECT embedding::vector(768)::real[] FROM embeddings LIMIT 1").fetchone()[0]
            assert other.execute("SELECT count(*) FROM (SELECT 1 FROM embeddings WHERE model ="
                                 " (SELECT id FROM embedding_models WHERE name = %s)"
                                 " ORDER BY embedding::halfvec(768) <=> %s::halfvec(768) LIMIT 5) t",
                                 (MODEL, probe)).fetchone()[0] == 5
    thread.join(60)
    assert not thread.is_alive() and not errors, errors
    assert (out["created"], out["embedded"]) == (150, 150)
    assert model_indexes(db) == {vectors.index_name(MODEL): MODEL}
    assert vectors.index_state(db, MODEL) == "ready"


def test_a_build_that_fails_leaves_the_run_committed_and_the_next_upsert_builds_it(
        db, reader, database_url, portal_server, samples, gemini, monkeypatch, caplog):
    from harvester.embeddings import get_provider

    monkeypatch.setenv("HARVESTER_INDEX_BULK_MIN", "100")
    monkeypatch.setenv("HARVESTER_INDEX_BUILD_TIMEOUT_SECS", "1")
    portal_server.set_records(distinct_records(samples, 150))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    caplog.set_level(logging.INFO, logger="harvester")
    with old_snapshot(database_url):  # the build cannot end in its second
        stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    assert stats["created"] == 150
    assert "the HNSW index of gemini-embedding-001@768 was not built: IndexBuildError" in caplog.text
    assert "HARVESTER_INDEX_BUILD_TIMEOUT_SECS=1" in caplog.text
    assert model_indexes(db) == {}, "the invalid index the build left is dropped"

    monkeypatch.delenv("HARVESTER_INDEX_BUILD_TIMEOUT_SECS")
    stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    assert stats["embedded"] == 0
    assert vectors.index_state(db, MODEL) == "ready"


def test_an_index_another_connection_is_building_is_left_to_it(db, database_url):
    """A second upsert (or the retry of a killed one) does not build again nor wait: the build
    under way is the one that counts."""
    vectors.write(db, MODEL, 8, [f"{i:064x}" for i in range(20)], [[float(i + 1)] * 8 for i in range(20)])
    errors = []
    with psycopg.connect(database_url, autocommit=True) as builder:
        def build():
            try:
                vectors.ensure_index(builder, MODEL, 8)
            except Exception as exc:  # surfaced below
                errors.append(exc)

        with old_snapshot(database_url):
            thread = threading.Thread(target=build)
            thread.start()
            wait_for("the build to start", lambda: vectors.index_state(db, MODEL) == "building")
            started = time.monotonic()
            assert vectors.restore_index(db, MODEL) is False
            assert vectors.index_missing(db, MODEL) is None
            assert time.monotonic() - started < 5
        thread.join(60)
    assert not errors, errors
    assert vectors.index_state(db, MODEL) == "ready"


@pytest.fixture
def two_bulk_loads(db, reader, portal_server, samples, gemini, monkeypatch):
    """Two portals' first syncs of one model at once, both bulk loads, embedded and not upserted:
    (portal a, portal b, run of a, run of b, the provider)."""
    from harvester.testing.ckan_portal import DemoPortal
    from harvester.embeddings import get_provider

    monkeypatch.setenv("HARVESTER_INDEX_BULK_MIN", "50")
    records = distinct_records(samples, 200)
    portal_server.set_records(records[:100])
    other_server = DemoPortal(records=records[100:])
    other_server.start()
    try:
        a = Portal(name="a", url=portal_server.base_url, politeness_delay=0)
        b = Portal(name="b", url=other_server.base_url, politeness_delay=0)
        provider = get_provider()
        run_a, plan_a = steps(db, reader, a, provider)
        run_b, plan_b = steps(db, reader, b, provider)
        assert plan_a["bulk_index"] is True and plan_b["bulk_index"] is True
        pipeline.embed_changed(db, reader, a, run_a, provider, bulk_index=True)
        pipeline.embed_changed(db, reader, b, run_b, provider, bulk_index=True)
        yield a, b, run_a, run_b, provider
    finally:
        other_server.stop()


def test_the_last_bulk_load_still_running_builds_the_index(db, two_bulk_loads, caplog):
    """Two first syncs of one model at once: the first to commit leaves the index to the other,
    whose upsert builds it once over both portals' vectors."""
    a, b, run_a, run_b, provider = two_bulk_loads
    caplog.set_level(logging.INFO, logger="harvester")
    pipeline.upsert(db, b, run_b, provider.model, provider.max_batch)
    assert model_indexes(db) == {}
    assert f"the HNSW index of {MODEL} is left to the bulk load still running (run {run_a} of a)" in caplog.text
    pipeline.upsert(db, a, run_a, provider.model, provider.max_batch)
    assert f"built the HNSW index {vectors.index_name(MODEL)} over the 200 vectors of {MODEL}" in caplog.text
    assert vectors.index_state(db, MODEL) == "ready"


def test_bulk_loads_whose_upserts_overlap_leave_the_index_to_the_last_to_commit(
        db, database_url, two_bulk_loads, caplog):
    """b's upsert begins while a is still running and a's while b is: each leaves the index to the
    other. a commits first; b, committing last, finds no bulk load running any more and builds it."""
    a, b, run_a, run_b, provider = two_bulk_loads
    errors = []
    caplog.set_level(logging.INFO, logger="harvester")
    with psycopg.connect(database_url) as blocker:
        # b's upsert decides about the index, then waits for its run's row to begin its merge
        blocker.execute("SELECT 1 FROM sync_runs WHERE run_id = %s FOR UPDATE", (run_b,))

        def upsert_b():
            from harvester.store import db as store_db

            try:
                with store_db.open_cli() as conn:
                    pipeline.upsert(conn, b, run_b, provider.model, provider.max_batch)
            except Exception as exc:  # surfaced below
                errors.append(exc)

        thread = threading.Thread(target=upsert_b)
        thread.start()
        wait_for("b's upsert to wait for its row", lambda: db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND application_name LIKE 'harvester cli%%'").fetchone()[0] == 1)
        pipeline.upsert(db, a, run_a, provider.model, provider.max_batch)  # b is running: a leaves it
        assert model_indexes(db) == {}
        blocker.rollback()
    thread.join(60)
    assert not errors, errors
    assert f"left to the bulk load still running (run {run_a} of a)" in caplog.text
    assert f"left to the bulk load still running (run {run_b} of b)" in caplog.text
    assert vectors.index_state(db, MODEL) == "ready", "the last upsert to commit built it"


def test_upsert_builds_a_missing_index_even_when_nothing_is_left_to_embed(db, reader, portal_server, samples, gemini,
                                                                          monkeypatch):
    from harvester.embeddings import get_provider

    portal_server.set_records(distinct_records(samples, 120))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    vectors.drop_index(db, provider.model)  # as a bulk load that failed after the embedding leaves it
    stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    assert stats["embedded"] == 0
    assert model_indexes(db) == {vectors.index_name(MODEL): MODEL}


def test_through_airflow_every_mapped_shard_loads_without_the_index(harvest, portal_server, db, samples, gemini,
                                                                     monkeypatch, caplog):
    """hash_compare's plan reaches each mapped embed_changed task through XCom; upsert builds the index."""
    monkeypatch.setenv("HARVESTER_INDEX_BULK_MIN", "100")
    monkeypatch.setenv("HARVESTER_EMBED_SHARD_SIZE", "100")
    portal_server.set_records(distinct_records(samples, 250))
    harvest.configure(portal_server.base_url)
    caplog.set_level(logging.INFO, logger="harvester")
    dag_run = harvest.run()
    assert dag_run.state == "success"
    # upsert found no index (no shard made one) and built it over all 250 vectors
    assert f"built the HNSW index {vectors.index_name(MODEL)} over the 250 vectors of {MODEL}" in caplog.text
    states = harvest.task_states(dag_run)
    assert [k for k in states if k[0] == "embed_changed"] == [("embed_changed", i) for i in range(3)]
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(XComModel).filter_by(run_id=dag_run.run_id, dag_id=dag_run.dag_id,
                                                 task_id="hash_compare", key="return_value").one()
        work = XComModel.deserialize_value(row)
    assert [w["bulk_index"] for w in work] == [True, True, True]
    assert db.execute("SELECT count(*) FROM embeddings").fetchone()[0] == 250
    assert model_indexes(db) == {vectors.index_name(MODEL): MODEL}


def test_embed_changed_trusts_a_plan_of_nothing_to_embed(db, reader, portal_server, samples, gemini):
    """hash_compare's count of zero pending texts spares embed_changed a second pass over the portal
    (a no-change run of a large portal); any other count, or none, is looked for again."""
    from harvester.embeddings import get_provider

    portal_server.set_records(distinct_records(samples, 20))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    run_id, planned = steps(db, reader, portal, provider)
    assert planned["pending_texts"] == 20
    # a plan of none is taken at its word: no query, no request (here it was not true: 20 were pending)
    skipped = pipeline.embed_changed(db, reader, portal, run_id, provider, planned=0)
    assert (skipped["embedding_requests"], skipped["embedded"]) == (0, 0)
    assert not gemini.requests
    done = pipeline.embed_changed(db, reader, portal, run_id, provider, planned=planned["pending_texts"])
    assert done["embedded"] == 20


def test_the_upsert_waits_for_its_build_no_longer_than_its_task_may_run(
        db, reader, database_url, portal_server, samples, gemini, monkeypatch, caplog):
    """A build that outlasts what the task's execution_timeout leaves (a million vectors) is left to
    the server at that deadline: the upsert returns, the run committed, and the build ends by itself."""
    import time

    from harvester.embeddings import get_provider

    monkeypatch.setenv("HARVESTER_INDEX_BULK_MIN", "100")
    monkeypatch.setenv("HARVESTER_INDEX_BUILD_WAIT_SECS", "30")  # (a wait past the deadline fails, not hangs)
    portal_server.set_records(distinct_records(samples, 150))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    run_id, planned = steps(db, reader, portal, provider)
    pipeline.embed_changed(db, reader, portal, run_id, provider, bulk_index=True)
    second = lambda: contextlib.nullcontext(reader)  # noqa: E731
    caplog.set_level(logging.INFO, logger="harvester")
    with old_snapshot(database_url):  # the build cannot end while this is held
        started = time.monotonic()
        out = pipeline.upsert(db, portal, run_id, provider.model, provider.max_batch, open_connection=second,
                              wait_deadline=time.monotonic() + 3)
        took = time.monotonic() - started
        assert out["created"] == 150
        assert took < 20, f"the upsert waited {took:.0f}s, past its deadline of 3 s"
        assert vectors.index_state(db, MODEL) == "building"
    assert "waiting at most" in caplog.text and "the task's execution_timeout leaves no more" in caplog.text
    assert "is still being built after" in caplog.text
    wait_for("the build, left to the server, to end", lambda: vectors.index_state(db, MODEL) == "ready")
