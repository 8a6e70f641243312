"""Benchmark: an OpenDataSoft catalogue past the Explore API's 10,000 window (issue 36).

A synthetic catalogue of ``--datasets`` datasets (12,000 by default) derived from the real recorded
answers of tests/data/opendatasoft (what sources_bench.py builds), served by the local Explore v2.1
portal (plugins/harvester/testing/opendatasoft_portal.py, which keeps the API's documented limits:
``limit`` at most 100, ``offset + limit`` at most 10,000, no ``>`` on text fields) in a child
process over real HTTP. Two parts:

1. the source alone (``OpenDataSoftSource``): a full listing, a listing of 10,500 changed datasets
   (``--changed``) and an identifier listing, each timed, with its requests (records endpoint pages
   and exports) and bytes received, then run again under tracemalloc for the peak of Python's
   allocations while it ran: the export is parsed a dataset at a time, never held whole;
2. a first sync through the pipeline's real steps into the embedded PostgreSQL (sources_bench.py's
   ``bench_kind``: begin, fetch_modified, reconcile, hash_compare, embed_changed, upsert, without
   Airflow, vectors from the local Gemini-protocol stand-in), then a no-change run: wall time,
   portal requests and bytes, datasets stored.

Prints figures; asserts nothing about time; exits 1 if a listing is not exact.

    .venv/bin/python bench/opendatasoft_bench.py                  # 12,000 datasets
    .venv/bin/python bench/opendatasoft_bench.py --datasets 30000 --part source
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "bench")]


def _serve(n: int, changed: int, pipe) -> None:
    """In a process of its own: sources_bench's OpenDataSoft catalogue, the first ``changed``
    datasets modified in June 2024, served until "stop"."""
    from sources_bench import opendatasoft_server

    server, url = opendatasoft_server(n)
    for ident in sorted(server.datasets)[:changed]:
        server.datasets[ident]["metas"]["default"]["modified"] = "2024-06-01T00:00:00+00:00"
    with server:
        pipe.send(url())
        pipe.recv()


@contextlib.contextmanager
def served(n: int, changed: int):
    """The portal in a child process (as sources_bench.served, for the same reason: the stand-in's
    datasets are not walked by this process's garbage collector while it is measured)."""
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(n, changed, theirs), daemon=True, name="opendatasoft-portal")
    proc.start()
    try:
        if not mine.poll(600):
            raise RuntimeError("the local OpenDataSoft portal did not start within 600 s")
        yield mine.recv()
    finally:
        with contextlib.suppress(OSError):
            mine.send("stop")
        proc.join(30)
        if proc.is_alive():
            proc.terminate()
            proc.join(10)


def part_source(n: int, changed: int) -> bool:
    """The source alone: a full listing, an incremental one and an identifier listing."""
    from harvester.http import HttpFetcher
    from harvester.sources.base import Listing
    from harvester.sources.opendatasoft import OpenDataSoftSource

    exact = True
    print("| listing | datasets | complete | time | requests | bytes | peak Python allocations |")
    print("|---|---|---|---|---|---|---|")
    with served(n, changed) as url:
        since = datetime(2024, 5, 1, tzinfo=timezone.utc)
        for label, kind in (("full", None), (f"incremental ({changed:,} changed)", since), ("identifiers", "ids")):
            figures = []
            for traced in (False, True):   # timed without tracemalloc (it slows parsing down), then traced
                source = OpenDataSoftSource(url, fetcher=HttpFetcher(url, sleep=lambda s: None))
                listing = Listing()
                if traced:
                    tracemalloc.start()
                started = time.perf_counter()
                if kind == "ids":
                    ids = [i for page in source.list_ids(100) for i, _ in page.ids]
                    complete = True  # (a cut identifier listing raises)
                else:
                    ids = [ds["dataset_id"] for page in source.iter_items(kind, 100, listing) for ds in page]
                    complete = listing.complete
                took = time.perf_counter() - started
                peak = tracemalloc.get_traced_memory()[1] if traced else 0
                tracemalloc.stop()
                figures.append((took, peak, source, ids, complete))
            (took, _, source, ids, complete), (_, peak, _, _, _) = figures
            want = changed if kind is since else n
            ok = len(ids) == len(set(ids)) == want
            exact &= ok
            print(f"| {label} | {len(ids):,}{'' if ok else f' (want {want:,})'} | {complete} | {took:.2f} s | "
                  f"{source.requests_made} | {source.bytes_received / 1e6:.1f} MB | {peak / 1e6:.1f} MB |", flush=True)
    return exact


def part_sync(n: int, dimension: int) -> bool:
    """A first sync and a no-change run through the pipeline's steps (sources_bench.bench_kind)."""
    import psycopg

    from sources_bench import bench_kind

    from harvester.embeddings.gemini import GeminiProvider
    from harvester.store.embedded.server import EmbeddedServer
    from harvester.testing.gemini import FakeGemini

    home = Path(tempfile.mkdtemp(prefix="harvester-ods-bench-"))
    server = EmbeddedServer(home)
    url = server.start()
    os.environ["HARVESTER_EMBED_RETRY_DELAY_SECS"] = "0"
    try:
        template = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        with psycopg.connect(server.url("postgres"), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "bench_ods" TEMPLATE "{template}"')
        with FakeGemini(valid_keys={"AIza-bench"}) as fake:
            provider = GeminiProvider(api_key="AIza-bench", base_url=fake.base_url, dimension=dimension)
            r = bench_kind("opendatasoft", n, server.url("bench_ods"), provider)
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
    first, inc = r["first"], r["incremental"]
    print("| run | datasets stored | time | portal requests | bytes |")
    print("|---|---|---|---|---|")
    print(f"| first sync | {r['stored']:,} | {first['took']:.1f} s | {first['portal_requests']} | "
          f"{first['portal_bytes'] / 1e6:.1f} MB |")
    print(f"| no-change run | {r['stored']:,} | {inc['took']:.2f} s | {inc['portal_requests']} | "
          f"{inc['portal_bytes'] / 1e3:.1f} KB |")
    print("first sync by step: " + ", ".join(f"{k} {v:.1f}s" for k, v in first["times"].items()), flush=True)
    return r["stored"] == n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=12_000, help="synthetic datasets (default 12,000)")
    parser.add_argument("--changed", type=int, default=10_500, help="datasets changed for the incremental listing")
    parser.add_argument("--part", choices=("source", "sync", "both"), default="both")
    parser.add_argument("--dimension", type=int, default=768, help="vector dimension of the local Gemini stand-in")
    args = parser.parse_args()
    if not 0 <= args.changed <= args.datasets:
        parser.error(f"--changed {args.changed} must be between 0 and --datasets ({args.datasets})")
    ok = True
    print(f"OpenDataSoft, {args.datasets:,} synthetic datasets, local Explore v2.1 portal (documented limits) "
          f"over HTTP\n")
    if args.part in ("source", "both"):
        ok &= part_source(args.datasets, args.changed)
        print()
    if args.part in ("sync", "both"):
        ok &= part_sync(args.datasets, args.dimension)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
