"""Benchmark: a full sync and an incremental run of a large synthetic catalogue, end to end.

Records are derived from the real CKAN samples in ../shared/ckan-samples (new ids and names, varied
text), served by the local CKAN portal over HTTP; vectors come from the Gemini provider (the real
google-genai SDK) talking to the local Gemini-protocol server of the tests, so the figures are the
harvester's own cost: paging, hashing, COPY, set-based SQL, batching. Prints figures; asserts
nothing about time.

    .venv/bin/python bench/harvest_bench.py --datasets 20000 --changed 0.01
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins")]
SAMPLES = Path(os.environ.get("HARVESTER_SAMPLES_DIR") or ROOT.parent / "shared" / "ckan-samples")


def synthetic(n: int, seed: int = 1) -> list[dict]:
    base = []
    for name in ("catalog-data-gov.jsonl", "dados-gov-br.jsonl", "data-gc-ca-snapshot-2013-06-17T12-30.jsonl"):
        with (SAMPLES / name).open(encoding="utf-8") as handle:
            base += [json.loads(line) for line in handle]
    rng = random.Random(seed)
    out = []
    for i in range(n):
        rec = copy.deepcopy(base[i % len(base)])
        rec["id"] = f"bench-{i:07d}"
        rec["name"] = f"{rec.get('name') or 'dataset'}-{i}"
        rec["title"] = f"{rec.get('title') or rec['name']} #{i}"
        rec["metadata_modified"] = f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:{rng.randrange(60):02d}.{i % 1000000:06d}"
        out.append(rec)
    return out


def edit_some(records: list[dict], portal_server, share: float, seed: int = 2) -> list[int]:
    """Retitle ``share`` of ``records`` on the local portal (a newer metadata_modified), as an
    incremental run then finds them; returns their positions."""
    edited = random.Random(seed).sample(range(len(records)), int(len(records) * share))
    for i in edited:
        rec = copy.deepcopy(records[i])
        rec["title"] += " (revised)"
        rec["metadata_modified"] = "2030-01-01T00:00:00"
        portal_server.upsert_record(rec)
    return edited


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=20000)
    parser.add_argument("--changed", type=float, default=0.01, help="share of datasets edited before run 2")
    args = parser.parse_args()

    from harvester.testing.gemini import FakeGemini

    from harvester.pipeline import steps as pipeline
    from harvester.testing.ckan_portal import DemoPortal
    from harvester.embeddings.gemini import GeminiProvider
    from harvester.config.portals import Portal
    from harvester.store import db
    from harvester.store.embedded.server import EmbeddedServer

    home = Path(tempfile.mkdtemp(prefix="harvester-bench-"))
    server = EmbeddedServer(home)
    url = server.start()
    os.environ["HARVESTER_EMBED_RETRY_DELAY_SECS"] = "0"
    records = synthetic(args.datasets)
    try:
        with DemoPortal(records) as portal_server, FakeGemini(valid_keys={"AIza-bench"}) as fake:
            portal = Portal(name="bench", url=portal_server.base_url, politeness_delay=0)
            provider = GeminiProvider(api_key="AIza-bench", base_url=fake.base_url)
            with db.prepare(db.connect_url(url)) as conn, db.prepare(db.connect_url(url)) as reader:
                for label, full in (("full sync", True), ("incremental, nothing changed", False)):
                    started = time.perf_counter()
                    stats = pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider, full_sync=full)
                    took = time.perf_counter() - started
                    print(f"{label:32s} {took:7.1f}s  {args.datasets / took if full else 0:8.0f} datasets/s  "
                          f"fetched={stats['fetched']} created={stats['created']} embedded={stats['embedded']} "
                          f"requests={stats['embedding_requests']} portal_requests={stats['portal_requests']}")
                edited = edit_some(records, portal_server, args.changed)
                started = time.perf_counter()
                stats = pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider)
                took = time.perf_counter() - started
                print(f"{'incremental, ' + str(len(edited)) + ' titles edited':32s} {took:7.1f}s  "
                      f"fetched={stats['fetched']} updated={stats['updated']} embedded={stats['embedded']} "
                      f"requests={stats['embedding_requests']} portal_requests={stats['portal_requests']}")
                size = conn.execute("SELECT pg_size_pretty(pg_database_size(current_database()))").fetchone()[0]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak memory of this process (harvester + local portal + Gemini server): {rss:.0f} MiB; database {size}")
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)  # the database: gigabytes at scale
    return 0


if __name__ == "__main__":
    sys.exit(main())
