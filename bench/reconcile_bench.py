"""Benchmark: what a reconciliation costs against a full sync, on the same drifted portal.

A synthetic catalogue (derived from the real CKAN samples, like harvest_bench.py) is harvested once.
Then the portal drifts the ways an incremental run cannot see: datasets deleted, records edited
with a metadata_modified older than any lookback, datasets published late with old timestamps.
The harvested database is cloned twice (CREATE DATABASE ... TEMPLATE) and the same portal is
brought back in sync both ways, each through the pipeline's real steps over real HTTP:

  (a) a full sync: every record downloaded again in full;
  (b) an incremental run that reconciles: identifiers and modification times only, then the
      records that differ fetched by id.

Both runs go through the pipeline's steps one by one, as the DAG's tasks call them, timed each.

It prints requests, bytes received and wall time of both side by side, their ratios, and whether
both copies ended identical. Prints figures; asserts nothing about time.

    .venv/bin/python bench/reconcile_bench.py --datasets 20000
"""
from __future__ import annotations

import argparse
import copy
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "bench")]

from harvest_bench import synthetic  # noqa: E402  (the same records as the harvest benchmark)


def drift(portal_server, records: list[dict], rng: random.Random, share: float) -> dict[str, int]:
    """Deletions, stale edits and late arrivals, ``share`` of the catalogue each (at least one)."""
    n = max(1, int(len(records) * share))
    picked = rng.sample(range(len(records)), 2 * n)
    for i in picked[:n]:
        portal_server.remove_record(records[i]["id"])
    for i in picked[n:]:  # edited, but indexed with a timestamp a second after the old one
        rec = copy.deepcopy(records[i])
        rec["title"] += " (corrected)"
        rec["metadata_modified"] = rec["metadata_modified"][:17] + f"{(int(rec['metadata_modified'][17:19]) + 1) % 60:02d}" \
            + rec["metadata_modified"][19:]
        portal_server.upsert_record(rec)
    late = synthetic(len(records) + n, seed=7)[len(records):]
    for rec in late:  # published now, but carrying timestamps from long ago
        rec["metadata_modified"] = rec["metadata_modified"].replace("2024-", "2023-", 1)
        portal_server.upsert_record(rec)
    return {"deleted": n, "edited behind the lookback": n, "published late": n}


