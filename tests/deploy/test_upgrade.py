"""An upgrade keeps everything (issue 37): a database made and harvested by the code before the last
migrations (testing/upgrade.OLD_COMMIT, extracted with `git archive`, run with this venv), with DAG
runs in flight under a real scheduler (testing/airflow_cluster.py: scheduler, dag-processor and
api-server as processes, LocalExecutor, every task its own process), is upgraded the way an operator
does it: the cluster's processes are stopped (SIGTERM, then SIGKILL after 20 s: the running tasks
die with them, as with `docker compose up -d` and a new image; none of them is left running), the code in the dags and plugins
folders is replaced by this checkout's, and the processes start again. The first task of today's
code applies the migrations (store/db.prepare -> migrations.migrate) while other runs are mid-way.

In flight at the upgrade (the test waits for this state): slow_list's fetch_modified mid-listing
(its portal answers each page of 10 after 8 s; 2 of 6 pages served: the listing would outlast the
20 s between SIGTERM and SIGKILL), slow_embed's embed_changed with its embedding request unanswered
(the Gemini stand-in answers after 40 s; the run's fetch, reconcile and hash_compare staged its
records with the old code), and a second slow_embed DAG run queued behind it (max_active_runs=1);
two portals (steady_a, steady_b) idle.

Retries are the production defaults (HARVESTER_TASK_RETRIES=3, HARVESTER_TASK_RETRY_DELAY_SECS=30,
exponential backoff), not the conftest's 0 for dag.test(): a task killed by the upgrade is retried,
as operators get it: a task killed by the upgrade fails that try, and its next one runs today's code.

Checked: every DAG run ends in success (those in flight at the upgrade and one queued behind it);
schema_migrations holds every migration of today's sql/; nothing the old code stored is lost
(datasets, versions, changes, search rows, runs, vectors: every row still there with the same
values, vectors within half precision since 019 makes them halfvec; the portals in flight keep
every dataset and every earlier version); today's history readers give each version the title and
description the old code stored (020 drops those columns); today's search answers the old code's
queries as it did (text, vector and hybrid; ties within half precision may trade places); the
portals in flight end equal to their source; a run of today's code on the upgraded data succeeds,
its versions numbered on from the old ones, and a bad record becomes a record outcome (the old code
kept no record outcomes: 017 adds them).
"""
from __future__ import annotations

import copy
import shutil
import time
from datetime import datetime, timezone

import psycopg
import pytest

from harvester.testing.airflow_cluster import AirflowCluster, alive, harvester_env, write_portals
from harvester.testing.gemini import TEST_KEY as GEMINI_KEY
from harvester.testing.samples import load_samples
from harvester.testing.upgrade import (ROOT, compare_answers, compare_rows, content, deploy,
                                       extract_old_code, migrations_in, search_answers)

pytestmark = pytest.mark.slow  # a real Airflow cluster, twice

RUN_TIMEOUT = 420  # a run killed by the upgrade waits out its retry delay (30 s, then 60 s) and Airflow's reset
STEADY = ("steady_a", "steady_b")  # harvested twice by the old code, not touched by the runs in flight
SLOW_LIST, SLOW_EMBED = "slow_list", "slow_embed"  # harvested by the old code, then in flight at the upgrade
RECORDS = 40
TOPICS = ("water quality", "air pollution", "public transport", "school enrolment", "housing prices",
          "crime statistics", "energy consumption", "bird survey", "road traffic", "library loans")
QUERIES = ["water quality", "bird survey", "public transport steady_a", "energy consumption edition r2",
           "library loans", "housing"]
# Production's retries (config/settings.py defaults), said out loud: the cluster inherits nothing.
PRODUCTION_RETRIES = {"HARVESTER_TASK_RETRIES": "3", "HARVESTER_TASK_RETRY_DELAY_SECS": "30"}


def now_ckan() -> str:
    return datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="microseconds")


