"""Benchmark: the exact peak RSS of a first sync of real-shaped records, by page size and by
catalogue size (issue 40: <= 400 MiB, flat from 100- to 1,000-record pages and from 10k to 1M
datasets).

Each run is a full sync through `airflow dags test harvest_bench -c '{"full_sync": true}'` into a
fresh database, its peak RSS measured exactly (ru_maxrss of the largest process of the run, from
wait4 in first_sync_bench's launcher: nothing of this bench's memory is inherited). The portal is
ScalePortal (plugins/harvester/testing/scale_portal.py) in its "real" shape: records made on demand
from the real data.gov, data.gov.uk and dados.gov.br records (their resources lists as they are,
about 13 KB a record: a 1,000-record page is about 14 MB of JSON), new ids, names and varied text.
The portal and the local Gemini-protocol embedding server run in processes of their own, and
PostgreSQL is the embedded server: none of them counts in a run's RSS.

    .venv/bin/python bench/memory_bench.py             # page sizes 100..1000 at 10k, then 100k at 1000 (~12 min)
    .venv/bin/python bench/memory_bench.py --quick     # page sizes 100 and 1000 at 3k (~3 min)
    .venv/bin/python bench/memory_bench.py --million   # also 1M at 1000 (long: an hour or more)

Prints a table with the goal beside each figure; asserts nothing: the exit status is 0 unless
something broke (a failed run, a server that did not start).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "bench")]

from first_sync_bench import (FLOOR_DAG, PORTAL, Bench, BenchError, LocalServer,  # noqa: E402
                              _serve_gemini, say, serve_until_told)

GOAL_RSS_MIB = 400.0
GOAL_FLAT_MIB = 40.0
STEP_LINE = re.compile(r"\] (begin|fetch_modified|reconcile|hash_compare|embed_changed|upsert): ")
PEAK_LINE = re.compile(r"memory +\d+ MB resident, peak (\d+) MB")
STEPS = ("begin", "fetch_modified", "hash_compare", "embed_changed", "upsert")  # "flat": the spread across page sizes, and across catalogue sizes, at most this


def _serve_real_portal(datasets: int, pipe) -> None:
    """Child process: ScalePortal of ``datasets`` real-shaped records until told to stop."""
    from harvester.testing.scale_portal import ScalePortal

    serve_until_told(ScalePortal(datasets, shape="real"), pipe)


class MemoryBench(Bench):
    """first_sync_bench's Bench (environment, `airflow dags test` through the wait4 launcher,
    sync_runs), with a real-shaped portal per catalogue size and a portal entry per page size."""

    def start(self) -> None:
        from harvester.store.embedded.server import EmbeddedServer

        self.gemini.append(LocalServer("local Gemini-protocol server", _serve_gemini, 0.0, "words"))
        self.server = EmbeddedServer(self.home / "pg")
        self.server.start()
        self.pg_pid = int((self.server.pgdata / "postmaster.pid").read_text().split()[0])
        dags = self.home / "dags"
        dags.mkdir(parents=True)
        shutil.copy(ROOT / "dags" / "harvest_portals.py", dags / "harvest_portals.py")
        (dags / "harvest_floor.py").write_text(FLOOR_DAG)
        env = self.env("postgres", "http://127.0.0.1:9")
        self.airflow(env, "db", "migrate")
        self.airflow(env, "pools", "set", env["HARVESTER_EMBEDDING_POOL"], "2", "Embedding provider calls (memory_bench)")
        self.gemini[0].wait_ready()

    def portal_for(self, datasets: int) -> str:
        if self.portal is not None and self.portal_size != datasets:
            self.portal.stop()
            self.portal = None
        if self.portal is None:
            self.portal = LocalServer("local CKAN portal (real shape)", _serve_real_portal, datasets)
            self.portal_size = datasets
        return self.portal.wait_ready()

    def sync(self, datasets: int, page_size: int) -> dict:
        import yaml

        url = self.portal_for(datasets)
        entry = {"name": PORTAL, "url": url, "schedule": None, "enabled": True, "politeness_delay": 0.0,
                 "page_size": page_size}
        (self.home / "portals.yaml").write_text(yaml.safe_dump({"portals": [entry]}))
        database = f"mem_{datasets}_{page_size}"
        self.create_database(database)
        t0 = time.perf_counter()
        stage = self.dag_test("m", f"{datasets} at {page_size}", "harvest_bench", database, self.gemini[0],
                              {"full_sync": True})
        wall = time.perf_counter() - t0
        if stage.datasets != datasets:
            raise BenchError(f"the sync of {datasets} fetched {stage.datasets}")
        row = {"datasets": datasets, "page_size": page_size, "exact": stage.exact_rss, "polled": stage.peak_rss,
               "wall": wall, "bytes": stage.stats.get("portal_bytes"), "steps": self.step_peaks()}
        say(f"{datasets:,} datasets, pages of {page_size}: peak RSS {stage.exact_rss:.0f} MiB exactly "
            f"(polled tree {stage.peak_rss:.0f}), {wall:.0f} s")
        self.drop_database(database)  # (the disk it took is not needed any more)
        return row

    def step_peaks(self) -> dict[str, float]:
        """The process's peak (MB) at the end of each task of the last run, from its log's summary
        lines (``memory ... peak N MB``): where the peak was reached."""
        logs = sorted((self.home / "logs").glob("m-*.log"), key=lambda p: p.stat().st_mtime)
        peaks: dict[str, float] = {}
        task = None
        for line in logs[-1].read_text(errors="replace").splitlines() if logs else []:
            found = STEP_LINE.search(line)
            if found:
                task = found.group(1)
            found = PEAK_LINE.search(line)
            if found and task:
                peaks[task] = max(peaks.get(task, 0.0), float(found.group(1)))
        return peaks

    def drop_database(self, database: str) -> None:
        import psycopg

        with psycopg.connect(self.db_url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def table(rows: list[dict]) -> None:
    print()
    print("| datasets | page size | peak RSS, exact (wait4) | goal | polled tree | first sync | "
          "the process's peak after each step (MB): " + " / ".join(STEPS) + " |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ok = "yes" if r["exact"] <= GOAL_RSS_MIB else "NO"
        steps = " / ".join(f"{r['steps'][s]:.0f}" if s in r.get("steps", {}) else "-" for s in STEPS)
        print(f"| {r['datasets']:,} | {r['page_size']} | {r['exact']:.0f} MiB | <= {GOAL_RSS_MIB:.0f} MiB: {ok} "
              f"| {r['polled']:.0f} MiB | {r['wall']:.0f} s | {steps} |")
    for label, group in (("page sizes", {}), ("catalogue sizes", {})):
        for r in rows:
            k = r["datasets"] if label == "page sizes" else r["page_size"]
            group.setdefault(k, []).append(r["exact"])
        for k, peaks in group.items():
            if len(peaks) > 1:
                spread = max(peaks) - min(peaks)
                ok = "yes" if spread <= GOAL_FLAT_MIB else "NO"
                what = f"at {k:,} datasets" if label == "page sizes" else f"at pages of {k}"
                print(f"flat across {label} {what}: {min(peaks):.0f}..{max(peaks):.0f} MiB, spread {spread:.0f} MiB "
                      f"(goal <= {GOAL_FLAT_MIB:.0f}: {ok})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="page sizes 100 and 1000 at 3,000 datasets only")
    parser.add_argument("--pages-at", type=int, default=10_000, help="catalogue size of the page-size runs")
    parser.add_argument("--page-sizes", default="100,250,500,1000")
    parser.add_argument("--sizes", default="100000", help="catalogue sizes at pages of 1000 (besides --pages-at)")
    parser.add_argument("--million", action="store_true", help="also 1,000,000 datasets at pages of 1000 (long)")
    parser.add_argument("--home", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.pages_at, args.page_sizes, args.sizes = 3000, "100,1000", ""
    plan = [(args.pages_at, int(p)) for p in args.page_sizes.split(",") if p.strip()]
    plan += [(int(n), 1000) for n in args.sizes.split(",") if n.strip()]
    if args.million:
        plan.append((1_000_000, 1000))
    # (first_sync_bench's Bench reads these)
    args.datasets, args.vectors, args.log_statements, args.politeness_delay = args.pages_at, "words", None, 0.0
    home = Path(tempfile.mkdtemp(prefix="memory-bench-", dir=args.home))
    bench = MemoryBench(args, home)
    bench.portal_size = None
    say(f"memory bench: {plan} (datasets, page size); home {home}; {os.cpu_count()} CPUs")
    rows: list[dict] = []
    broke = False
    try:
        bench.start()
        for datasets, page_size in plan:
            rows.append(bench.sync(datasets, page_size))
    except BenchError as exc:
        print(f"BROKEN: {exc}")
        broke = True
    finally:
        bench.stop()
        table(rows)
        if not (args.keep or broke):
            shutil.rmtree(home, ignore_errors=True)
        print(json.dumps(rows))
    return 1 if broke else 0


if __name__ == "__main__":
    sys.exit(main())
