"""harvest_<portal> DAGs under a real Airflow (plugins/harvester/testing/airflow_cluster.py): scheduler, dag-processor and
API server as processes, LocalExecutor, every task its own process; DAG runs triggered and
backfilled through the REST API. One cluster serves the whole module; each portal is its own local
CKAN server (DemoPortal) and its own DAG; the harvester database and Airflow's metadata database
live in the session's embedded PostgreSQL; embeddings come from the local Gemini stand-in.

What is checked: several portals harvested at once (two first syncs on the bulk path, two portals
publishing the same texts, synced at the same moment, three rounds) while searches run, with no
text paid for twice, no search or lock wait longer than HARVESTER_LOCK_TIMEOUT_SECS, and every
portal equal to its source; a backfill of three dates doing one full sync; a DAG run with no pool
but Airflow's default_pool; a worker SIGKILLed during upsert's commit and during the index build; a
duplicate grouping holding the groups' lock past HARVESTER_LOCK_TIMEOUT_SECS without rolling back
another portal's upsert.
"""
from __future__ import annotations

import copy
import re
import threading
import time
import uuid
from collections import Counter
from datetime import datetime, timezone

import psycopg
import pytest

from harvester.testing.airflow_cluster import AirflowCluster, ClusterError, LockWatch, harvester_env, write_portals
from harvester.testing.gemini import TEST_KEY as GEMINI_KEY
from harvester.testing.samples import ROOT, load_samples

pytestmark = pytest.mark.slow  # a real Airflow cluster: scheduler, dag-processor, api-server

MODEL = "gemini-embedding-001@768"
LOCK_BOUND = 10.0  # HARVESTER_LOCK_TIMEOUT_SECS in the cluster
SEARCH_SLACK = 5.0  # a search may take the lock bound plus this (embedding the query, the SQL itself)
WAIT_SLACK = 1.5  # a lock wait is seen every 0.2 s: what it may exceed the bound by, as measured
RUN_TIMEOUT = 240

BULK_RECORDS = 300  # a first sync of this many counts as a bulk load (HARVESTER_INDEX_BULK_MIN=50)
TWIN_RECORDS = 40  # below the bulk minimum: the twins embed against the live index
# name: (records, schedule). Every portal is its own DAG harvest_<name> in one portals.yaml.
PORTALS = {
    "bulk1": (BULK_RECORDS, None),
    "bulk2": (BULK_RECORDS, None),
    "twin_a": (TWIN_RECORDS, None),
    "twin_b": (TWIN_RECORDS, None),
    "daily": (20, "@daily"),
    "plain": (20, None),
    "killcommit": (30, None),
    "killindex": (BULK_RECORDS, None),
    "grouping": (20, None),
}
CLUSTER_ENV = {
    "HARVESTER_TASK_RETRIES": "1",
    "HARVESTER_TASK_RETRY_DELAY_SECS": "1",
    "HARVESTER_LOCK_TIMEOUT_SECS": str(int(LOCK_BOUND)),
    "HARVESTER_INDEX_BULK_MIN": "50",
    "HARVESTER_INDEX_BULK_SHARE": "0.1",
    # a begin waiting for a busy portal checks again this often. Not faster: Airflow 3.3 can fail a
    # reschedule-mode sensor when a poke's executor event reaches the scheduler after the next poke
    # was queued ("finished with state success, but the task instance's state attribute is queued",
    # apache/airflow#71172); pokes 2 s apart on two busy cores met it (a backfill DAG run failed).
    "HARVESTER_BUSY_POLL_SECS": "5",
    "HARVESTER_BUSY_WAIT_SECS": "120",
}
TOPICS = ("water quality", "air pollution", "public transport", "school enrolment", "housing prices",
          "crime statistics", "energy consumption", "bird survey", "road traffic", "library loans",
          "hospital waiting times", "river levels")