class Catalogue:
    def __init__(self):
        self.bases = [r for r in load_samples("catalog-data-gov.jsonl") if isinstance(r.get("id"), str)]

    def record(self, portal: str, i: int, edition: str) -> dict:
        topic = TOPICS[i % len(TOPICS)]
        rec = copy.deepcopy(self.bases[i % len(self.bases)])
        rec.pop("extras", None)  # no identifiers shared between portals: no duplicate groups
        rec.update({
            "id": f"{portal}-{i:04d}", "name": f"{portal}-{i:04d}", "state": "active", "private": False,
            "title": f"{topic.capitalize()} {portal} edition {edition} number {i}",
            "notes": f"Figures on {topic} published by the {portal} office, edition {edition}, series {i}.",
            "url": f"https://{portal}.example.org/data/{i}",
            "metadata_modified": now_ckan(),
        })
        return rec

    @staticmethod
    def bad(portal: str, i: int) -> dict:
        """A record every version refuses: no name, no title."""
        return {"id": f"{portal}-bad-{i}", "state": "active", "private": False, "metadata_modified": now_ckan(),
                "notes": "no title, no name"}


def dag(name: str) -> str:
    return f"harvest_{name}"


def snapshot(db_url: str, steady_urls: list[str]) -> dict:
    """What the upgrade must keep, read with SQL alone (the same reader before and after)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        steady = "WHERE t.portal_url = ANY(%s)"
        steady_ids = "WHERE t.dataset_id IN (SELECT id FROM datasets WHERE portal_url = ANY(%s))"
        # when a run last saw the dataset {d} (an alias), as read: since 044/045 its last change or a
        # later sighting unchanged (dataset_seen), before them its own column
        seen = ("greatest({d}.updated_at, (SELECT k.last_seen_at FROM dataset_seen k WHERE k.dataset_id = {d}.id))"
                if conn.execute("SELECT to_regclass('dataset_seen') IS NOT NULL").fetchone()[0] else "{d}.last_seen_at")
        return {
            "datasets": content(conn, "datasets", ("id",), steady, (steady_urls,),
                                extra={"read_last_seen_at": seen.format(d="t")}),
            "datasets_all": content(conn, "datasets", ("id",)),
            # (043 holds a search row's text hash as bytes: read as hex)
            "dataset_search": content(conn, "dataset_search", ("dataset_id",), steady_ids, (steady_urls,),
                                      extra={"text_hash": "right(t.content_hash::text, 64)"}),
            # (041 keeps a copy's model through its scope, and its text's hash as bytes: read as hex)
            "dataset_vectors": content(conn, "dataset_vectors", ("dataset_id", "model"), steady_ids, (steady_urls,),
                                       extra={"model": "(SELECT k.model FROM vector_scopes k WHERE k.id = t.scope)",
                                              "text_hash": "right(t.content_hash::text, 64)"}),
            # (a current version's last_seen_at as read: its dataset's where it holds none, sql/033)
            "dataset_versions": content(conn, "dataset_versions", ("dataset_id", "version_number"),
                                        extra={"title": "t.title", "description": "t.description",
                                               "read_last_seen_at": f"coalesce(t.last_seen_at, (SELECT {seen.format(d='d')}"
                                                                    " FROM datasets d WHERE d.id = t.dataset_id))"}),
            "dataset_changes": content(conn, "dataset_changes", ("id",)),
            # (042 keeps a vector's model as an id in embedding_models, and its text's hash as bytes)
            "embeddings": content(conn, "embeddings", ("text_hash", "model_name"), extra={
                "text_hash": "right(t.content_hash::text, 64)",
                "model_name": "(SELECT m.name FROM embedding_models m WHERE m.id = t.model)"
                if conn.execute("SELECT to_regclass('embedding_models') IS NOT NULL").fetchone()[0] else "t.model"}),
            "sync_runs": content(conn, "sync_runs", ("run_id",)),
            "portal_sync_status": content(conn, "portal_sync_status", ("portal_url",), steady, (steady_urls,)),
        }


def compare(before: dict, after: dict, in_flight_urls: list[str]) -> list[str]:
    """Every row the old code stored still there, equal; what the runs in flight legitimately
    change (their datasets, their versions' is_current and last_seen_at) is checked for presence."""
    problems = []
    for table in ("datasets", "dataset_changes", "sync_runs", "portal_sync_status"):
        problems += compare_rows(table, before[table], after[table])
    problems += compare_rows("dataset_search", before["dataset_search"], after["dataset_search"], skip={"content_hash"})
    problems += compare_rows("datasets (all portals: none deleted)", before["datasets_all"], after["datasets_all"],
                             skip=set(next(iter(before["datasets_all"].values()))))
    moving = {d["id"] for d in before["datasets_all"].values() if d["portal_url"] in in_flight_urls}
    steady_versions = {k: v for k, v in before["dataset_versions"].items() if k[0] not in moving}
    moving_versions = {k: v for k, v in before["dataset_versions"].items() if k[0] in moving}
    # (033 stores NULL for a current version whose last_seen_at was its dataset's: it reads the same)
    problems += compare_rows("dataset_versions", steady_versions, after["dataset_versions"], skip={"last_seen_at"})
    # (and a current version's stored snapshot, which today's runs drop when they prove it equal to
    # the one its dataset's row gives, sql/031: history_problems checks that the readers still give it)
    problems += compare_rows("dataset_versions (of portals in flight)", moving_versions, after["dataset_versions"],
                             skip={"is_current", "last_seen_at", "read_last_seen_at", "snapshot"})
    problems += compare_rows("embeddings", before["embeddings"], after["embeddings"], skip={"content_hash", "model"},
                             vector_cols={"embedding"})
    problems += compare_rows("dataset_vectors", before["dataset_vectors"], after["dataset_vectors"],
                             skip={"content_hash"}, vector_cols={"embedding"})
    return problems


def history_problems(db_url: str, before_versions: dict) -> list[str]:
    """Today's history readers give every version what the old code stored."""
    from harvester.store import db as store_db
    from harvester.store import history

    problems = []
    conn = store_db.prepare(psycopg.connect(db_url, application_name="test_upgrade history"), migrate=False)
    try:
        for (dataset_id, number), old in before_versions.items():
            new = history.get_version(conn, dataset_id, number)
            if new is None:
                problems.append(f"history.get_version({dataset_id}, {number}): none")
                continue
            for field in ("title", "description", "content_hash", "metadata_hash", "snapshot", "change_type"):
                if field in new and new[field] != old[field]:
                    problems.append(f"history.get_version({dataset_id}, {number}).{field}: {old[field]!r:.80} -> "
                                    f"{new[field]!r:.80}")
        listed = {}
        for dataset_id in {k[0] for k in before_versions}:
            listed[dataset_id] = [v["version_number"] for v in history.list_versions(conn, dataset_id)]
        short = {d: n for d, n in listed.items()
                 if not {k[1] for k in before_versions if k[0] == d} <= set(n)}
        if short:
            problems.append(f"history.list_versions lacks old versions of {len(short)} datasets, e.g. "
                            f"{list(short.items())[:3]}")
    finally:
        conn.close()
    return problems[:20]


def task_table(cluster: AirflowCluster, runs: list[tuple[str, str]]) -> dict:
    out = {}
    for dag_id, run_id in runs:
        run = cluster.run(dag_id, run_id)
        tis = {f"{ti['task_id']}{'[' + str(ti['map_index']) + ']' if ti['map_index'] >= 0 else ''}":
               (ti["state"], ti["try_number"]) for ti in cluster.task_instances(dag_id, run_id)}
        out[(dag_id, run_id)] = {"state": run["state"], "tasks": tis}
    return out


@pytest.fixture
def upgrade_site(pg_server, new_database, tmp_path):
    from harvester.testing.ckan_portal import DemoPortal
    from harvester.testing.gemini import FakeGemini

    old = extract_old_code(tmp_path / "old")
    old_migrations, new_migrations = migrations_in(old), migrations_in(ROOT)
    assert len(new_migrations) > len(old_migrations) and new_migrations[:len(old_migrations)] == old_migrations
    app = deploy(old, tmp_path / "app")  # the image's code: the old code first
    db_url, meta_url = new_database(empty=True), new_database(empty=True)
    names = [*STEADY, SLOW_LIST, SLOW_EMBED]
    portals = {}
    gemini = FakeGemini(valid_keys={GEMINI_KEY})
    try:
        for name in names:
            portals[name] = DemoPortal(records=[])
            portals[name].start()
        gemini.start()
        portals_file = write_portals(tmp_path / "portals.yaml", [
            {"name": name, "url": portals[name].base_url, "page_size": 10 if name == SLOW_LIST else 100}
            for name in names])
        env = harvester_env(db_url, portals_file, gemini_url=gemini.base_url, gemini_key=GEMINI_KEY,
                            HARVESTER_BUSY_POLL_SECS="5", **PRODUCTION_RETRIES)
        cluster = AirflowCluster(tmp_path / "airflow", meta_url, env, dags_folder=app / "dags",
                                 plugins_folder=app / "plugins")
        yield {"cluster": cluster, "old": old, "app": app, "db_url": db_url, "portals": portals, "gemini": gemini,
               "new_migrations": new_migrations, "old_migrations": old_migrations}
    finally:
        for server in (*portals.values(), gemini):
            try:
                server.stop()
            except Exception:  # noqa: BLE001 - one that never started
                pass
        shutil.rmtree(tmp_path / "old", ignore_errors=True)


def test_upgrade_with_runs_in_flight_keeps_everything(upgrade_site):
    site = upgrade_site
    cluster: AirflowCluster = site["cluster"]
    portals, gemini, db_url = site["portals"], site["gemini"], site["db_url"]
    catalogue = Catalogue()
    url = {name: p.base_url for name, p in portals.items()}
    search_env = {"HARVESTER_EMBEDDING_PROVIDER": "gemini", "GEMINI_API_KEY": GEMINI_KEY,
                  "GEMINI_BASE_URL": gemini.base_url, "HARVESTER_EMBEDDED_DB": "off"}
    timings = {}
    started = time.monotonic()
    with cluster:
        cluster.wait_for_dags([dag(n) for n in portals], timeout=180)
        for name in portals:
            cluster.unpause(dag(name))

        # -- the old code harvests: two rounds (versions, changes, removals) -------------------------
        for name in portals:
            portals[name].set_records([catalogue.record(name, i, "r1") for i in range(RECORDS)])
        cluster.require_success(cluster.trigger_at_once([dag(n) for n in portals]), timeout=RUN_TIMEOUT)
        for name in portals:
            for i in range(0, RECORDS, 4):
                portals[name].upsert_record(catalogue.record(name, i, "r2"))
            for i in range(1, RECORDS, 10):
                portals[name].remove_record(f"{name}-{i:04d}")
            portals[name].upsert_record(catalogue.bad(name, 1))
        cluster.require_success(cluster.trigger_at_once([dag(n) for n in portals]), timeout=RUN_TIMEOUT)
        timings["old code's two rounds"] = time.monotonic() - started

        steady_urls = [url[n] for n in STEADY]
        in_flight_urls = [url[SLOW_LIST], url[SLOW_EMBED]]
        before = snapshot(db_url, steady_urls)
        assert before["dataset_versions"] and before["embeddings"] and before["dataset_changes"]
        assert any(v["version_number"] > 1 for v in before["dataset_versions"].values()), "no second versions"
        assert any(d["removed_at"] for d in before["datasets_all"].values()), "no removals"
        with psycopg.connect(db_url, autocommit=True) as conn:
            assert conn.execute("SELECT to_regclass('record_outcomes')").fetchone()[0] is None  # before 017
        # searches within the portals the runs in flight leave alone (theirs change, as they should)
        queries = [(q, u) for q in QUERIES for u in steady_urls]
        old_answers = search_answers(site["old"] / "plugins", db_url, queries, search_env)
        assert sum(map(len, old_answers.values())) > 20, old_answers

        # -- runs in flight: a portal answering slowly, embeddings answering slowly, one run queued --
        for name in (SLOW_LIST, SLOW_EMBED):
            for i in range(0, RECORDS, 3):
                portals[name].upsert_record(catalogue.record(name, i, "r3"))
            for i in range(RECORDS, RECORDS + 20):
                portals[name].upsert_record(catalogue.record(name, i, "r3"))
            portals[name].remove_record(f"{name}-{2:04d}")
            portals[name].upsert_record(catalogue.bad(name, 2))
        portals[SLOW_LIST].response_delay = 8.0  # 6 pages of 10: about 50 s of listing
        gemini.delay = 40.0  # the embedding request is in flight at the upgrade
        in_flight = cluster.trigger_at_once([dag(SLOW_LIST), dag(SLOW_EMBED)])
        queued = (dag(SLOW_EMBED), cluster.trigger(dag(SLOW_EMBED)))  # max_active_runs=1: waits behind it

        listed_before = len(portals[SLOW_LIST].requests)

        def mid_way():
            states = {key: cluster.task_states(*key) for key in in_flight}
            listing = states[in_flight[0]].get(("fetch_modified", -1))
            embedding = [s for (task, _), s in states[in_flight[1]].items() if task == "embed_changed"]
            pages = len(portals[SLOW_LIST].requests) - listed_before
            return states if listing == "running" and pages >= 2 and "running" in embedding else None

        cluster.wait_until(mid_way, 240, "fetch_modified of slow_list and embed_changed of slow_embed running",
                           in_flight)
        at_swap = task_table(cluster, [*in_flight, queued])

        # -- the upgrade: stop everything, today's code in the same folders, start again ----------------
        swap = time.monotonic()
        old_processes = cluster.descendants()  # the old code's task processes among them
        deploy(ROOT, site["app"])
        cluster.restart()
        survivors = alive(old_processes)
        assert not survivors, f"processes of the cluster before the upgrade still run: {survivors}"
        gemini.delay = 0.0
        portals[SLOW_LIST].response_delay = 0.5
        timings["restart"] = time.monotonic() - swap
        cluster.require_success([*in_flight, queued], timeout=RUN_TIMEOUT)
        timings["runs in flight, after the upgrade"] = time.monotonic() - swap
        after_runs = task_table(cluster, [*in_flight, queued])
        print(f"\nat the upgrade: {at_swap}\nafter: {after_runs}")

        # -- nothing lost ------------------------------------------------------------------------------
        with psycopg.connect(db_url, autocommit=True) as conn:
            applied = [n for (n,) in conn.execute("SELECT name FROM schema_migrations ORDER BY version")]
        assert applied == site["new_migrations"], f"schema_migrations: {applied}"
        after = snapshot(db_url, steady_urls)
        problems = compare(before, after, in_flight_urls)
        problems += history_problems(db_url, before["dataset_versions"])
        new_answers = search_answers(ROOT / "plugins", db_url, queries, search_env)
        problems += compare_answers(old_answers, new_answers)
        for name in (SLOW_LIST, SLOW_EMBED):
            with psycopg.connect(db_url, autocommit=True) as conn:
                live = dict(conn.execute("SELECT source_id, title FROM datasets WHERE portal_url = %s"
                                         " AND removed_at IS NULL", (url[name],)).fetchall())
            source = {r["id"]: r["title"] for r in portals[name].records if r.get("title")}
            if live != source:
                problems.append(f"{name} after its run: {len(live)} live datasets, {len(source)} at the source; "
                                f"missing {sorted(set(source) - set(live))[:5]}, other titles "
                                f"{[k for k in live if source.get(k) != live[k]][:5]}")
        assert not problems, "the upgrade lost or changed something:\n" + "\n".join(problems)

        # -- today's code goes on from the old data ---------------------------------------------------
        for name in STEADY:
            for i in range(0, RECORDS, 5):
                portals[name].upsert_record(catalogue.record(name, i, "r4"))
            portals[name].upsert_record(catalogue.bad(name, 4))
        cluster.require_success(cluster.trigger_at_once([dag(n) for n in STEADY]), timeout=RUN_TIMEOUT)
        with psycopg.connect(db_url, autocommit=True) as conn:
            gaps = conn.execute(
                "SELECT dataset_id, array_agg(version_number ORDER BY version_number) FROM dataset_versions"
                " GROUP BY dataset_id HAVING max(version_number) <> count(*)"
                " OR count(*) FILTER (WHERE is_current) <> 1").fetchall()
            newest = conn.execute("SELECT max(version_number) FROM dataset_versions v JOIN datasets d"
                                  " ON d.id = v.dataset_id WHERE d.portal_url = %s", (url[STEADY[0]],)).fetchone()[0]
            outcomes = conn.execute("SELECT DISTINCT source_id FROM record_outcomes").fetchall()
        assert not gaps, f"versions not numbered on from the old ones, or not one current: {gaps[:5]}"
        assert newest == 3, f"{STEADY[0]}: newest version {newest}, expected 3 (r1, r2, r4)"
        assert outcomes, "no record outcome for the bad records harvested by today's code"
    timings["total"] = time.monotonic() - started
    print("timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
