"""Benchmark: harvest DAGs under Airflow's CeleryExecutor, two Celery workers, several portals at once.

A real Airflow (plugins/harvester/testing/airflow_cluster.py: `airflow scheduler`, `airflow dag-processor`, `airflow
api-server`, runs triggered and watched through the REST API) with the CeleryExecutor instead of
the LocalExecutor: a local Redis as the broker (Debian's `redis-server`, started here on a free
port of 127.0.0.1 with no persistence), the Celery result backend in PostgreSQL
(`db+postgresql://...`, a database of the embedded server), and TWO `airflow celery worker`
processes (`--celery-hostname bench-worker-1@%h` and `bench-worker-2@%h`, `--concurrency 4`
each). Both workers are on this machine, where Airflow would record the same host name for every
task: each worker's tasks report its own name instead (AIRFLOW__CORE__HOSTNAME_CALLABLE =
celery_bench.worker_hostname, reading CELERY_BENCH_WORKER, set per worker), so the REST API's task
instances say which worker ran them.

--portals portals (4) of --datasets-per-portal datasets (2,000) each; the last two (twin_a,
twin_b) republish the same records (same ids, titles, descriptions: the same texts, embedded at
the same moment by two DAG runs). Records are plain synthetic CKAN packages (concurrency_bench's
portion(): real CKAN samples, renumbered, plain titles). Every portal is a local CKAN server
(DemoPortal); vectors come from the local Gemini-protocol server (plugins/harvester/testing/gemini.py, --vectors
words) in a process of its own, which counts every text it is sent. embed_changed is mapped over
shards of --shard-size texts (HARVESTER_EMBED_SHARD_SIZE, 500: four shards per portal, so the
executor has work to spread over the workers).

--rounds rounds (2), every portal's DAG triggered at the same moment in each: round 1 the first
syncs, each later round after --edit records (200) of every portal got new titles and
descriptions (the twins the same ones). Checked, and printed yes/NO:
* every DAG run succeeds;
* every portal's live datasets equal its source (ids and titles);
* no text is sent to the embedding API twice (per round and over all rounds);
* the model's HNSW index is there and valid at the end;
* tasks ran on both workers (the task instances' `hostname`, REST API);
* lock waits, sampled every 0.2 s from pg_stat_activity of the harvester database (as
  concurrency_bench: every backend, the index build's waits apart): no task statement waited
  longer than HARVESTER_LOCK_TIMEOUT_SECS (30 here; longer fails the statement). The longest wait
  is printed beside "a few seconds" (5 s) as a figure.
Also printed: wall time and per-portal task durations of each round, which worker ran what.
Exit status 0 when every check holds, 1 when one does not or something broke (a server did not
start, a run did not end in time).

Needs, besides the project's venv:
    .venv/bin/pip install -r requirements-celery.txt     # apache-airflow-providers-celery for Airflow 3.3.2
    apt-get update && apt-get install -y redis-server    # the broker (only the binary is used)

    .venv/bin/python bench/celery_bench.py               # 4 portals x 2,000 datasets, 2 rounds: ~1 min
    .venv/bin/python bench/celery_bench.py --portals 6 --datasets-per-portal 5000 --keep

Options: --portals N (4, at least 2; the last two are twins), --datasets-per-portal N (2000),
--shard-size N (500), --concurrency N (each worker's, 4), --rounds N (2), --edit N (200), --home
DIR (where its working directory is made: PostgreSQL, Redis, the Airflow home with every task's
log and each process's output; default $TMPDIR), --keep (keep it; it is kept anyway when
something broke), --timeout SECS (per round, 1800).
"""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER_VAR = "CELERY_BENCH_WORKER"


def worker_hostname() -> str:
    """AIRFLOW__CORE__HOSTNAME_CALLABLE of the bench's Celery workers (their tasks import this module:
    keep its top cheap): the worker's own name, so two workers on one machine are told apart."""
    return os.environ.get(WORKER_VAR) or socket.getfqdn()