QUERIES = ("water quality", "bird survey edition", "public transport number 7", "energy", "housing prices twin",
           "road traffic office series", "library", "crime statistics bulk1")


def now_ckan() -> str:
    return datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="microseconds")


# -- the portals' records ----------------------------------------------------------------------------
class Catalogue:
    """Synthetic records in the shape of real CKAN packages (resources, tags, organization taken
    from the samples), with plain titles and descriptions: a harvested title is exactly the
    published one. ``text`` names the texts (twin portals share it: the same texts under their own ids)."""

    def __init__(self):
        self.bases = [r for r in load_samples("catalog-data-gov.jsonl") if isinstance(r.get("id"), str)]

    def record(self, id_prefix: str, text: str, i: int, edition: str) -> dict:
        topic = TOPICS[i % len(TOPICS)]
        rec = copy.deepcopy(self.bases[i % len(self.bases)])
        rec.update({
            "id": f"{id_prefix}-{i:04d}", "name": f"{id_prefix}-{i:04d}", "state": "active", "private": False,
            "title": f"{topic.capitalize()} {text} edition {edition} number {i}",
            "notes": f"Figures on {topic} published by the {text} office, edition {edition}, series {i}.",
            "metadata_modified": now_ckan(),
        })
        return rec

    def records(self, id_prefix: str, text: str, n: int, edition: str) -> list[dict]:
        return [self.record(id_prefix, text, i, edition) for i in range(n)]


