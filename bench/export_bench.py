"""Benchmark: what `harvester export datasets` costs in time and memory as the datasets grow.

Fills a fresh embedded PostgreSQL (or ``--database-url``, a migrated database) with ``--datasets``
synthetic datasets in a few set-based statements (INSERT ... SELECT generate_series: titles of
about 100 characters, descriptions of 1-2 KB, 3-8 tags, a raw record of 2-4 KB with resources and
extras, a current version each, every tenth removed, a few in duplicate groups), then runs
``harvester export datasets --include-removed --raw`` once per format, each in a child process of
its own, and prints per format: rows, seconds, the file's size and the child's peak RSS (the
kernel's VmHWM, which exec resets: the export's own high-water mark, Python and its imports
included). Asserts nothing.

    .venv/bin/python bench/export_bench.py --datasets 100000
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("parquet", "csv", "jsonl")
PORTAL = "https://bench.example.org"

FILL = [
    ("INSERT INTO portal_sync_status (portal_url, portal_name, last_successful_sync, sync_status, datasets_synced)"
     " VALUES (%(portal)s, 'bench', now(), 'completed', %(n)s)"),
    ("INSERT INTO sync_runs (portal_url, portal_name, mode, status, finished_at)"
     " VALUES (%(portal)s, 'bench', 'full', 'committed', now())"),
    """
    INSERT INTO datasets (portal_url, source_id, name, url, url_hash, content_hash, metadata_hash, title,
                          description, tags, organization, metadata_modified, first_seen_at, updated_at,
                          removed_at, raw)
    SELECT %(portal)s, s.id, s.name, s.url, md5(s.url), md5(s.title || s.description), md5(s.id), s.title,
           s.description, s.tags, 'Organisation ' || (g %% 300), now() - g * interval '1 minute',
           now() - interval '1 year', now() - g * interval '1 second',
           CASE WHEN g %% 10 = 0 THEN now() END,
           jsonb_build_object(
               'id', s.id, 'name', s.name, 'title', s.title, 'notes', s.description,
               'license_title', 'Creative Commons Attribution 4.0',
               'tags', (SELECT jsonb_agg(jsonb_build_object('name', t)) FROM jsonb_array_elements_text(s.tags) t),
               'resources', (SELECT jsonb_agg(jsonb_build_object(
                                 'id', md5(s.id || r), 'url', s.url || '/resource/' || r || '.csv',
                                 'format', (ARRAY['CSV', 'JSON', 'XLSX', 'PDF'])[1 + (g + r) %% 4],
                                 'name', 'Resource ' || r || ' of ' || s.title))
                             FROM generate_series(1, 2 + g %% 4) r),
               'extras', (SELECT jsonb_agg(jsonb_build_object('key', 'extra_' || e,
                                                              'value', repeat(md5(s.id || e), 2 + g %% 3)))
                          FROM generate_series(1, 6) e))
    FROM generate_series(1, %(n)s) g
    CROSS JOIN LATERAL (
        SELECT 'bench-' || g AS id, 'dataset-' || g AS name, %(portal)s || '/dataset/dataset-' || g AS url,
               'Dataset ' || g || ': ' || repeat(substr(md5(g::text), 1, 8) || ' statistics ', 4) AS title,
               repeat(md5(g::text) || ' "quoted", ' || E'\\n', 30 + g %% 30) AS description,
               (SELECT jsonb_agg('tag-' || ((g * 7 + i) %% 500)) FROM generate_series(1, 3 + g %% 6) i) AS tags
    ) s
    """,
    # every dataset seen unchanged since its last change, by the last full sync (sql/044)
    "INSERT INTO dataset_seen (dataset_id, last_seen_at) SELECT id, now() FROM datasets WHERE portal_url = %(portal)s",
    """
    INSERT INTO dataset_versions (dataset_id, version_number, content_hash, metadata_hash, snapshot, change_type,
                                  first_seen_at)
    SELECT id, 1, content_hash, metadata_hash, jsonb_build_object('title', title, 'description', ''), 'new',
           first_seen_at
    FROM datasets WHERE portal_url = %(portal)s
    """,
    """
    INSERT INTO duplicate_members (dataset_id, group_id, portal_url, is_canonical, evidence, confidence)
    SELECT id, id / 50, portal_url, id %% 50 = 0, 'identifier', 1
    FROM datasets WHERE portal_url = %(portal)s AND id %% 50 < 3
    """,
    "ANALYZE",
]


def fill(url: str, n: int) -> float:
    from harvester.store import db

    started = time.perf_counter()
    with db.prepare(db.connect_url(url)) as conn:
        for statement in FILL:
            conn.execute(statement, {"portal": PORTAL, "n": n})
    return time.perf_counter() - started


def child(url: str, fmt: str, out: str) -> None:
    """One export in this process; prints JSON: rows, seconds, bytes, peak RSS."""
    os.environ["HARVESTER_DATABASE_URL"] = url
    from harvester.cli.main import main

    started = time.perf_counter()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["export", "datasets", "--format", fmt, "--include-removed", "--raw", "--output", out, "--json"])
    seconds = time.perf_counter() - started
    if code:
        raise SystemExit(f"export exited {code}")
    (item,) = json.loads(printed.getvalue())["files"]
    status = Path("/proc/self/status").read_text()
    peak_mb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024
    print(json.dumps({"rows": item["rows"], "seconds": seconds, "bytes": item["bytes"], "peak_mb": peak_mb}))


def run_child(url: str, fmt: str, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins"), "_AIRFLOW__AS_LIBRARY": "1"}
    done = subprocess.run([sys.executable, __file__, "--child", fmt, "--database-url", url, "--work", str(out)],
                          env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"the {fmt} export failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=100_000)
    parser.add_argument("--database-url", help="a migrated database to fill (default: a fresh embedded PostgreSQL)")
    parser.add_argument("--work", help="where the exports (and the embedded database) go, kept afterwards "
                        "(default: a temporary directory, removed at the end)")
    parser.add_argument("--child", choices=FORMATS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "plugins"))
    if args.child:
        child(args.database_url, args.child, args.work)
        return 0
    work = Path(args.work or tempfile.mkdtemp(prefix="harvester-export-bench-"))
    server = None
    url = args.database_url
    if url is None:
        from harvester.store.embedded.server import EmbeddedServer

        server = EmbeddedServer(work / "pg")
        url = server.start()
    try:
        seconds = fill(url, args.datasets)
        print(f"filled {args.datasets} datasets in {seconds:.1f}s")
        for fmt in FORMATS:
            r = run_child(url, fmt, work / f"export-{fmt}")
            print(f"{fmt:8s} rows={r['rows']} seconds={r['seconds']:.1f} size={r['bytes'] / 2**20:.1f} MB "
                  f"peak RSS={r['peak_mb']:.0f} MB")
    finally:
        if server is not None:
            server.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)  # the database and the exports: gigabytes at 100,000
    return 0


if __name__ == "__main__":
    sys.exit(main())
