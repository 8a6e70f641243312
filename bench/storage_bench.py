"""Benchmark: what a dataset costs on disk, table by table and index by index (issue 40's storage goal).

Harvests --datasets synthetic records (derived from ../shared/ckan-samples by
harvest_bench.synthetic, about 9 KB of JSON each) from the local CKAN portal with the Gemini
provider talking to the local Gemini-protocol server (--dimension 768 by default), below Airflow
(steps.harvest: the same steps the DAG runs), into a fresh embedded PostgreSQL, and measures:

1. right after the first sync (no VACUUM; autovacuum as users have it: on, with its defaults);
2. after --runs incremental runs (10 by default), before each of which --changed (1%) of the
   datasets are edited on the portal (a new title: a new version, a new vector, new search rows);
   nothing vacuumed by hand between them, but autovacuum is given the time it has between real
   runs, hours apart: its naptime is 1 s on the bench's server and each run is followed by a wait
   until no table is over its autovacuum threshold (the server's defaults, the tables' own
   settings: sql/027) and no autovacuum worker is busy (--no-settle: no wait, naptime unchanged);
3. with --full-syncs N, after N full syncs of the unchanged portal (every dataset seen again, none
   changed: what a portal harvested by full syncs costs), each followed by autovacuum's time as above;
4. after a plain VACUUM (not FULL: what autovacuum gets to, without taking the tables away).

Each time it prints every table of the schema with its heap (with its free-space and visibility
maps), its TOAST (with the TOAST index) and each of its indexes, in bytes per live dataset, their
sum against the issue's goal (12,000 bytes per dataset at 768 dimensions), and how many rows the
staging tables still hold (none once a run committed: issue 40).

    .venv/bin/python bench/storage_bench.py --datasets 20000          # about 5 minutes
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


GOAL = 12_000  # bytes per dataset at 768 dimensions, raw record and full history kept (issue 40)
STAGING = ("staging_records", "staging_changes", "staging_deleted", "staging_listing", "embedding_claims")


def measure(conn) -> dict:
    """{server, datasets, versions, snapshots, parts: [{table, part, bytes, per_dataset}], tables: [{table,
    bytes, per_dataset}], total_per_dataset, staged_rows: {table: rows}}. ``snapshots``: versions that
    store their snapshot (since sql/031 the replaced ones: a current version's is its dataset's row)."""
    datasets = conn.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL").fetchone()[0]
    versions, snapshots = conn.execute("SELECT count(*), count(snapshot) FROM dataset_versions").fetchone()
    rows = [(t, part, int(size)) for t, part, size in conn.execute(_SIZES).fetchall() if size]
    rows.sort(key=lambda r: -r[2])
    per = (lambda b: b / datasets) if datasets else (lambda b: 0.0)
    by_table: dict[str, int] = {}
    for table, _, size in rows:
        by_table[table] = by_table.get(table, 0) + size
    server = conn.execute("SHOW server_version").fetchone()[0]
    pgvector = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
    staged = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in STAGING}  # (names above)
    autovacuums = conn.execute("SELECT coalesce(sum(autovacuum_count), 0) FROM pg_stat_all_tables"
                               " WHERE schemaname IN ('public', 'pg_toast')").fetchone()[0]
    return {"server": f"PostgreSQL {server}, pgvector {pgvector}", "datasets": datasets, "versions": versions,
            "snapshots": snapshots,
            "parts": [{"table": t, "part": p, "bytes": s, "per_dataset": round(per(s), 1)} for t, p, s in rows],
            "tables": [{"table": t, "bytes": s, "per_dataset": round(per(s), 1)}
                       for t, s in sorted(by_table.items(), key=lambda kv: -kv[1])],
            "total_bytes": sum(by_table.values()),
            "total_per_dataset": round(per(sum(by_table.values())), 1), "staged_rows": staged,
            "autovacuums": int(autovacuums)}


def _small(report: dict, table: str) -> bool:
    return next(t["per_dataset"] for t in report["tables"] if t["table"] == table) < 20


def print_report(stages: list[tuple[str, dict]]) -> None:
    """The tables side by side (bytes per dataset at each stage), then the last stage's parts."""
    first, last = stages[0][1], stages[-1][1]
    print(f"\n{last['server']}: {last['datasets']:,} live datasets, {last['versions']:,} versions at the end"
          f" ({last['snapshots']:,} storing their snapshot: the current one's is its dataset's row, sql/031); "
          "bytes per live dataset, largest first (tables under 20 bytes at every stage summed as 'the rest')\n")
    print("| table | " + " | ".join(name for name, _ in stages) + " |")
    print("|---|" + "---|" * len(stages))
    names = [t["table"] for t in sorted(last["tables"], key=lambda t: -t["per_dataset"])]
    names += [t["table"] for r in (r for _, r in stages) for t in r["tables"] if t["table"] not in names]
    names = list(dict.fromkeys(names))

    def cost(report, table):
        return next((t["per_dataset"] for t in report["tables"] if t["table"] == table), 0.0)

    rest = [n for n in names if all(cost(r, n) < 20 for _, r in stages)]
    for table in names:
        if table not in rest:
            print(f"| `{table}` | " + " | ".join(f"{cost(r, table):,.0f}" for _, r in stages) + " |")
    print("| the rest | " + " | ".join(f"{sum(cost(r, n) for n in rest):,.0f}" for _, r in stages) + " |")
    print("| **all** | " + " | ".join(f"**{r['total_per_dataset']:,.0f}**" for _, r in stages) + " |")
    print(f"| goal | " + " | ".join(f"{GOAL:,}" for _ in stages) + " |")
    print("| met | " + " | ".join("yes" if r["total_per_dataset"] <= GOAL else
                                   f"no (+{r['total_per_dataset'] - GOAL:,.0f})" for _, r in stages) + " |")
    print("\nrows left in the staging tables: " + "; ".join(
        f"{name}: " + ", ".join(f"{t} {n:,}" for t, n in r["staged_rows"].items()) for name, r in stages))
    for name, report in (stages[1], stages[-1]) if len(stages) > 2 else stages[-1:]:
        print(f"\n{name}: each table's parts (bytes per dataset)\n")
        print("| table | bytes per dataset | of which (heap, TOAST, each index) |")
        print("|---|---|---|")
        for table in report["tables"]:
            if table["per_dataset"] < 1:
                continue
            parts = [p for p in report["parts"] if p["table"] == table["table"]]
            detail = ", ".join(f"{p['part']} {p['per_dataset']:,.0f}" for p in parts)
            print(f"| `{table['table']}` | {table['per_dataset']:,.0f} | {detail} |")
        print(f"| **all** | **{report['total_per_dataset']:,.0f}** ({report['total_bytes']:,} bytes) | |")
    del first