class Site:
    """The cluster, its portals and databases, and what tests ask of them."""

    def __init__(self, cluster: AirflowCluster, db_url: str, portals: dict, gemini, search_gemini):
        self.cluster, self.db_url, self.portals = cluster, db_url, portals
        self.gemini, self.search_gemini = gemini, search_gemini
        self.catalogue = Catalogue()

    @staticmethod
    def dag(name: str) -> str:
        return f"harvest_{name}"

    def connect(self, application_name: str = "test_scheduler") -> psycopg.Connection:
        return psycopg.connect(self.db_url, autocommit=True, application_name=application_name)

    def publish(self, name: str, records: list[dict]) -> None:
        self.portals[name].set_records(records)

    def edit(self, name: str, count: int, text: str, edition: str) -> None:
        """New titles and descriptions (fresh texts) for the first ``count`` records of the portal."""
        for rec in self.portals[name].records[:count]:
            i = int(rec["id"].rsplit("-", 1)[1])
            self.portals[name].upsert_record(self.catalogue.record(rec["id"].rsplit("-", 1)[0], text, i, edition))

    def live(self, name: str) -> dict[str, str]:
        with self.connect() as conn:
            rows = conn.execute("SELECT source_id, title FROM datasets WHERE portal_url = %s AND removed_at IS NULL",
                                (self.portals[name].base_url,)).fetchall()
        return dict(rows)

    def source(self, name: str) -> dict[str, str]:
        return {r["id"]: r["title"] for r in self.portals[name].records}

    def mismatch(self, name: str) -> str | None:
        """What differs between the portal's live datasets and its source (None: they are equal)."""
        live, source = self.live(name), self.source(name)
        if live == source:
            return None
        missing = sorted(set(source) - set(live))
        extra = sorted(set(live) - set(source))
        stale = sorted(k for k in set(live) & set(source) if live[k] != source[k])
        return (f"{name}: {len(live)} live datasets, {len(source)} at the source; missing {missing[:5]} "
                f"({len(missing)}), not at the source {extra[:5]} ({len(extra)}), other title {stale[:3]} "
                f"({len(stale)}: e.g. {[(live[k], source[k]) for k in stale[:2]]})")

    def trigger_at_once(self, names: list[str], conf: dict | None = None) -> list[tuple[str, str]]:
        """One DAG run of each portal, all triggered at the same moment."""
        return self.cluster.trigger_at_once([self.dag(n) for n in names], conf)

    def index_health(self) -> tuple[list[str], list[str]]:
        """(valid, invalid) indexes on embeddings."""
        with self.connect() as conn:
            rows = conn.execute("SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                                " WHERE i.indrelid = 'embeddings'::regclass").fetchall()
        return [n for n, ok in rows if ok], [n for n, ok in rows if not ok]

    def hnsw_indexes(self) -> list[tuple[str, bool]]:
        with self.connect() as conn:
            return conn.execute(
                "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " JOIN pg_am am ON am.oid = c.relam AND am.amname = 'hnsw'"
                " WHERE i.indrelid = 'embeddings'::regclass").fetchall()

    def activity(self) -> str:
        """The harvester database's sessions, for failure messages."""
        with self.connect("test_scheduler activity") as conn:
            rows = conn.execute(
                "SELECT pid, application_name, state, wait_event_type, wait_event, pg_blocking_pids(pid),"
                " now() - query_start, left(regexp_replace(query, '\\s+', ' ', 'g'), 160)"
                " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " ORDER BY pid").fetchall()
        return "pg_stat_activity of the harvester database:\n" + "\n".join(f"  {r}" for r in rows)


def sent_texts(requests) -> list[str]:
    """The texts of embedding requests (as FakeGemini.texts, over a slice of its requests)."""
    return [part["text"] for _, _, body in requests if isinstance(body, dict)
            for req in body.get("requests", []) for part in req["content"]["parts"]]


def twice(texts: list[str]) -> dict[str, int]:
    return {t: n for t, n in Counter(texts).items() if n > 1}


# -- watching the database while runs go on ------------------------------------------------------------
class SearchLoad:
    """Searches in a loop from a thread of its own (the store's search, its own connection, query
    vectors from a Gemini stand-in of its own: the harvest's embedding requests stay countable),
    recording each search's latency and error."""

    def __init__(self, db_url: str, gemini_url: str, pause: float = 0.1):
        self.db_url, self.gemini_url, self.pause = db_url, gemini_url, pause
        self.results: list[tuple[str, float, str | None]] = []  # (query, seconds, error)
        self.hits = 0  # searches that found something
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="search-load", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(RUN_TIMEOUT)

    def _run(self):
        from harvester.store import search
        from harvester.embeddings.gemini import GeminiProvider
        from harvester.store import db as store_db

        provider = GeminiProvider(api_key=GEMINI_KEY, base_url=self.gemini_url)
        conn = None
        i = 0
        while not self._stop.is_set():
            query = QUERIES[i % len(QUERIES)]
            i += 1
            started = time.monotonic()
            try:
                if conn is None or conn.closed:
                    conn = store_db.prepare(psycopg.connect(self.db_url, application_name="test_scheduler search"),
                                            migrate=False)
                found = search.search(conn, query, provider=provider, limit=10)
                error = None
                self.hits += bool(found.items)
            except Exception as exc:  # recorded: the test asserts there are none
                error = f"{type(exc).__name__}: {exc}"
                if conn is not None:
                    conn.close()
                    conn = None
            self.results.append((query, time.monotonic() - started, error))
            self._stop.wait(self.pause)
        if conn is not None:
            conn.close()


# -- the cluster ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def site(pg_server, template_db, tmp_path_factory):
    from harvester.testing.gemini import FakeGemini
    from harvester.testing.ckan_portal import DemoPortal

    home = tmp_path_factory.mktemp("scheduler")
    tag = uuid.uuid4().hex[:8]
    harvester_db, metadata_db = f"sched_{tag}", f"airflow_sched_{tag}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{harvester_db}" TEMPLATE "{template_db}"')
        conn.execute(f'CREATE DATABASE "{metadata_db}"')
    portals = {name: DemoPortal(records=[]) for name in PORTALS}
    for portal in portals.values():
        portal.start()
    gemini = FakeGemini(valid_keys={GEMINI_KEY}).start()
    search_gemini = FakeGemini(valid_keys={GEMINI_KEY}).start()
    portals_file = write_portals(home / "portals.yaml", [
        {"name": name, "url": portals[name].base_url, "schedule": schedule}
        for name, (_, schedule) in PORTALS.items()])
    env = harvester_env(pg_server.url(harvester_db), portals_file, gemini_url=gemini.base_url, gemini_key=GEMINI_KEY,
                        **CLUSTER_ENV)
    cluster = AirflowCluster(home / "airflow", pg_server.url(metadata_db), env)
    try:
        with cluster:
            cluster.wait_for_dags([Site.dag(n) for n in PORTALS])
            for name, (_, schedule) in PORTALS.items():
                if schedule is None:  # the scheduled one starts a run when unpaused: its test does that
                    cluster.unpause(Site.dag(name))
            yield Site(cluster, pg_server.url(harvester_db), portals, gemini, search_gemini)
    finally:
        for server in (*portals.values(), gemini, search_gemini):
            server.stop()
        with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
            for name in (harvester_db, metadata_db):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- 1: many portals at once -------------------------------------------------------------------------------------
def test_four_portals_at_once_with_searches(site, monkeypatch):
    """Four DAGs triggered at the same moment, three rounds: bulk1 and bulk2 are first syncs on the
    bulk path (then small edits), twin_a and twin_b publish the same texts (fresh ones each round),
    a thread searches all along and another samples the locks."""
    monkeypatch.setenv("HARVESTER_LOCK_TIMEOUT_SECS", CLUSTER_ENV["HARVESTER_LOCK_TIMEOUT_SECS"])  # (the searches')
    cluster = site.cluster
    names = ["bulk1", "bulk2", "twin_a", "twin_b"]
    problems: list[str] = []
    all_texts: list[str] = []
    with LockWatch(site.db_url) as locks, SearchLoad(site.db_url, site.search_gemini.base_url) as searches:
        for round_no in (1, 2, 3):
            edition = f"r{round_no}"
            if round_no == 1:
                for name in ("bulk1", "bulk2"):
                    site.publish(name, site.catalogue.records(name, name, BULK_RECORDS, edition))
                site.publish("twin_a", site.catalogue.records("twa", "twin", TWIN_RECORDS, edition))
                site.publish("twin_b", site.catalogue.records("twb", "twin", TWIN_RECORDS, edition))
            else:
                for name in ("bulk1", "bulk2"):
                    site.edit(name, 10, name, edition)
                site.edit("twin_a", TWIN_RECORDS, "twin", edition)
                site.edit("twin_b", TWIN_RECORDS, "twin", edition)
            start = len(site.gemini.requests)
            runs = site.trigger_at_once(names)
            cluster.require_success(runs, timeout=RUN_TIMEOUT)
            texts = sent_texts(site.gemini.requests[start:])
            all_texts += texts
            dup = twice(texts)
            if dup:
                problems.append(f"round {round_no}: {len(dup)} of {len(set(texts))} texts were sent to the embedding "
                                f"API more than once (at most {max(dup.values())} times), e.g. {list(dup)[:2]}")
            for name in names:
                differs = site.mismatch(name)
                if differs:
                    problems.append(f"round {round_no}: {differs}")
            if round_no == 1:
                for dag_id, run_id in runs[:2]:  # bulk1, bulk2: their first syncs take the bulk path
                    shards = cluster.xcom(dag_id, run_id, "hash_compare")
                    if not (shards and all(s.get("bulk_index") for s in shards)):
                        problems.append(f"round 1: {dag_id} was not a bulk load (hash_compare returned {shards})")
                # the two bulk loads' upserts may overlap: the last to commit builds the index
                from harvester.store import vectors

                with site.connect() as conn:
                    models = [m for (m,) in conn.execute("SELECT DISTINCT m.name FROM embeddings e"
                                                         " JOIN embedding_models m ON m.id = e.model").fetchall()]
                    states = {m: vectors.index_state(conn, m) for m in models}
                if not models or any(state != "ready" for state in states.values()):
                    problems.append(f"round 1: after the bulk loads the models' HNSW indexes are {states}")
    dup = twice(all_texts)
    if dup:
        problems.append(f"over the three rounds, {len(dup)} texts were sent more than once")
    if len(searches.results) < 20 or searches.hits < 10:
        problems.append(f"the search thread ran only {len(searches.results)} searches, {searches.hits} found something")
    failed = [r for r in searches.results if r[2]]
    if failed:
        problems.append(f"{len(failed)} of {len(searches.results)} searches failed, e.g. {failed[:3]}")
    slow = [r for r in searches.results if r[1] > LOCK_BOUND + SEARCH_SLACK]
    if slow:
        problems.append(f"{len(slow)} searches took longer than {LOCK_BOUND + SEARCH_SLACK:g}s: {slow[:5]}")
    longest = locks.longest()
    if locks.errors or locks.samples < 50:
        problems.append(f"the lock sampler took {locks.samples} samples, errors: {locks.errors[:3]}")
    too_long = [(round(d, 1), w) for d, w in longest if d > LOCK_BOUND + WAIT_SLACK]
    if too_long:
        problems.append(f"{len(too_long)} backends waited for a lock longer than {LOCK_BOUND:g}s: {too_long[:5]}")
    latencies = sorted(r[1] for r in searches.results)
    summary = (f"searches: {len(latencies)}, slowest {latencies[-3:] if latencies else []}; lock waits seen: "
               f"{len(longest)}, longest "
               f"{[(round(d, 1), w['app'], sorted(w['events']), w['query'][:80]) for d, w in longest[:3]]}")
    print(summary)
    assert not problems, "\n".join(problems) + "\n" + summary


# -- 2: a backfill -------------------------------------------------------------------------------------------------
def test_backfill_of_three_dates_is_one_full_sync(site):
    cluster, dag_id = site.cluster, site.dag("daily")
    site.publish("daily", site.catalogue.records("daily", "daily", PORTALS["daily"][0], "b1"))
    cluster.unpause(dag_id)  # scheduled, catchup off: it starts a run of its latest interval now
    scheduled = cluster.wait_until(lambda: [r["dag_run_id"] for r in cluster.runs_of(dag_id)
                                            if r["run_type"] == "scheduled"], 60, "the daily DAG's scheduled run")
    cluster.require_success([(dag_id, scheduled[0])], timeout=RUN_TIMEOUT)

    site.edit("daily", 5, "daily", "b2")  # (a backfill reads the portal as it is now)
    backfill_id = cluster.backfill(dag_id, datetime(2024, 3, 1, tzinfo=timezone.utc),
                                   datetime(2024, 3, 3, tzinfo=timezone.utc))
    backfills = cluster.wait_until(
        lambda: (lambda runs: runs if len(runs) >= 3 else None)(
            [r["dag_run_id"] for r in cluster.runs_of(dag_id) if r["run_type"] == "backfill"]),
        60, f"backfill {backfill_id}'s three DAG runs")
    assert len(backfills) == 3, backfills
    cluster.require_success([(dag_id, r) for r in backfills], timeout=RUN_TIMEOUT)

    with site.connect() as conn:
        rows = conn.execute("SELECT run_id, dag_run_id, mode, status FROM sync_runs WHERE dag_run_id = ANY(%s)"
                            " ORDER BY run_id", (backfills,)).fetchall()
    full = [r for r in rows if r[2] == "full" and r[3] == "committed"]
    assert len(full) == 1, (f"expected one committed full sync for the three backfill DAG runs, sync_runs has: "
                            f"{rows}\n{cluster.describe([(dag_id, r) for r in backfills])}")
    worker = full[0][1]
    print(f"backfill {backfill_id}: sync_runs {rows}")
    for run_id in backfills:
        if run_id == worker:
            continue
        states = cluster.task_states(dag_id, run_id)
        assert states[("begin", -1)] in ("success", "skipped"), (run_id, states)
        begin = next(ti for ti in cluster.task_instances(dag_id, run_id) if ti["task_id"] == "begin")
        log = "\n".join(cluster.task_log(dag_id, run_id, "begin", n) for n in range(1, begin["try_number"] + 1))
        assert worker in log, (f"the begin of backfill DAG run {run_id} does not name the DAG run that did the "
                               f"work ({worker}):\n{log[-3000:]}")
    assert site.mismatch("daily") is None, site.mismatch("daily")


# -- 3: no pools -----------------------------------------------------------------------------------------------------
def test_no_pool_but_default_pool(site, monkeypatch):
    cluster = site.cluster
    assert set(cluster.pools()) == {"default_pool"}, cluster.pools()

    # The DAG file, parsed here without HARVESTER_EMBEDDING_POOL: its embed task is in default_pool.
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.delenv("HARVESTER_EMBEDDING_POOL", raising=False)
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(cluster.extra_env["HARVESTER_PORTALS_FILE"]))
    bag = DagBag(dag_folder=str(ROOT / "dags" / "harvest_portals.py"))
    assert not bag.import_errors, bag.import_errors
    assert bag.dags[site.dag("plain")].get_task("embed_changed").pool == "default_pool"

    site.publish("plain", site.catalogue.records("plain", "plain", PORTALS["plain"][0], "p1"))
    run = (site.dag("plain"), cluster.trigger(site.dag("plain")))
    cluster.require_success([run], timeout=RUN_TIMEOUT)
    embeds = [ti for ti in cluster.task_instances(*run) if ti["task_id"] == "embed_changed"]
    assert embeds and all(ti["pool"] == "default_pool" and ti["state"] == "success" for ti in embeds), embeds
    assert site.mismatch("plain") is None, site.mismatch("plain")


# -- 4: a worker killed ----------------------------------------------------------------------------------------------
APP = re.compile(r"^harvester (?P<dag>[\w.-]+)\.(?P<task>\w+) pid=(?P<pid>\d+)(?P<build> build)?$")


def waiting_task(site, holder_pid: int, dag_id: str, task_id: str, build: bool):
    """The os pid of the task process whose connection (the index build's, with ``build``) is waiting
    for a lock ``holder_pid`` holds, with its backend's pid; None while there is none."""
    with site.connect("test_scheduler probe") as conn:
        rows = conn.execute("SELECT pid, application_name, pg_blocking_pids(pid) FROM pg_stat_activity"
                            " WHERE datname = current_database() AND wait_event_type = 'Lock'").fetchall()
    for backend, app, blockers in rows:
        found = APP.match(app or "")
        if (found and found["dag"] == dag_id and found["task"] == task_id and bool(found["build"]) == build
                and holder_pid in (blockers or ())):
            return int(found["pid"]), backend
    return None


def snapshot(site, name: str):
    with site.connect() as conn:
        datasets = conn.execute("SELECT source_id, title, content_hash, metadata_hash, updated_at, removed_at"
                                " FROM datasets WHERE portal_url = %s ORDER BY source_id",
                                (site.portals[name].base_url,)).fetchall()
        status = conn.execute("SELECT last_successful_sync, datasets_synced FROM portal_sync_status"
                              " WHERE portal_url = %s", (site.portals[name].base_url,)).fetchone()
    return datasets, status


def kill_when_waiting(site, holder: psycopg.Connection, run: tuple[str, str], task_id: str, build: bool) -> int:
    """Wait until the run's task waits for ``holder``'s lock, SIGKILL its process; returns the pid."""
    cluster = site.cluster
    holder_pid = holder.info.backend_pid

    def seen():
        if cluster.run(*run)["state"] in ("success", "failed"):
            raise ClusterError(f"the DAG run ended before its {task_id} was seen waiting for the test's lock "
                               f"(backend {holder_pid})\n{site.activity()}\n{cluster.describe([run])}")
        return waiting_task(site, holder_pid, run[0], task_id, build)

    try:
        pid, backend = cluster.wait_until(seen, 90, f"{run[0]}.{task_id}{' (its index build)' if build else ''} "
                                                    f"to wait for the lock of backend {holder_pid}", [run])
    except ClusterError as exc:
        raise ClusterError(f"{exc}\n{site.activity()}") from None
    cluster.kill_task_process(pid)
    return pid


def wait_backends_gone(site, pid: int, timeout: float = 60) -> None:
    """Until no connection of the task process ``pid`` is left in the harvester database."""
    def gone():
        with site.connect("test_scheduler probe") as conn:
            left = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                " AND application_name LIKE %s", (f"harvester %pid={pid}%",)).fetchone()[0]
        return left == 0

    site.cluster.wait_until(gone, timeout, f"the connections of the killed process {pid} to end")


