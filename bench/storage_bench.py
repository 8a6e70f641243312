"""Benchmark: what a dataset costs on disk, table by table and index by index.

Harvests --datasets synthetic records (derived from ../shared/ckan-samples by
harvest_bench.synthetic, about 9 KB of JSON each) from the local CKAN portal with the Gemini
provider talking to the local Gemini-protocol server (--dimension 768 by default), below Airflow
(steps.harvest: the same steps the DAG runs), into a fresh embedded PostgreSQL; then edits
--changed of them and harvests again (each edit a second version); then VACUUM ANALYZE, and prints
every table of the schema with its heap, its TOAST and each of its indexes, in bytes per live
dataset, largest first, and their sum. What storage work must cut (issue 26) is measured here.

    .venv/bin/python bench/storage_bench.py --datasets 20000          # about 3 minutes
    .venv/bin/python bench/storage_bench.py --datasets 500 --json     # a smoke run

``--database-url`` uses an existing, migrated, empty database instead of a fresh server (the
smoke test's); ``--postgres-bin`` makes the fresh server from another PostgreSQL installation
(e.g. Debian's /usr/lib/postgresql/15/bin, with pgvector: .ci/postgres15) instead of the embedded
18; nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "bench")]

# Every relation of the public schema, with its table: the heap (with its free-space and visibility
# maps), its TOAST (with the TOAST index), each index; together, pg_total_relation_size of each table.
_SIZES = """
SELECT t.relname, 'heap', pg_table_size(t.oid) - coalesce(pg_total_relation_size(nullif(t.reltoastrelid, 0)), 0)
FROM pg_class t
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = 'public' AND t.relkind = 'r'
UNION ALL
SELECT t.relname, 'toast', pg_total_relation_size(t.reltoastrelid) FROM pg_class t
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = 'public' AND t.relkind = 'r' AND t.reltoastrelid <> 0
UNION ALL
SELECT t.relname, 'index ' || i.relname, pg_total_relation_size(i.oid) FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = 'public'
"""


def measure(conn) -> dict:
    """{datasets, versions, tables: [{table, part, bytes, per_dataset}], total_per_dataset}."""
    datasets = conn.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL").fetchone()[0]
    versions = conn.execute("SELECT count(*) FROM dataset_versions").fetchone()[0]
    rows = [(t, part, int(size)) for t, part, size in conn.execute(_SIZES).fetchall() if size]
    rows.sort(key=lambda r: -r[2])
    per = (lambda b: b / datasets) if datasets else (lambda b: 0.0)
    by_table: dict[str, int] = {}
    for table, _, size in rows:
        by_table[table] = by_table.get(table, 0) + size
    server = conn.execute("SHOW server_version").fetchone()[0]
    pgvector = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
    return {"server": f"PostgreSQL {server}, pgvector {pgvector}", "datasets": datasets, "versions": versions,
            "parts": [{"table": t, "part": p, "bytes": s, "per_dataset": round(per(s), 1)} for t, p, s in rows],
            "tables": [{"table": t, "bytes": s, "per_dataset": round(per(s), 1)}
                       for t, s in sorted(by_table.items(), key=lambda kv: -kv[1])],
            "total_per_dataset": round(per(sum(by_table.values())), 1)}


def print_report(report: dict) -> None:
    n = report["datasets"]
    print(f"\n{report['server']}: {n:,} live datasets, {report['versions']:,} versions; bytes per dataset, "
          "largest first\n")
    print("| table | bytes per dataset | of which (heap, TOAST, each index) |")
    print("|---|---|---|")
    for table in report["tables"]:
        parts = [p for p in report["parts"] if p["table"] == table["table"]]
        detail = ", ".join(f"{p['part']} {p['per_dataset']:,.0f}" for p in parts)
        print(f"| {table['table']} | {table['per_dataset']:,.0f} | {detail} |")
    print(f"| **all** | **{report['total_per_dataset']:,.0f}** | |")


def run(url: str, args) -> dict:
    from harvest_bench import edit_some, synthetic

    from harvester.config.portals import Portal
    from harvester.embeddings.gemini import GeminiProvider
    from harvester.pipeline import steps as pipeline
    from harvester.store import db
    from harvester.testing.ckan_portal import DemoPortal
    from harvester.testing.gemini import FakeGemini

    os.environ["HARVESTER_EMBED_RETRY_DELAY_SECS"] = "0"
    records = synthetic(args.datasets)
    with DemoPortal(records) as portal_server, \
            FakeGemini(valid_keys={"AIza-bench"}, vectors="words") as fake:
        portal = Portal(name="storage", url=portal_server.base_url, politeness_delay=0)
        provider = GeminiProvider(api_key="AIza-bench", base_url=fake.base_url, dimension=args.dimension)
        with db.prepare(db.connect_url(url)) as conn, db.prepare(db.connect_url(url)) as reader:
            if conn.execute("SELECT count(*) FROM datasets").fetchone()[0]:
                raise SystemExit(f"the database {url} already holds datasets: give an empty one")
            started = time.perf_counter()
            pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider, full_sync=True)
            edited = edit_some(records, portal_server, args.changed)
            pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider)
            print(f"harvested {args.datasets:,} datasets ({len(edited):,} edited once) at {args.dimension} dimensions "
                  f"in {time.perf_counter() - started:.1f} s", flush=True)
            conn.execute("VACUUM ANALYZE")
            return measure(conn)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=20000)
    parser.add_argument("--changed", type=float, default=0.01, help="share of datasets edited once (default 0.01)")
    parser.add_argument("--dimension", type=int, default=768, help="vector dimension (default 768)")
    parser.add_argument("--database-url", help="an existing, migrated, empty database instead of a fresh server")
    parser.add_argument("--postgres-bin", type=Path,
                        help="the fresh server's bin directory (initdb, pg_ctl; default: the embedded PostgreSQL 18)")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args()
    if args.database_url:
        report = run(args.database_url, args)
    else:
        from harvester.store.embedded.server import EmbeddedServer

        home = Path(tempfile.mkdtemp(prefix="harvester-storage-bench-"))
        server = EmbeddedServer(home, bin_dir=args.postgres_bin)
        try:
            report = run(server.start(), args)
        finally:
            server.stop()
            shutil.rmtree(home, ignore_errors=True)  # the database: gigabytes at 100k
    print_report(report)
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