def edit_round(records: list[dict], portal_server, share: float, round_: int) -> int:
    """Retitle ``share`` of the records on the local portal with a newer metadata_modified (what an
    incremental run lists); a different sample each round, a record edited twice keeps both edits."""
    import random
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="microseconds")
    edited = random.Random(1000 + round_).sample(range(len(records)), int(len(records) * share))
    for i in edited:
        rec = dict(records[i])
        rec["title"] = f"{rec['title']} (revision {round_})"
        rec["metadata_modified"] = now  # (after the last run began, as incremental runs list; not in the future)
        records[i] = rec
        portal_server.upsert_record(rec)
    return len(edited)


# Tables (and TOAST tables) of the schema whose dead rows are over their autovacuum threshold:
# autovacuum_vacuum_threshold + its scale factor (the table's own, else the server's) x its rows.
_DUE = """
SELECT count(*) FROM pg_stat_all_tables s JOIN pg_class c ON c.oid = s.relid
WHERE (s.schemaname = 'public' OR c.oid IN (SELECT reltoastrelid FROM pg_class t JOIN pg_namespace n
                                            ON n.oid = t.relnamespace WHERE n.nspname = 'public'))
  AND s.n_dead_tup > current_setting('autovacuum_vacuum_threshold')::float8
      + coalesce((SELECT option_value::float8 FROM pg_options_to_table(c.reloptions)
                  WHERE option_name = 'autovacuum_vacuum_scale_factor'),
                 current_setting('autovacuum_vacuum_scale_factor')::float8) * greatest(c.reltuples, 0)
"""


def settle(conns, limit: float = 60.0) -> float:
    """The time autovacuum has between two real runs (hours, where the bench has seconds): with
    its naptime at 1 s (``run``), wait until no table is over its threshold and no autovacuum
    worker is busy, ``limit`` seconds at most; returns the seconds waited. What autovacuum does is
    what it would do for users: the thresholds are the server's and the tables' own."""
    started = time.monotonic()
    for c in conns:  # this bench's own statistics counted now, not up to 10 s later
        c.execute("SELECT pg_stat_force_next_flush()")
        c.execute("SELECT 1")
    time.sleep(2.5)  # two naptimes: the launcher has started a worker, which has read the statistics
    conn = conns[0]
    while time.monotonic() - started < limit:
        due = conn.execute(_DUE).fetchone()[0]
        busy = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
                            " AND datname = current_database()").fetchone()[0]
        if not due and not busy:
            break
        time.sleep(0.5)
    return time.monotonic() - started