def finish(site, name: str, run: tuple[str, str]) -> str:
    """The killed run's retry succeeds, or else the portal's next run: which one."""
    cluster = site.cluster
    state = cluster.wait_for([run], timeout=RUN_TIMEOUT)[run]
    if state == "success":
        return "retry"
    nxt = (run[0], cluster.trigger(run[0]))
    cluster.require_success([nxt], timeout=RUN_TIMEOUT)
    return "next run"


def test_worker_killed_during_upserts_commit(site):
    cluster, name = site.cluster, "killcommit"
    dag_id = site.dag(name)
    site.publish(name, site.catalogue.records(name, name, PORTALS[name][0], "k1"))
    cluster.require_success([(dag_id, cluster.trigger(dag_id))], timeout=RUN_TIMEOUT)
    assert site.mismatch(name) is None, site.mismatch(name)
    before = snapshot(site, name)

    site.edit(name, 10, name, "k2")
    holder = site.connect("test_scheduler lock holder")
    try:
        holder.execute("BEGIN")
        assert holder.execute("SELECT 1 FROM portal_sync_status WHERE portal_url = %s FOR UPDATE",
                              (site.portals[name].base_url,)).fetchone(), "no portal_sync_status row to lock"
        run = (dag_id, cluster.trigger(dag_id))
        pid = kill_when_waiting(site, holder, run, "upsert", build=False)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    wait_backends_gone(site, pid)
    after = snapshot(site, name)
    assert after == before, "the killed upsert changed what users see (half-committed)"

    how = finish(site, name, run)
    print(f"killed pid {pid} waiting in upsert; then the {how} succeeded")
    assert site.mismatch(name) is None, f"after the {how}: {site.mismatch(name)}"


