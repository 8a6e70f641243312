"""Benchmark: many portals' first syncs at once through one real Airflow, against one big portal.

Through ONE real Airflow (plugins/harvester/testing/airflow_cluster.py: `airflow scheduler`, `airflow dag-processor`,
`airflow api-server` as processes, LocalExecutor, every task its own process, metadata in
PostgreSQL; runs triggered and watched through the REST API), side by side in one run:

(B) one portal of --portals x --datasets-per-portal datasets (100,000 by default): its first sync;
(A) --portals portals (8) of --datasets-per-portal datasets each (12,500), every portal's records
    distinct from the others' (ids and texts), all first syncs, triggered at the same moment
    through the REST API (one thread per trigger, released together).

B runs first, then A; each starts from a fresh, empty harvester database (dropped and created
again from a migrated template between the two), so both are first syncs from empty, both bulk
loads of the model's vectors, each ending with one HNSW index build. A and B harvest the same
number of records, derived from ../shared/ckan-samples by harvest_bench.synthetic (about 9 KB
each; A's portals hold consecutive slices of the numbering B's portal holds whole). Each portal is
a local CKAN server (DemoPortal) in a process of its own; vectors come from the local
Gemini-protocol server (plugins/harvester/testing/gemini.py, `--vectors words`, zero latency) in a process of
its own, which counts every text it is sent; PostgreSQL is the embedded server
(harvester.store.embedded.server.EmbeddedServer), holding the harvester database and Airflow's metadata
database.

For each part it prints:
* wall time from the trigger to the end of the last DAG run (the runs' end_date, REST API), and
  when the first and last runs started;
* per portal: run duration and each task's duration (embed_changed: its shards' count, sum and
  longest), tries above 1, sync_runs.stats counts, live datasets against the portal's count; and
  a summary of those over the portals (min / median / max), with the time task instances spent
  queued (start_date - queued_when);
* texts sent to the embedding API, distinct texts, and how many were sent more than once (the
  goal: 0);
* lock waits: pg_stat_activity of the harvester database sampled every 0.2 s from a thread of
  its own (wait_event_type = 'Lock', every backend but the sampler's own: nothing else is left
  out). Per backend and statement (pid, query_start): its longest continuous wait (seen waiting
  in consecutive samples), how long it was seen waiting in all and from its first wait to its
  last (a statement may wait many times: 8 bulk INSERTs at once queue for the relation
  extension lock, wait_event 'extend', again and again), what it waited on and who blocked it.
  Waits of connections whose application_name ends with " build" (the upsert's concurrent HNSW
  index build, which waits for transactions older than it and blocks nobody) are listed apart
  from the tasks' statements (and from anything else, e.g. autovacuum);
* CPU seconds spent meanwhile by Airflow (its processes and every task), PostgreSQL, the portals
  and the embedding server: on a 2-core machine that hosts all of them, where the time goes;
* the HNSW index on embeddings after the part (a first sync of the model must leave one: searches
  rank by exact scans without it) and what each upsert's log says about it (built it, left it to
  another bulk load). When A ends without one, (A'): p1's next run (incremental, nothing
  changed) is triggered and timed, to see whether it builds the index and at what cost; the
  ratio is then printed a second time, counting it (B's time includes its index build).

Then the goals: A's wall time at most 1.3 x B's, both parts ending with the model's HNSW index,
the longest (continuous) lock wait of a task statement "a few seconds" (at most 5 s here), no text
sent twice, no task retried, each printed yes/NO beside the figure. Nothing
about time is asserted: the exit status is 0 unless something broke (a DAG run that did not
succeed, a portal whose datasets are not all there, a server that did not start).

The cluster: parallelism 4 x --portals (at least 16): enough for --portals DAG runs at once with
all their embed_changed shards (a first sync of 12,500 texts maps to 3 shards of 5,000; 100,000 to
8, HARVESTER_EMBED_MAX_SHARDS), which run in Airflow's default_pool (128 slots);
HARVESTER_LOCK_TIMEOUT_SECS=30 (a statement waiting longer for a lock fails its task);
HARVESTER_TASK_RETRIES=1 (a retry is printed as a finding; a run that fails twice breaks the
bench); the PostgreSQL server's max_connections raised to 300 (each task holds one or two
connections; Airflow's processes a pool each).

    .venv/bin/python bench/concurrency_bench.py --portals 2 --datasets-per-portal 1000   # smoke, < 1 min
    .venv/bin/python bench/concurrency_bench.py          # 8 x 12,500 vs 1 x 100,000: ~4 min on 2 cores

Options: --portals N (8), --datasets-per-portal N (12500), --home DIR (where its working directory
is made: embedded PostgreSQL, Airflow home with every task's log, portals.yaml; default $TMPDIR),
--keep (keep that directory; it is kept anyway when something broke), --timeout SECS (per part,
3600). At full size the databases take a few GB and the portal processes hold the records twice
(B's and A's, about 2 GB each).
"""
from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT / "bench", ROOT / "plugins"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import first_sync_bench  # noqa: E402  (its child-process servers)
from harvester.testing.airflow_cluster import LockWatch  # noqa: E402  (the sampler test_scheduler.py uses too)