def run(url: str, args) -> list[tuple[str, dict]]:
    from harvest_bench import synthetic

    from harvester.config.portals import Portal
    from harvester.embeddings.gemini import GeminiProvider
    from harvester.pipeline import steps as pipeline
    from harvester.store import db
    from harvester.testing.ckan_portal import DemoPortal
    from harvester.testing.gemini import FakeGemini

    os.environ["HARVESTER_EMBED_RETRY_DELAY_SECS"] = "0"
    records = synthetic(args.datasets)
    stages = []
    with DemoPortal(records) as portal_server, \
            FakeGemini(valid_keys={"AIza-bench"}, vectors="words") as fake:
        portal = Portal(name="storage", url=portal_server.base_url, politeness_delay=0)
        provider = GeminiProvider(api_key="AIza-bench", base_url=fake.base_url, dimension=args.dimension)
        with db.prepare(db.connect_url(url)) as conn, db.prepare(db.connect_url(url)) as reader:
            if conn.execute("SELECT count(*) FROM datasets").fetchone()[0]:
                raise SystemExit(f"the database {url} already holds datasets: give an empty one")
            autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]
            if args.autovacuum_defaults:  # what sql/027 changes, measured: its settings undone
                for table in ("datasets", "dataset_search", "dataset_versions", "dataset_keys", "dataset_vectors"):
                    conn.execute(f"ALTER TABLE {table} RESET (autovacuum_vacuum_scale_factor,"
                                 " toast.autovacuum_vacuum_scale_factor)")
            if args.settle:  # (the bench's own server: a test database's server is shared)
                conn.execute("ALTER SYSTEM SET autovacuum_naptime = '1s'")
                conn.execute("SELECT pg_reload_conf()")
            started = time.perf_counter()
            pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider, full_sync=True)
            print(f"first sync of {args.datasets:,} datasets at {args.dimension} dimensions in "
                  f"{time.perf_counter() - started:.1f} s (autovacuum {autovacuum})", flush=True)
            stages.append(("after the first sync", measure(conn)))
            for k in range(1, args.runs + 1):
                started = time.perf_counter()
                edited = edit_round(records, portal_server, args.changed, k)
                out = pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider)
                took = time.perf_counter() - started
                waited = settle([conn, reader]) if args.settle else 0.0
                report = measure(conn)
                print(f"incremental run {k}: {edited:,} edited, {out.get('updated', '?')} updated, "
                      f"{report['versions']:,} versions, {report['total_per_dataset']:,.0f} bytes per dataset, "
                      f"{took:.1f} s (then {waited:.1f} s for autovacuum; {report['autovacuums']} autovacuums of a table "
                      "so far)", flush=True)
            if args.runs:
                stages.append((f"after {args.runs} incremental runs of {args.changed:.0%}", report))
            for k in range(1, args.full_syncs + 1):  # the portal unchanged: every dataset seen again
                started = time.perf_counter()
                out = pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider, full_sync=True)
                took = time.perf_counter() - started
                waited = settle([conn, reader]) if args.settle else 0.0
                report = measure(conn)
                print(f"full sync {k} of the unchanged portal: {out.get('unchanged', '?')} unchanged, "
                      f"{report['total_per_dataset']:,.0f} bytes per dataset, {took:.1f} s (then {waited:.1f} s for "
                      f"autovacuum; {report['autovacuums']} autovacuums of a table so far)", flush=True)
            if args.full_syncs:
                stages.append((f"then after {args.full_syncs} full syncs of the unchanged portal", report))
            conn.execute("VACUUM")
            stages.append(("after a plain VACUUM", measure(conn)))
            conn.execute("ANALYZE")
    return stages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=20000)
    parser.add_argument("--changed", type=float, default=0.01,
                        help="share of datasets edited before each incremental run (default 0.01)")
    parser.add_argument("--runs", type=int, default=10, help="incremental runs after the first sync (default 10)")
    parser.add_argument("--full-syncs", type=int, default=0,
                        help="full syncs of the unchanged portal after the incremental runs, measured after the last "
                             "(default 0: the issue's measure)")
    parser.add_argument("--dimension", type=int, default=768, help="vector dimension (default 768)")
    parser.add_argument("--database-url", help="an existing, migrated, empty database instead of a fresh server")
    parser.add_argument("--postgres-bin", type=Path,
                        help="the fresh server's bin directory (initdb, pg_ctl; default: the embedded PostgreSQL 18)")
    parser.add_argument("--no-settle", dest="settle", action="store_false",
                        help="do not give autovacuum its time between runs (naptime 1 s and a wait for it)")
    parser.add_argument("--autovacuum-defaults", action="store_true",
                        help="undo sql/027 (the tables' autovacuum scale factors) first: what it changes, measured")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args()
    args.settle = args.settle and not args.database_url
    if args.database_url:
        stages = run(args.database_url, args)
    else:
        from harvester.store.embedded.server import EmbeddedServer

        home = Path(tempfile.mkdtemp(prefix="harvester-storage-bench-"))
        server = EmbeddedServer(home, bin_dir=args.postgres_bin)
        try:
            stages = run(server.start(), args)
        finally:
            server.stop()
            shutil.rmtree(home, ignore_errors=True)  # the database: gigabytes at 100k
    print_report(stages)
    if args.json:
        print(json.dumps(dict(stages)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