def test_worker_killed_during_the_index_build(site):
    cluster, name = site.cluster, "killindex"
    dag_id = site.dag(name)
    # The model's index is missing (as before a model's first bulk load): this first sync of 300
    # texts is a bulk load, and its upsert builds the index.
    with site.connect() as conn:
        for index, _ in site.hnsw_indexes():
            conn.execute(f'DROP INDEX IF EXISTS "{index}"')
    site.publish(name, site.catalogue.records(name, name, PORTALS[name][0], "i1"))
    holder = site.connect("test_scheduler snapshot holder")
    try:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1 FROM datasets LIMIT 1")
        run = (dag_id, cluster.trigger(dag_id))
        pid = kill_when_waiting(site, holder, run, "upsert", build=True)
    finally:
        holder.execute("ROLLBACK")
        holder.close()

    how = finish(site, name, run)
    print(f"killed pid {pid} waiting in the index build; then the {how} succeeded")
    assert site.mismatch(name) is None, f"after the {how}: {site.mismatch(name)}"
    wait_backends_gone(site, pid, timeout=120)

    def valid():
        indexes = site.hnsw_indexes()
        return indexes and all(ok for _, ok in indexes) and not site.index_health()[1]

    try:
        cluster.wait_until(valid, 60, "the model's HNSW index to be valid, with no invalid index on embeddings")
    except ClusterError as exc:
        raise ClusterError(f"{exc}\nindexes on embeddings (valid, invalid): {site.index_health()}\n"
                           f"{site.activity()}\n{cluster.describe([run])}") from None