def clone(admin_url: str, source: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')


STEPS = ("fetch_modified", "reconcile", "hash_compare", "embed_changed", "upsert")


def timed_run(pipeline, conn, reader, portal, provider, **plan) -> tuple[dict, dict]:
    """One run through the pipeline's steps (as the DAG runs them), timing each."""
    client = pipeline.source_for(portal)
    run_id = pipeline.begin(conn, portal, **plan)["run_id"]
    times = {}
    for step in STEPS:
        started = time.perf_counter()
        if step == "fetch_modified":
            pipeline.fetch_modified(conn, portal, run_id, client)
        elif step == "reconcile":
            pipeline.reconcile(conn, portal, run_id, client)
        elif step == "hash_compare":
            pipeline.hash_compare(conn, reader, portal, run_id, provider.model)
        elif step == "embed_changed":
            pipeline.embed_changed(conn, reader, portal, run_id, provider)
        else:
            stats = pipeline.upsert(conn, portal, run_id, provider.model, provider.max_batch)
        times[step] = time.perf_counter() - started
    return stats, times


def snapshot(conn) -> list[tuple]:
    return conn.execute("SELECT source_id, content_hash, metadata_hash, removed_at IS NULL, embedded_content_hash"
                        " FROM datasets ORDER BY source_id").fetchall()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=20000)
    parser.add_argument("--drift", type=float, default=0.001,
                        help="share of the catalogue deleted, and again edited behind the lookback, and again "
                             "published late (default 0.001 each: 20 of each in 20,000, a busy day)")
    parser.add_argument("--dimension", type=int, default=768, help="vector dimension of the local Gemini stand-in")
    parser.add_argument("--verbose", action="store_true", help="the harvester's log lines too")
    args = parser.parse_args()
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    from harvester.testing.gemini import FakeGemini

    from harvester.pipeline import steps as pipeline
    from harvester.testing.ckan_portal import DemoPortal
    from harvester.embeddings.gemini import GeminiProvider
    from harvester.config.portals import Portal
    from harvester.store import db
    from harvester.store.embedded.server import EmbeddedServer

    home = Path(tempfile.mkdtemp(prefix="harvester-reconcile-bench-"))
    server = EmbeddedServer(home)
    url = server.start()
    admin = server.url("postgres")
    os.environ["HARVESTER_EMBED_RETRY_DELAY_SECS"] = "0"
    records = synthetic(args.datasets)
    try:
        with DemoPortal(records) as portal_server, FakeGemini(valid_keys={"AIza-bench"}) as fake:
            portal = Portal(name="bench", url=portal_server.base_url, politeness_delay=0)
            provider = GeminiProvider(api_key="AIza-bench", base_url=fake.base_url, dimension=args.dimension)
            started = time.perf_counter()
            with db.prepare(db.connect_url(url)) as conn, db.prepare(db.connect_url(url)) as reader:
                stats = pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider, full_sync=True)
            print(f"set-up: first full sync of {args.datasets} datasets in {time.perf_counter() - started:.1f}s "
                  f"(created={stats['created']})")
            made = drift(portal_server, records, random.Random(3), args.drift)
            print("portal drift an incremental run cannot see: " + ", ".join(f"{v} {k}" for k, v in made.items()))
            for name in ("bench_full", "bench_reconcile"):
                clone(admin, "harvester", name)

            results = {}
            for label, name, kwargs in (("full sync", "bench_full", {"full_sync": True}),
                                        ("reconciliation", "bench_reconcile", {"reconcile": True})):
                target = server.url(name)
                with db.prepare(db.connect_url(target)) as conn, db.prepare(db.connect_url(target)) as reader:
                    started = time.perf_counter()
                    stats, times = timed_run(pipeline, conn, reader, portal, provider, **kwargs)
                    took = time.perf_counter() - started
                    results[label] = (took, stats, snapshot(conn), times)

        full_took, full, full_rows, full_times = results["full sync"]
        rec_took, rec, rec_rows, rec_times = results["reconciliation"]
        print()
        print(f"{'':28s} {'full sync':>14s} {'reconciliation':>15s}")
        for key, a, b in (
                ("wall time (s)", f"{full_took:.1f}", f"{rec_took:.1f}"),
                *((f"  {step} (s)", f"{full_times[step]:.1f}", f"{rec_times[step]:.1f}") for step in STEPS),
                ("portal requests", full["portal_requests"], rec["portal_requests"]),
                ("bytes received", f"{full['portal_bytes']:,}", f"{rec['portal_bytes']:,}"),
                ("records fetched in full", full["fetched"], rec["fetched"]),
                ("ids listed", "-", rec.get("reconcile_listed", 0)),
                ("missing / stale found", "-", f"{rec.get('reconcile_missing', 0)} / {rec.get('reconcile_stale', 0)}"),
                ("created", full["created"], rec["created"]),
                ("updated", full["updated"], rec["updated"]),
                ("removed", full["removed"], rec["removed"]),
                ("embedding requests", full["embedding_requests"], rec["embedding_requests"])):
            print(f"{key:28s} {a!s:>14s} {b!s:>15s}")
        print()
        print(f"the reconciliation received {full['portal_bytes'] / max(1, rec['portal_bytes']):.1f}x fewer bytes "
              f"and took {rec_took / full_took:.2f} of the full sync's time "
              f"({full_took / rec_took:.1f}x faster), in {rec['portal_requests']} requests against "
              f"{full['portal_requests']}")
        same = full_rows == rec_rows
        print(f"both copies identical (ids, hashes, removals, vectors linked): {'yes' if same else 'NO'} "
              f"({len(rec_rows)} datasets, {sum(1 for r in rec_rows if r[3])} live)")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak memory of this process (harvester + local portal + Gemini server): {rss:.0f} MiB")
        return 0 if same else 1
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)  # the database: gigabytes at scale


if __name__ == "__main__":
    sys.exit(main())