GEMINI_KEY = "AIza-concurrency-bench"
LOCK_TIMEOUT_SECS = 30
GOAL_RATIO = 1.3        # A's wall time at most this many times B's
GOAL_LOCK_WAIT = 5.0    # "a few seconds": the longest lock wait of a task statement, at most
SAMPLE_EVERY = 0.2      # seconds between two looks at pg_stat_activity
TASK_ORDER = ("begin", "fetch_modified", "reconcile", "hash_compare", "embed_changed", "upsert")


BenchError = first_sync_bench.BenchError  # something broke: a run failed, a server did not start; exit status 1


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 600 else f"{value:.0f} s ({value / 60:.1f} min)"


def verdict(ok: bool) -> str:
    return "yes" if ok else "NO"


# -- records --------------------------------------------------------------------------------------
def portion(offset: int, count: int, plain: bool = False) -> list[dict]:
    """Records ``offset`` .. ``offset + count - 1`` of one numbering: harvest_bench.synthetic's
    records (real CKAN samples, new ids, names and titles), renumbered so that two portions never
    share an id, a name or a title. All active and public (the samples hold some deleted,
    draft or private ones, which a harvest would not keep as live datasets). ``plain``: plain
    ASCII titles and descriptions (a harvested title is then exactly the published one)."""
    from harvest_bench import synthetic

    out = synthetic(count, seed=1 + offset)
    for i, rec in enumerate(out):
        j = offset + i
        rec["id"] = f"bench-{j:07d}"
        rec["name"] = f"{str(rec['name']).rsplit('-', 1)[0]}-{j}"
        rec["title"] = f"{str(rec['title']).rsplit(' #', 1)[0]} #{j}"
        rec["state"] = "active"
        rec["private"] = False
        if plain:
            rec["title"] = f"Dataset {j} of the synthetic catalogue, series {j % 97}"
            rec["notes"] = f"Figures number {j} published by office {j % 13}, edition {j % 7}."
    return out


# -- local servers, each in a process of its own -----------------------------------------------------
def _serve_portal(offset: int, count: int, pipe) -> None:
    """Child process: a local CKAN portal serving portion(offset, count) until told to stop."""
    from harvester.testing.ckan_portal import DemoPortal

    first_sync_bench.serve_until_told(DemoPortal(portion(offset, count)), pipe)


def _serve_gemini(vectors: str, pipe) -> None:
    """Child process: the local Gemini-protocol server, counting each text it is sent (a digest of
    it: FakeGemini's own list of requests is emptied as it goes). "take" answers the counts since
    the last "take" and starts counting afresh ("twice_ever": texts sent more than once since the
    server started, whatever "take" did); "stop" stops it."""
    from harvester.testing.gemini import FakeGemini

    fake = FakeGemini(valid_keys={GEMINI_KEY}, vectors=vectors)
    fake.start()
    pipe.send(fake.base_url)
    counts: Counter = Counter()
    ever: Counter = Counter()
    requests = 0

    def drain():
        nonlocal requests
        with fake._lock:
            taken = list(fake.requests)
            fake.requests.clear()
        for _, _, body in taken:
            if not isinstance(body, dict):
                continue
            requests += 1
            for req in body.get("requests", []):
                text = "".join(part.get("text", "") for part in req.get("content", {}).get("parts", []))
                digest = hashlib.blake2b(text.encode(), digest_size=12).digest()
                counts[digest] += 1
                ever[digest] += 1

    while True:
        try:
            message = pipe.recv() if pipe.poll(0.5) else None
        except EOFError:
            break
        drain()
        if message == "take":
            repeated = [n for n in counts.values() if n > 1]
            pipe.send({"requests": requests, "texts": sum(counts.values()), "distinct": len(counts),
                       "twice": len(repeated), "extra": sum(n - 1 for n in repeated),
                       "most": max(repeated, default=1 if counts else 0),
                       "twice_ever": sum(1 for n in ever.values() if n > 1)})
            counts.clear()
            requests = 0
        elif message == "stop":
            break
    fake.stop()