def main() -> int:
    import argparse
    import shutil
    import subprocess
    import tempfile
    import time
    from collections import Counter
    from datetime import datetime, timezone

    sys.path[:0] = [p for p in (str(ROOT / "bench"), str(ROOT / "plugins")) if p not in sys.path]
    import concurrency_bench as cb

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--portals", type=int, default=4, help="portals (default 4; the last two are twins)")
    parser.add_argument("--datasets-per-portal", type=int, default=2000, help="datasets of each portal (2000)")
    parser.add_argument("--shard-size", type=int, default=500, help="HARVESTER_EMBED_SHARD_SIZE (500)")
    parser.add_argument("--concurrency", type=int, default=4, help="task slots of each Celery worker (4)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of runs (2): the first syncs, then edits")
    parser.add_argument("--edit", type=int, default=200, help="records of each portal edited before rounds 2+")
    parser.add_argument("--home", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the bench makes its working directory (default $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory afterwards")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds each round may take (1800)")
    args = parser.parse_args()
    if args.portals < 2 or args.datasets_per_portal < 1 or args.rounds < 1:
        parser.error("--portals must be at least 2, --datasets-per-portal and --rounds at least 1")

    class Broken(RuntimeError):
        pass

    # -- what it needs ------------------------------------------------------------------------------
    redis_bin = shutil.which("redis-server")
    if redis_bin is None:
        print("celery_bench: redis-server is missing. Install it: apt-get update && apt-get install -y redis-server",
              file=sys.stderr)
        return 1
    from importlib.metadata import PackageNotFoundError, version

    try:  # (not imported: importing airflow here would set up an Airflow home of its own)
        for package in ("apache-airflow-providers-celery", "celery", "redis"):
            version(package)
    except PackageNotFoundError as exc:
        print(f"celery_bench: {exc} is not installed. Install the Celery provider: "
              f"{Path(sys.executable).parent / 'pip'} install -r {ROOT / 'requirements-celery.txt'}", file=sys.stderr)
        return 1

    from harvester.testing.airflow_cluster import AirflowCluster, free_port, harvester_env, write_portals
    from harvester.testing.ckan_portal import DemoPortal

    args.home.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="celery-bench-", dir=args.home))
    n = args.datasets_per_portal
    names = [f"c{i + 1}" for i in range(args.portals - 2)] + ["twin_a", "twin_b"]
    workers = [f"bench-worker-{i}" for i in (1, 2)]
    checks: list[tuple[str, str, bool]] = []  # (what, measured, met)
    server = redis_proc = gemini = cluster = None
    portals: dict[str, DemoPortal] = {}
    status = 0
    started_all = time.perf_counter()

    def now_ckan() -> str:
        return datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="microseconds")

    def source_records(name: str) -> list[dict]:
        if name.startswith("twin"):  # both twins: the same records
            return cb.portion((args.portals - 2) * n, n, plain=True)
        return cb.portion(names.index(name) * n, n, plain=True)

    def live(name: str) -> dict[str, str]:
        import psycopg

        with psycopg.connect(db_url, autocommit=True) as conn:
            return dict(conn.execute("SELECT source_id, title FROM datasets WHERE portal_url = %s AND removed_at IS NULL",
                                     (portals[name].base_url,)).fetchall())

    def mismatch(name: str) -> str | None:
        have, want = live(name), {r["id"]: r["title"] for r in portals[name].records}
        if have == want:
            return None
        missing, extra = set(want) - set(have), set(have) - set(want)
        stale = [k for k in set(have) & set(want) if have[k] != want[k]]
        return (f"{name}: {len(have)} live, {len(want)} at the source; missing {len(missing)}, not at the source "
                f"{len(extra)}, other title {len(stale)} (e.g. {[(have[k], want[k]) for k in stale[:1]]})")

    try:
        cb.say(f"CeleryExecutor, 2 workers x concurrency {args.concurrency}; {args.portals} portals x {n:,} datasets "
               f"(twin_a and twin_b: the same records), {args.rounds} rounds; home {home}; {os.cpu_count()} CPUs")
        print(f"apache-airflow {version('apache-airflow')}, apache-airflow-providers-celery "
              f"{version('apache-airflow-providers-celery')}, celery {version('celery')}, "
              f"{subprocess.run([redis_bin, '--version'], capture_output=True, text=True).stdout.strip()}")
        gemini = cb.LocalServer("local Gemini-protocol server", cb._serve_gemini, "words")

        # PostgreSQL: harvester (fresh, from the migrated template), Airflow's metadata, Celery's results
        t0 = time.perf_counter()
        server = cb.start_postgres(home / "pg")
        template = cb.create_template(server)
        db_url = cb.fresh_database(server, "harvester", template)
        cb.fresh_database(server, "airflow_meta")
        cb.fresh_database(server, "celery_results")
        print(f"embedded PostgreSQL up, databases ready ({time.perf_counter() - t0:.1f}s)")

        # Redis: no persistence, loopback only
        redis_port = free_port()
        (home / "redis").mkdir()
        with (home / "redis.out").open("ab") as out:
            redis_proc = subprocess.Popen([redis_bin, "--port", str(redis_port), "--bind", "127.0.0.1",
                                           "--protected-mode", "yes", "--save", "", "--appendonly", "no",
                                           "--dir", str(home / "redis"), "--daemonize", "no"],
                                          stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        import redis as redis_client

        deadline = time.monotonic() + 30
        while True:
            try:
                redis_client.Redis(host="127.0.0.1", port=redis_port, socket_timeout=1).ping()
                break
            except redis_client.exceptions.ConnectionError:
                if redis_proc.poll() is not None or time.monotonic() > deadline:
                    raise Broken(f"redis-server did not start: {cb_tail(home / 'redis.out')}") from None
                time.sleep(0.2)
        broker = f"redis://127.0.0.1:{redis_port}/0"
        backend = "db+" + server.url("celery_results")
        print(f"Redis broker {broker} (no persistence); result backend {backend}")

        # the portals, in this process
        for name in names:
            portals[name] = DemoPortal(source_records(name))
            portals[name].start()
        gemini_url = gemini.wait_ready()
        portals_file = write_portals(home / "portals.yaml", [{"name": name, "url": portals[name].base_url}
                                                             for name in names])
        env = harvester_env(db_url, portals_file, gemini_url=gemini_url, gemini_key=cb.GEMINI_KEY,
                            HARVESTER_LOCK_TIMEOUT_SECS=str(cb.LOCK_TIMEOUT_SECS), HARVESTER_TASK_RETRIES="1",
                            HARVESTER_TASK_RETRY_DELAY_SECS="5", HARVESTER_EMBEDDING_POOL="default_pool",
                            HARVESTER_EMBED_SHARD_SIZE=str(args.shard_size),
                            AIRFLOW__CELERY__BROKER_URL=broker, AIRFLOW__CELERY__RESULT_BACKEND=backend,
                            AIRFLOW__CELERY__WORKER_CONCURRENCY=str(args.concurrency))
        airflow_home = home / "airflow"
        extra = {}
        for i, worker in enumerate(workers, 1):
            extra[f"worker{i}"] = (
                ["celery", "worker", "--celery-hostname", f"{worker}@%h", "--concurrency", str(args.concurrency),
                 "--pid", str(airflow_home / f"worker{i}.pid"), "--skip-serve-logs"],
                {"AIRFLOW__CORE__HOSTNAME_CALLABLE": "celery_bench.worker_hostname", WORKER_VAR: worker,
                 "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT / "bench")])})
        t0 = time.perf_counter()
        cluster = AirflowCluster(airflow_home, server.url("airflow_meta"), env, executor="CeleryExecutor",
                                 extra_processes=extra, start_timeout=300)
        cluster.start()
        for i in (1, 2):
            cluster.wait_until(lambda i=i: " ready." in cb_tail(airflow_home / f"worker{i}.out", 400), 180,
                               f"Celery worker {i} to be ready")
        dags = [f"harvest_{name}" for name in names]
        cluster.wait_for_dags(dags, timeout=180)
        for dag_id in dags:
            cluster.unpause(dag_id)
        print(f"Airflow up with the CeleryExecutor, both workers ready, {len(dags)} DAGs unpaused "
              f"({time.perf_counter() - t0:.1f}s)")

        hosts_all: Counter = Counter()
        hosts_by_task: dict[str, Counter] = {}
        sends = {}
        with cb.LockWatch(db_url) as locks:
            for round_no in range(1, args.rounds + 1):
                if round_no == 1:
                    cb.say(f"round 1: first syncs of {len(names)} portals, triggered at once")
                else:
                    cb.say(f"round {round_no}: {args.edit} records of each portal edited (the twins alike), "
                           "triggered at once")
                    stamp = now_ckan()
                    for name in names:
                        for rec in portals[name].records[:args.edit]:
                            rec = dict(rec)
                            rec["title"] = f"{rec['title'].split(' (revised', 1)[0]} (revised in round {round_no})"
                            rec["notes"] = f"{rec['notes']} Revised in round {round_no}."
                            rec["metadata_modified"] = stamp
                            portals[name].upsert_record(rec)
                gemini.ask("take")
                waits_before = len(locks.waits)
                started = datetime.now(timezone.utc)
                runs = cluster.trigger_at_once(dags, {})
                states = cluster.wait_for(runs, timeout=args.timeout)
                sends = gemini.ask("take")
                bad = [k for k, s in states.items() if s != "success"]
                checks.append((f"round {round_no}: every DAG run succeeded",
                               ", ".join(f"{d} {states[(d, r)]}" for d, r in runs), not bad))
                if bad:
                    print(cluster.describe(bad))
                figures = [cb.run_figures(cluster, *key) for key in runs]
                ends = [f["end"] for f in figures if f["end"]]
                wall = (max(ends) - started).total_seconds() if ends else 0.0
                print(f"round {round_no}: {wall:.1f} s from the trigger to the end of the last run")
                print(f"    embedding API: {sends['requests']:,} requests, {sends['texts']:,} texts sent, "
                      f"{sends['distinct']:,} distinct; sent more than once: {sends['twice']} "
                      f"({sends['extra']} extra sends)")
                header = ["portal", "run"] + [t.replace("_", " ") for t in cb.TASK_ORDER] + ["tries>1", "workers"]
                rows = []
                for name, f in zip(names, figures):
                    took = (f["end"] - f["start"]).total_seconds() if f["end"] and f["start"] else 0.0
                    hosts_all.update(f["hosts"])
                    for ti in f["task_instances"]:
                        hosts_by_task.setdefault(ti["task_id"], Counter())[ti.get("hostname") or "?"] += 1
                    rows.append([name, f"{took:.1f}"] + [cb.task_cell(f["tasks"].get(t, [0.0])) for t in cb.TASK_ORDER]
                                + [", ".join(f["retried"]) or "-",
                                   ", ".join(f"{h.replace('bench-worker-', 'w')}:{c}" for h, c in sorted(f["hosts"].items()))])
                widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
                print("    per portal: run and task durations (s; embed_changed: shards: sum/longest), task instances "
                      "per worker")
                for row in [header, *rows]:
                    print("      " + "  ".join(str(x).rjust(w) for x, w in zip(row, widths)))
                differs = [m for m in (mismatch(name) for name in names) if m]
                checks.append((f"round {round_no}: every portal equals its source",
                               "; ".join(differs) or f"{len(names)} portals equal", not differs))
                checks.append((f"round {round_no}: no text sent to the embedding API twice",
                               f"{sends['twice']} of {sends['distinct']:,} distinct texts", sends["twice"] == 0))
                print(f"    lock waits seen this round: {len(locks.waits) - waits_before}")
        # over the rounds
        print("\ntask instances per worker (REST API hostname): " +
              ", ".join(f"{h}: {c}" for h, c in sorted(hosts_all.items())))
        for task in cb.TASK_ORDER:
            if task in hosts_by_task:
                print(f"    {task}: " + ", ".join(f"{h}: {c}" for h, c in sorted(hosts_by_task[task].items())))
        for line in locks.report("", top=8):
            print(line)
        indexes = cb.hnsw_indexes(db_url)
        print("HNSW index on embeddings at the end: "
              + (", ".join(f"{name} ({'valid' if ok else 'INVALID'})" for name, ok in indexes) or "NONE"))
        checks.append(("the model's HNSW index is built and valid at the end", ", ".join(n for n, _ in indexes) or "none",
                       bool(indexes) and all(ok for _, ok in indexes)))
        if args.rounds > 1:
            checks.append(("no text sent to the embedding API twice over all rounds",
                           f"{sends.get('twice_ever', 0)}", sends.get("twice_ever", 0) == 0))
        on_both = all(hosts_all.get(w, 0) > 0 for w in workers)
        checks.append(("tasks ran on both workers", ", ".join(f"{w}: {hosts_all.get(w, 0)}" for w in workers)
                       + (f"; others: {[h for h in hosts_all if h not in workers]}" if set(hosts_all) - set(workers)
                          else ""), on_both))
        task_waits = [d for kind in ("task", "other") for d, _ in locks.longest(kind)]
        longest = max(task_waits, default=0.0)
        checks.append((f"no task statement waited for a lock longer than HARVESTER_LOCK_TIMEOUT_SECS "
                       f"({cb.LOCK_TIMEOUT_SECS} s; sampled every {cb.SAMPLE_EVERY:g} s)", f"{longest:.1f} s",
                       longest <= cb.LOCK_TIMEOUT_SECS + 1.5))
        if locks.samples < 10 or locks.errors:
            checks.append(("the lock sampler worked", f"{locks.samples} samples, errors {locks.errors[:2]}", False))
        figures_only = [(f"longest task lock wait: a few seconds (at most {cb.GOAL_LOCK_WAIT:g} s)", f"{longest:.1f} s",
                         longest <= cb.GOAL_LOCK_WAIT),
                        ("longest index-build wait (blocks nobody)",
                         f"{max((d for d, _ in locks.longest('build')), default=0.0):.1f} s", True)]
    except (Broken, AssertionError) as exc:  # AssertionError: the cluster harness's ClusterError
        print(f"\ncelery_bench: {type(exc).__name__}: {exc}", file=sys.stderr)
        status = 1
        figures_only = []
    except KeyboardInterrupt:
        status = 130
        figures_only = []
    finally:
        if checks:
            cb.say("checks")
            print("| check | measured | met |")
            print("|---|---|---|")
            for what, measured, ok in checks:
                print(f"| {what} | {measured} | {cb.verdict(ok)} |")
            for what, measured, ok in figures_only:
                print(f"| (figure) {what} | {measured} | {cb.verdict(ok)} |")
        if status == 0 and not all(ok for _, _, ok in checks):
            status = 1
        if cluster is not None:
            cluster.stop()
        for portal in portals.values():
            portal.stop()
        if gemini is not None:
            gemini.stop()
        if redis_proc is not None:
            redis_proc.terminate()
            try:
                redis_proc.wait(10)
            except subprocess.TimeoutExpired:
                redis_proc.kill()
        if server is not None:
            server.stop()
        if args.keep or status:
            print(f"\nworking directory kept: {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    print(f"\nbench finished in {cb.seconds(time.perf_counter() - started_all)}; exit status {status}")
    return status


def cb_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