# -- 5: a long duplicate grouping -----------------------------------------------------------------------------------
def test_a_long_grouping_never_rolls_back_another_portals_upsert(site):
    """Issue 36: grouping cross-portal duplicates takes one lock for all portals, held for as long as
    a grouping takes (about 145 s for a first scan of a million datasets). Here the test holds it,
    as such a grouping would, past HARVESTER_LOCK_TIMEOUT_SECS: another portal's upsert commits at
    once in its first try, then waits for the lock (no lock timeout: HARVESTER_GROUPING_WAIT_SECS)
    and groups its datasets."""
    from harvester.store import duplicates

    cluster, name = site.cluster, "grouping"
    dag_id, url = site.dag(name), site.portals[name].base_url
    site.publish(name, site.catalogue.records(name, name, PORTALS[name][0], "g1"))
    cluster.require_success([(dag_id, cluster.trigger(dag_id))], timeout=RUN_TIMEOUT)  # (and the model's index)
    edited = 5
    site.edit(name, edited, name, "g2")
    holder = site.connect("test_scheduler grouping")
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (duplicates._LOCK_KEY,))
        run = (dag_id, cluster.trigger(dag_id))

        def committed():
            with site.connect() as conn:
                row = conn.execute("SELECT status FROM sync_runs WHERE portal_url = %s ORDER BY run_id DESC LIMIT 1",
                                   (url,)).fetchone()
            return row is not None and row[0] == "committed"

        cluster.wait_until(committed, RUN_TIMEOUT, "the run's commit while another grouping holds the lock", [run])

        def upsert_running_for() -> float:
            ti = next(t for t in cluster.task_instances(*run) if t["task_id"] == "upsert")
            started = ti.get("start_date")
            return (datetime.now(timezone.utc) - datetime.fromisoformat(started)).total_seconds() if started else 0.0

        def grouping_waits():
            with site.connect() as conn:
                return conn.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event ="
                                    " 'advisory' AND query LIKE '%%grouping after commit%%'").fetchone()

        # its grouping waits for the lock; held on past the lock timeout (from the upsert's start),
        # and 3 s at least after the grouping began waiting
        cluster.wait_until(grouping_waits, RUN_TIMEOUT, "the run's grouping waiting for the groups' lock", [run])
        seen_waiting = time.monotonic()
        cluster.wait_until(lambda: upsert_running_for() > LOCK_BOUND + 2 and time.monotonic() - seen_waiting > 3,
                           RUN_TIMEOUT, "the upsert running past the lock timeout", [run])
        with site.connect() as conn:
            assert duplicates.waiting(conn) == edited, "grouped under a held lock?"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    cluster.require_success([run], timeout=RUN_TIMEOUT)
    tries = {t["task_id"]: t["try_number"] for t in cluster.task_instances(*run)}
    assert tries["upsert"] == 1, f"the upsert was retried: {tries}"
    log = cluster.task_log(*run, "upsert", 1)
    assert not re.search(r"lock timeout|LockWaitTimeout", log), log[-3000:]
    waited = re.search(r"duplicates: (\d+) datasets re-keyed.*after waiting ([\d.]+)s for another grouping", log)
    assert waited and int(waited.group(1)) == edited, log[-3000:]
    assert float(waited.group(2)) > 2.0
    with site.connect() as conn:
        assert duplicates.waiting(conn) == 0
        assert conn.execute("SELECT count(DISTINCT k.dataset_id) FROM dataset_keys k JOIN datasets d"
                            " ON d.id = k.dataset_id WHERE d.portal_url = %s", (url,)).fetchone()[0] == PORTALS[name][0]
    assert site.mismatch(name) is None, site.mismatch(name)