class LocalServer(first_sync_bench.LocalServer):
    """A server in a child process (first_sync_bench's), which also answers questions."""

    def ask(self, message: str, timeout: float = 60):
        self._pipe.send(message)
        if not self._pipe.poll(timeout):
            raise BenchError(f"the {self.name} did not answer {message!r} within {timeout:.0f}s")
        return self._pipe.recv()


# -- PostgreSQL ------------------------------------------------------------------------------------------
def start_postgres(home: Path, max_connections: int = 300):
    """The embedded server, restarted once with ``max_connections`` (ALTER SYSTEM: kept in its data
    directory; the server's start options do not set it)."""
    import psycopg

    from harvester.store.embedded.server import EmbeddedServer

    server = EmbeddedServer(home)
    server.start()
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET max_connections = {int(max_connections)}")
    server.stop()
    server.start()
    return server


def postgres_pid(server) -> int:
    return int((server.pgdata / "postmaster.pid").read_text().split()[0])


def create_template(server, name: str = "harvester_template") -> str:
    """A migrated harvester database that fresh ones are copied from."""
    import psycopg

    from harvester.store.migrations import migrate

    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(server.url(name), autocommit=True) as conn:
        migrate(conn)
    return name


def fresh_database(server, name: str, template: str | None = None) -> str:
    """Drop ``name`` (whoever is connected) and create it again, empty or from ``template``."""
    import psycopg

    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return server.url(name)


# -- measuring ---------------------------------------------------------------------------------------------
tree_cpu = first_sync_bench.process_cpu  # CPU seconds of a process and its descendants


