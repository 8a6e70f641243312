"""Benchmark: portals re-keying their datasets for duplicate grouping at once, under a real scheduler.

Grouping cross-portal duplicates (store/duplicates.py) writes every group under one lock for all
portals: a portal that re-keys many datasets (its first scan, or every portal after an upgrade that
changes the keys) holds it for as long as its keys and grouping take. This bench measures what that
costs the other portals' runs, through ONE real Airflow (plugins/harvester/testing/airflow_cluster.py:
`airflow scheduler`, `airflow dag-processor`, `airflow api-server` as processes, LocalExecutor, every
task its own process), the harvester database and Airflow's metadata in the embedded PostgreSQL:

(1) --portals portals (4) of --datasets datasets each (100,000), first syncs triggered at the same
    moment: each first scan keys and examines all its datasets. Portal k serves records k x
    datasets/2 .. onwards of one numbering (concurrency_bench.portion, derived from real CKAN
    samples), so neighbours share half their records (same ids, titles, texts and files): real
    groups to find, and texts the embedding server is sent once;
(2) the upgrade: every portal's keys, groups and scans deleted (what a migration that changes the
    keys does), then an incremental run of every portal triggered at the same moment: nothing
    changed at the portals, and every run re-keys and regroups all its datasets.

For each part it prints: wall time; per portal the upsert's duration and tries, what its log says
about grouping (datasets re-keyed and examined, seconds; or that it was left to a later run) and
every lock timeout its log shows; the lock waits seen in pg_stat_activity every 0.2 s (advisory
locks, the groups' lock, apart); and after the part the groups against what the records imply, and
how many of the records two neighbours share are grouped together, datasets still waiting to be
grouped, and whether the groups after the upgrade's re-keying are the groups before it. The figures that matter: no upsert rolled back (a retry, a
lock timeout in a log), the longest wait for the groups' lock by a statement holding a run's
merge, and every group complete once the part ends. Nothing about time is asserted; the exit
status is 1 when a DAG run failed or a portal is not fully harvested.

HARVESTER_LOCK_TIMEOUT_SECS is 30 (the default) and HARVESTER_TASK_RETRIES 2: an upsert that
waited past the timeout retries, and the retry is printed.

    .venv/bin/python bench/regroup_bench.py                                  # 4 x 100,000: ~20 min
    .venv/bin/python bench/regroup_bench.py --portals 3 --datasets 2000      # a smoke run (~2 min)

Options: --portals N (4), --datasets N (100000), --home DIR (working directory: embedded
PostgreSQL, Airflow home with every task's log; default $TMPDIR), --keep, --timeout SECS (per part,
3600).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT / "bench", ROOT / "plugins"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import concurrency_bench as cb  # noqa: E402  (its servers, PostgreSQL and figures)
from harvester.testing.airflow_cluster import LockWatch  # noqa: E402

LOCK_TIMEOUT_SECS = 30
GROUPING = re.compile(r"duplicates: .*")
TIMEOUT = re.compile(r"lock timeout|LockWaitTimeout|canceling statement due to lock timeout", re.I)


def _serve_portal(offset: int, count: int, pipe) -> None:
    """Child process: a local CKAN portal serving records ``offset`` .. ``offset + count - 1``, built
    as two halves of concurrency_bench.portion (deterministic per half): a neighbour serving the
    same half serves the very same records."""
    from harvester.testing.ckan_portal import DemoPortal

    half = count // 2
    records = cb.portion(offset, half) + cb.portion(offset + half, count - half)
    cb.first_sync_bench.serve_until_told(DemoPortal(records), pipe)


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


class Bench(cb.Bench):
    """concurrency_bench's set-up (its stop() and servers), with portals that share records."""

    def __init__(self, args, home: Path):
        super().__init__(args, home)
        self.db_url = ""
        self.rolled_back = 0
        self.longest_merge_wait = 0.0
        self.incomplete: list[str] = []
        self.partitions: list[set] = []

    def start(self) -> None:
        from harvester.testing.airflow_cluster import AirflowCluster, harvester_env, write_portals

        args = self.args
        say(f"{args.portals} portals of {args.datasets:,} datasets (neighbours share half); home {self.home}; "
            f"{os.cpu_count()} CPUs")
        for p in range(args.portals):
            self.portal_servers[f"p{p + 1}"] = cb.LocalServer(f"portal p{p + 1}", _serve_portal,
                                                              p * (args.datasets // 2), args.datasets)
        self.gemini = cb.LocalServer("local Gemini-protocol server", cb._serve_gemini, "words")
        self.server = cb.start_postgres(self.home / "pg")
        template = cb.create_template(self.server)
        cb.fresh_database(self.server, "airflow_meta")
        self.db_url = cb.fresh_database(self.server, "harvester", template)
        for name, srv in self.portal_servers.items():
            self.portal_urls[name] = srv.wait_ready()
        gemini_url = self.gemini.wait_ready()
        portals_file = write_portals(self.home / "portals.yaml", [
            {"name": name, "url": url, "page_size": 1000} for name, url in self.portal_urls.items()])
        env = harvester_env(self.db_url, portals_file, gemini_url=gemini_url, gemini_key=cb.GEMINI_KEY,
                            HARVESTER_LOCK_TIMEOUT_SECS=str(LOCK_TIMEOUT_SECS), HARVESTER_TASK_RETRIES="2",
                            HARVESTER_TASK_RETRY_DELAY_SECS="5", HARVESTER_EMBEDDING_POOL="default_pool")
        self.cluster = AirflowCluster(self.home / "airflow", self.server.url("airflow_meta"), env,
                                      parallelism=max(16, 4 * args.portals), start_timeout=300)
        self.cluster.start()
        dags = [f"harvest_{n}" for n in self.portal_urls]
        self.cluster.wait_for_dags(dags, timeout=180)
        for dag_id in dags:
            self.cluster.unpause(dag_id)
        print(f"Airflow up (LocalExecutor), {len(dags)} DAGs unpaused; HARVESTER_LOCK_TIMEOUT_SECS={LOCK_TIMEOUT_SECS}")

    def part(self, label: str, conf: dict) -> None:
        import psycopg

        say(label)
        started = datetime.now(timezone.utc)
        with LockWatch(self.db_url, 0.2) as locks:
            runs = self.cluster.trigger_at_once([f"harvest_{n}" for n in self.portal_urls], conf)
            states = self.cluster.wait_for(runs, timeout=self.args.timeout)
        bad = [key for key, state in states.items() if state != "success"]
        ends = []
        print(f"  {'portal':<6} {'upsert s':>9} {'tries':>5}  grouping (the upsert's log)")
        for dag_id, run_id in runs:
            run = self.cluster.run(dag_id, run_id)
            ends.append(cb.when(run.get("end_date")) or datetime.now(timezone.utc))
            for ti in self.cluster.task_instances(dag_id, run_id):
                if ti["task_id"] != "upsert":
                    continue
                tries = ti.get("try_number") or 1
                lines, timeouts = [], 0
                for attempt in range(1, tries + 1):
                    text = self.cluster.task_log(dag_id, run_id, "upsert", attempt, ti["map_index"])
                    timeouts += len(TIMEOUT.findall(text))
                    lines += [m.group(0).split('"')[0][:150] for m in GROUPING.finditer(text)]
                if tries > 1 or timeouts:
                    self.rolled_back += 1
                print(f"  {dag_id[8:]:<6} {ti.get('duration') or 0:>9.1f} {tries:>5}  "
                      f"{'; '.join(lines) or '-'}{f'  [lock timeouts in its log: {timeouts}]' if timeouts else ''}")
        print(f"  wall time {(max(ends) - started).total_seconds():.1f} s")
        advisory = [(d, w) for d, w in locks.longest() if "advisory" in w["events"]]
        merge = [d for d, w in advisory if "after commit" not in w["query"] and LockWatch.kind(w) == "task"]
        print(f"  waits for the groups' lock (advisory): {len(advisory)} statements, longest "
              f"{max((d for d, _ in advisory), default=0):.1f} s")
        for d, w in advisory[:6]:
            print(f"    {d:6.1f} s  {w['app']}: {w['query'][:110]}")
        self.longest_merge_wait = max([self.longest_merge_wait, *merge])
        for line in locks.report(top=4):
            print(line)
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            live = dict(conn.execute("SELECT portal_url, count(*) FROM datasets WHERE removed_at IS NULL "
                                     "GROUP BY portal_url").fetchall())
            groups, members = conn.execute("SELECT count(DISTINCT group_id), count(*) FROM duplicate_members").fetchone()
            pending = conn.execute("SELECT count(*) FROM duplicate_pending").fetchone()[0] if conn.execute(
                "SELECT to_regclass('duplicate_pending')").fetchone()[0] else 0
            unscanned = conn.execute("SELECT count(*) FROM (SELECT DISTINCT portal_url FROM datasets) d WHERE NOT "
                                     "EXISTS (SELECT 1 FROM duplicate_scans s WHERE s.portal_url = d.portal_url)"
                                     ).fetchone()[0]
            # the records two neighbours share (one id on both), and how many of them are grouped together
            shared, together = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE ma.group_id = mb.group_id) FROM datasets a"
                " JOIN datasets b ON b.source_id = a.source_id AND b.portal_url > a.portal_url"
                " LEFT JOIN duplicate_members ma ON ma.dataset_id = a.id"
                " LEFT JOIN duplicate_members mb ON mb.dataset_id = b.id").fetchone()
            partition = {frozenset(r[0]) for r in conn.execute(
                "SELECT array_agg(d.portal_url || ' ' || d.source_id) FROM duplicate_members m"
                " JOIN datasets d ON d.id = m.dataset_id GROUP BY m.group_id")}
        print(f"  groups: {groups:,} holding {members:,} datasets; records shared by two neighbours grouped "
              f"together: {together:,} of {shared:,}; datasets waiting to be grouped: {pending:,}; portals never "
              f"scanned: {unscanned}")
        if self.partitions:
            print(f"  the groups are {'the same as' if partition == self.partitions[-1] else 'NOT the same as'} "
                  "after the part before")
            if partition != self.partitions[-1]:
                self.incomplete.append(label)
        self.partitions.append(partition)
        if pending or unscanned:
            self.incomplete.append(label)
        if bad:  # (after the figures: what a failed run did is the finding)
            raise cb.BenchError(f"DAG runs did not succeed: {bad}\n{self.cluster.describe(bad)}")
        short = [f"{n}: {live.get(u, 0):,}" for n, u in self.portal_urls.items() if live.get(u, 0) != self.args.datasets]
        if short:
            raise cb.BenchError(f"portals not fully harvested: {short}")

    def run(self) -> None:
        import psycopg

        self.part(f"(1) first syncs of {self.args.portals} portals at once: every first scan keys all its datasets",
                  {"full_sync": True})
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            conn.execute("DELETE FROM duplicate_members; DELETE FROM dataset_keys; DELETE FROM duplicate_scans")
        self.part(f"(2) after an upgrade that changes the keys: {self.args.portals} incremental runs at once, each "
                  f"re-keying all its datasets", {})
        say("summary")
        print(f"  upserts rolled back (a retry or a lock timeout in the log): {self.rolled_back}")
        print(f"  longest wait for the groups' lock by a statement of a run's merge: {self.longest_merge_wait:.1f} s")
        print(f"  parts whose groups were not complete at their end: {self.incomplete or 'none'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--portals", type=int, default=4)
    parser.add_argument("--datasets", type=int, default=100_000)
    parser.add_argument("--home", type=Path)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--timeout", type=float, default=3600)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="regroup-bench-", dir=args.home))
    bench = Bench(args, home)
    broke = False
    try:
        bench.start()
        bench.run()
    except cb.BenchError as exc:
        broke = True
        print(f"\nBROKE: {exc}", file=sys.stderr)
    finally:
        bench.stop()
        if broke or args.keep:
            print(f"working directory kept: {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    return 1 if broke else 0


if __name__ == "__main__":
    sys.exit(main())