# -- the bench ---------------------------------------------------------------------------------------------------
def when(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def run_figures(cluster, dag_id: str, run_id: str) -> dict:
    """A DAG run's start, end and task instances (REST API)."""
    run = cluster.run(dag_id, run_id)
    tis = cluster.task_instances(dag_id, run_id)
    tasks: dict[str, list[float]] = {}
    queued, retried, hosts = [], [], Counter()
    for ti in tis:
        tasks.setdefault(ti["task_id"], []).append(ti.get("duration") or 0.0)
        if ti.get("queued_when") and ti.get("start_date"):
            queued.append((when(ti["start_date"]) - when(ti["queued_when"])).total_seconds())
        if (ti.get("try_number") or 0) > 1:
            retried.append(f"{ti['task_id']}[{ti['map_index']}] try {ti['try_number']}")
        if ti.get("hostname"):
            hosts[ti["hostname"]] += 1
    return {"dag_id": dag_id, "run_id": run_id, "state": run["state"], "start": when(run.get("start_date")),
            "end": when(run.get("end_date")), "tasks": tasks, "queued": queued, "retried": retried, "hosts": hosts,
            "task_instances": tis}


def hnsw_indexes(db_url: str) -> list[tuple[str, bool]]:
    """(name, valid) of each HNSW index on embeddings."""
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(
            "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_am am ON am.oid = c.relam AND am.amname = 'hnsw'"
            " WHERE i.indrelid = 'embeddings'::regclass ORDER BY 1").fetchall()


def index_lines(cluster, dag_id: str, run_id: str, task_id: str = "upsert") -> list[str]:
    """What a task's log says about the HNSW index (its own words: built it, left it to another run...)."""
    lines = []
    for ti in cluster.task_instances(dag_id, run_id):
        if ti["task_id"] != task_id:
            continue
        for attempt in range(1, (ti.get("try_number") or 1) + 1):
            for line in cluster.task_log(dag_id, run_id, task_id, attempt, ti["map_index"]).splitlines():
                if "HNSW index" in line and "builds and searches" not in line:
                    lines.append(line.strip())
    return lines


def task_cell(durations: list[float]) -> str:
    if len(durations) == 1:
        return f"{durations[0]:.1f}"
    return f"{len(durations)}: {sum(durations):.1f}/{max(durations):.1f}"


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


class Part:
    """One part of the bench: its DAG runs, figures and lock waits."""

    def __init__(self, key: str, label: str, portals: dict[str, int]):
        self.key, self.label, self.portals = key, label, portals  # portal name -> records
        self.wall = 0.0
        self.runs: list[dict] = []
        self.sends: dict = {}
        self.locks: LockWatch | None = None
        self.cpu: dict[str, float] = {}
        self.stats: dict[str, dict] = {}
        self.live: dict[str, int] = {}
        self.first_start = self.last_start = 0.0
        self.indexes: list[tuple[str, bool]] = []   # the HNSW indexes on embeddings after the part
        self.index_log: list[str] = []             # what each upsert's log says about the index
        self.follow_up: dict | None = None          # (A') the next run that built a missing index

    def task_waits_in_all(self) -> float:
        """The most time one task statement was seen waiting, its waits added up."""
        if not self.locks:
            return 0.0
        return max((w["seen"] * self.locks.interval for kind in ("task", "other") for _, w in self.locks.longest(kind)),
                   default=0.0)

    def longest_task_wait(self) -> float:
        waits = [d for kind in ("task", "other") for d, _ in self.locks.longest(kind)] if self.locks else []
        return max(waits, default=0.0)

    def index_ok(self) -> bool:
        return bool(self.indexes) and all(valid for _, valid in self.indexes)

    def longest_build_wait(self) -> float:
        return max((d for d, _ in self.locks.longest("build")), default=0.0) if self.locks else 0.0


class Bench:
    def __init__(self, args, home: Path):
        self.args, self.home = args, home
        self.server = None
        self.cluster = None
        self.portal_servers: dict[str, LocalServer] = {}
        self.portal_urls: dict[str, str] = {}
        self.gemini: LocalServer | None = None
        self.parts: list[Part] = []
        self.db_name = "harvester"
        self.template = None

    def dag(self, name: str) -> str:
        return f"harvest_{name}"

    # -- set-up ----------------------------------------------------------------------------------
    def start(self) -> None:
        from harvester.testing.airflow_cluster import AirflowCluster, harvester_env, write_portals

        args = self.args
        total = args.portals * args.datasets_per_portal
        say(f"(B) 1 portal of {total:,} datasets, then (A) {args.portals} portals of {args.datasets_per_portal:,} "
            f"datasets each, at once; home {self.home}; {os.cpu_count()} CPUs")
        # The portals build their records in their own processes while the rest is set up.
        self.portal_servers["big"] = LocalServer("portal big", _serve_portal, 0, total)
        for p in range(args.portals):
            self.portal_servers[f"p{p + 1}"] = LocalServer(f"portal p{p + 1}", _serve_portal,
                                                           p * args.datasets_per_portal, args.datasets_per_portal)
        self.gemini = LocalServer("local Gemini-protocol server", _serve_gemini, "words")

        t0 = time.perf_counter()
        self.server = start_postgres(self.home / "pg")
        self.template = create_template(self.server)
        fresh_database(self.server, "airflow_meta")
        db_url = fresh_database(self.server, self.db_name, self.template)
        print(f"embedded PostgreSQL up (max_connections 300), migrated template ready ({time.perf_counter() - t0:.1f}s)")

        t0 = time.perf_counter()
        for name, srv in self.portal_servers.items():
            self.portal_urls[name] = srv.wait_ready()
        gemini_url = self.gemini.wait_ready()
        print(f"{len(self.portal_urls)} portal processes serving (ready {time.perf_counter() - t0:.1f}s later)")
        portals_file = write_portals(self.home / "portals.yaml", [
            {"name": name, "url": url, "page_size": 1000} for name, url in self.portal_urls.items()])
        env = harvester_env(db_url, portals_file, gemini_url=gemini_url, gemini_key=GEMINI_KEY,
                            HARVESTER_LOCK_TIMEOUT_SECS=str(LOCK_TIMEOUT_SECS), HARVESTER_TASK_RETRIES="1",
                            HARVESTER_TASK_RETRY_DELAY_SECS="5", HARVESTER_EMBEDDING_POOL="default_pool")
        parallelism = max(16, 4 * args.portals)
        print(f"Airflow: LocalExecutor, parallelism {parallelism}, embed_changed in default_pool; "
              f"HARVESTER_LOCK_TIMEOUT_SECS={LOCK_TIMEOUT_SECS}, HARVESTER_TASK_RETRIES=1")
        t0 = time.perf_counter()
        self.cluster = AirflowCluster(self.home / "airflow", self.server.url("airflow_meta"), env,
                                      parallelism=parallelism, start_timeout=300)
        self.cluster.start()
        dags = [self.dag(n) for n in self.portal_urls]
        self.cluster.wait_for_dags(dags, timeout=180)
        for dag_id in dags:
            self.cluster.unpause(dag_id)
        pools = self.cluster.pools()
        print(f"Airflow up, {len(dags)} DAGs parsed and unpaused ({time.perf_counter() - t0:.1f}s); pools {pools}")

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        for srv in [*self.portal_servers.values(), self.gemini]:
            if srv is not None:
                srv.stop()
        if self.server is not None:
            self.server.stop()

    # -- CPU ---------------------------------------------------------------------------------------------
    def cpu_now(self) -> dict[str, float]:
        return {"Airflow (processes and tasks)": sum(tree_cpu(p.pid) for p in self.cluster.procs.values()),
                "PostgreSQL": tree_cpu(postgres_pid(self.server)),
                "portals": sum(tree_cpu(s.process.pid) for s in self.portal_servers.values()),
                "embedding server": tree_cpu(self.gemini.process.pid)}

    # -- a part -----------------------------------------------------------------------------------------
    def run_part(self, part: Part) -> Part:
        import psycopg

        db_url = fresh_database(self.server, self.db_name, self.template)
        self.gemini.ask("take")  # counting starts now
        names = list(part.portals)
        cpu0 = self.cpu_now()
        with LockWatch(db_url, SAMPLE_EVERY) as locks:
            started = datetime.now(timezone.utc)
            t0 = time.monotonic()
            runs = self.cluster.trigger_at_once([self.dag(n) for n in names], {"full_sync": True})
            states = self.cluster.wait_for(runs, timeout=self.args.timeout)
            polled = time.monotonic() - t0
        part.locks = locks
        part.cpu = {k: v - cpu0[k] for k, v in self.cpu_now().items()}
        part.sends = self.gemini.ask("take")
        bad = [key for key, state in states.items() if state != "success"]
        if bad:
            raise BenchError(f"({part.key}) DAG runs did not succeed: {bad}\n{self.cluster.describe(bad)}")
        part.runs = [run_figures(self.cluster, *key) for key in runs]
        ends = [r["end"] for r in part.runs]
        part.wall = (max(ends) - started).total_seconds() if all(ends) else polled
        part.first_start = (min(r["start"] for r in part.runs) - started).total_seconds()
        part.last_start = (max(r["start"] for r in part.runs) - started).total_seconds()
        with psycopg.connect(db_url, autocommit=True) as conn:
            for name in names:
                row = conn.execute("SELECT status, stats FROM sync_runs WHERE portal_name = %s "
                                   "ORDER BY run_id DESC LIMIT 1", (name,)).fetchone()
                part.stats[name] = {"status": row[0], **row[1]} if row else {"status": "none"}
                part.live[name] = conn.execute(
                    "SELECT count(*) FROM datasets WHERE portal_url = %s AND removed_at IS NULL",
                    (self.portal_urls[name],)).fetchone()[0]
        part.indexes = hnsw_indexes(db_url)
        for dag_id, run_id in runs:
            part.index_log += [f"{dag_id}: {line}" for line in index_lines(self.cluster, dag_id, run_id)]
        self.parts.append(part)
        self.print_part(part)
        missing = [f"{n}: {part.live[n]:,} live datasets, {part.portals[n]:,} at the portal "
                   f"(sync_runs: {part.stats[n].get('status')})" for n in names if part.live[n] != part.portals[n]]
        if missing:
            raise BenchError(f"({part.key}) portals not fully harvested: {missing}")
        return part

    def print_part(self, part: Part) -> None:
        n_runs = len(part.runs)
        total = sum(part.portals.values())
        print(f"({part.key}) {part.label}: {seconds(part.wall)} from the trigger to the end of the last run "
              f"({total / part.wall:,.0f} datasets/s); runs started {part.first_start:.1f} s to "
              f"{part.last_start:.1f} s after the trigger")
        cpu = part.cpu
        busy = sum(cpu.values())
        print("    CPU (s): " + ", ".join(f"{k} {v:.0f}" for k, v in cpu.items())
              + f"; {busy / part.wall:.2f} of {os.cpu_count()} cores busy on average")
        s = part.sends
        print(f"    embedding API: {s.get('requests', 0):,} requests, {s.get('texts', 0):,} texts sent, "
              f"{s.get('distinct', 0):,} distinct; sent more than once: {s.get('twice', 0):,} texts "
              f"({s.get('extra', 0):,} extra sends, at most {s.get('most', 0)} times each)")
        print(f"    per portal: run duration (s), task durations (s; embed_changed: shards: sum/longest), "
              f"sync_runs counts")
        header = ["portal", "run"] + [t.replace("_", " ") for t in TASK_ORDER] + ["fetched", "embedded", "live", "tries>1"]
        rows = []
        for name, r in zip(part.portals, part.runs):
            took = (r["end"] - r["start"]).total_seconds()
            st = part.stats[name]
            rows.append([name, f"{took:.1f}"] + [task_cell(r["tasks"].get(t, [0.0])) for t in TASK_ORDER]
                        + [f"{st.get('fetched', 0):,}", f"{st.get('embedded', 0):,}", f"{part.live[name]:,}",
                           ", ".join(r["retried"]) or "-"])
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
        for row in [header, *rows]:
            print("      " + "  ".join(str(x).rjust(w) for x, w in zip(row, widths)))
        if n_runs > 1:
            durations = [(r["end"] - r["start"]).total_seconds() for r in part.runs]
            print(f"    over the {n_runs} portals (min / median / max, s): run {spread(durations)}; "
                  + "; ".join(f"{t} {spread([sum(r['tasks'].get(t, [0.0])) for r in part.runs])}"
                              for t in TASK_ORDER))
        queued = [q for r in part.runs for q in r["queued"]]
        print(f"    task instances queued before they started (s): median {statistics.median(queued):.1f}, "
              f"longest {max(queued):.1f} ({len(queued)} task instances)" if queued else "")
        for line in part.locks.report("    "):
            print(line)
        state = (", ".join(f"{name} ({'valid' if ok else 'INVALID'})" for name, ok in part.indexes)
                 or "NONE: the model's vectors have no HNSW index (searches rank by exact scans until one is built)")
        print(f"    HNSW index on embeddings after the part: {state}")
        for line in part.index_log:
            print(f"      {line[:230]}")

    def follow_up(self, part: Part, name: str) -> None:
        """(A') When no upsert of the part built the model's HNSW index: the portal's next run (an
        incremental one, nothing changed), timed, and whether its upsert builds the index."""
        say(f"({part.key}') no HNSW index after ({part.key}): the next run of {name} (incremental, nothing changed), "
            "to see whether it builds it and what that costs")
        db_url = self.server.url(self.db_name)
        started = datetime.now(timezone.utc)
        key = (self.dag(name), self.cluster.trigger(self.dag(name), {}))
        state = self.cluster.wait_for([key], timeout=self.args.timeout)[key]
        if state != "success":
            raise BenchError(f"({part.key}') {key} ended {state}\n{self.cluster.describe([key])}")
        figures = run_figures(self.cluster, *key)
        wall = (figures["end"] - started).total_seconds()
        indexes = hnsw_indexes(db_url)
        part.follow_up = {"portal": name, "wall": wall, "indexes": indexes,
                          "ok": bool(indexes) and all(v for _, v in indexes)}
        print(f"({part.key}') next run of {name}: {seconds(wall)} from the trigger to its end; tasks (s): "
              + ", ".join(f"{t} {task_cell(figures['tasks'].get(t, [0.0]))}" for t in TASK_ORDER))
        print(f"    HNSW index on embeddings afterwards: "
              + (", ".join(f"{n} ({'valid' if ok else 'INVALID'})" for n, ok in indexes) or "still NONE"))
        for line in index_lines(self.cluster, *key):
            print(f"      {key[0]}: {line[:230]}")

    # -- the whole run -----------------------------------------------------------------------------------
    def run(self) -> None:
        args = self.args
        total = args.portals * args.datasets_per_portal
        say(f"(B) one portal of {total:,} datasets: first sync, fresh harvester database")
        self.run_part(Part("B", f"1 portal x {total:,} datasets", {"big": total}))
        say(f"(A) {args.portals} portals of {args.datasets_per_portal:,} datasets, triggered at once: first syncs, "
            "fresh harvester database")
        part = self.run_part(Part("A", f"{args.portals} portals x {args.datasets_per_portal:,} datasets at once",
                                  {f"p{p + 1}": args.datasets_per_portal for p in range(args.portals)}))
        if not part.index_ok():
            self.follow_up(part, "p1")


def summary(bench: Bench) -> None:
    parts = {p.key: p for p in bench.parts}
    if not parts:
        return
    say("summary")
    print("| part | wall time | datasets/s | texts sent (distinct) | sent twice | longest task lock wait "
          "(continuous) | most a task statement waited in all | longest index-build wait |")
    print("|---|---|---|---|---|---|---|---|")
    for key in ("B", "A"):
        if key in parts:
            p = parts[key]
            s = p.sends
            print(f"| ({key}) {p.label} | {seconds(p.wall)} | {sum(p.portals.values()) / p.wall:,.0f} | "
                  f"{s.get('texts', 0):,} ({s.get('distinct', 0):,}) | {s.get('twice', 0)} | "
                  f"{p.longest_task_wait():.1f} s | {p.task_waits_in_all():.1f} s | {p.longest_build_wait():.1f} s |")
    print("\n| goal | measured | met |")
    print("|---|---|---|")
    if "A" in parts and "B" in parts:
        ratio = parts["A"].wall / parts["B"].wall
        print(f"| A's wall time at most {GOAL_RATIO:g} x B's | {ratio:.2f} x ({parts['A'].wall:.1f} s / "
              f"{parts['B'].wall:.1f} s) | {verdict(ratio <= GOAL_RATIO)} |")
        follow = parts["A"].follow_up
        if follow:
            both = parts["A"].wall + follow["wall"]
            print(f"| the same, counting (A') the next run of {follow['portal']} that "
                  f"{'built' if follow['ok'] else 'did not build either'} the HNSW index (A left none; B's time "
                  f"includes its build) | {both / parts['B'].wall:.2f} x (({parts['A'].wall:.1f} s + "
                  f"{follow['wall']:.1f} s) / {parts['B'].wall:.1f} s) | {verdict(both <= GOAL_RATIO * parts['B'].wall)} |")
    for key in ("B", "A"):
        if key in parts:
            p = parts[key]
            names = ", ".join(n for n, _ in p.indexes) or "none"
            print(f"| ({key}) ends with the model's HNSW index built and valid | {names} | {verdict(p.index_ok())} |")
    worst = max(p.longest_task_wait() for p in parts.values())
    in_all = max(p.task_waits_in_all() for p in parts.values())
    print(f"| longest lock wait of a task statement (continuous): a few seconds (at most {GOAL_LOCK_WAIT:g} s; "
          f"index builds apart) | {worst:.1f} s (one statement waited {in_all:.1f} s in all) | "
          f"{verdict(worst <= GOAL_LOCK_WAIT)} |")
    twice = sum(p.sends.get("twice", 0) for p in parts.values())
    print(f"| no text sent to the embedding API more than once | {twice} | {verdict(twice == 0)} |")
    retried = [f"{r['dag_id']}: {x}" for p in parts.values() for r in p.runs for x in r["retried"]]
    print(f"| no task needed a retry | {len(retried)}{': ' + ', '.join(retried[:4]) if retried else ''} | "
          f"{verdict(not retried)} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--portals", type=int, default=8, help="portals in part A (default 8)")
    parser.add_argument("--datasets-per-portal", type=int, default=12_500,
                        help="datasets of each portal in A (default 12500); B's portal has portals x this many")
    parser.add_argument("--home", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the bench makes its working directory (default $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory afterwards")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds each part may take (default 3600)")
    args = parser.parse_args()
    if args.portals < 1 or args.datasets_per_portal < 1:
        parser.error("--portals and --datasets-per-portal must be at least 1")

    args.home.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="concurrency-bench-", dir=args.home))
    bench = Bench(args, home)
    started = time.perf_counter()
    status = 0
    try:
        bench.start()
        bench.run()
    except (BenchError, AssertionError) as exc:  # AssertionError: the cluster harness's ClusterError
        print(f"\nconcurrency_bench: {type(exc).__name__}: {exc}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        status = 130
    finally:
        summary(bench)
        bench.stop()
        if args.keep or status:
            print(f"\nworking directory kept: {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    print(f"\nbench finished in {seconds(time.perf_counter() - started)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
