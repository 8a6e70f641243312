"""Benchmark: the upgrade from the code before migrations 017-023 (commit 4c2ae80) to this one, at
100,000 datasets: how long today's `harvester db migrate` takes, migration by migration, and what
it does to the tables' sizes (issue 37).

The database is built by the OLD code's own pipeline (begin, fetch_modified, reconcile,
hash_compare, embed_changed per shard, upsert: pipeline/steps.py of that tree, in a process with
its plugins/ on PYTHONPATH and its sql/ migrating the empty database) against a local scale portal
(testing/scale_portal.py) over real HTTP, with embeddings from the local Gemini stand-in
(testing/gemini.py, 768 dimensions, float32 as the API sends them): a first full sync, then
``--edits`` datasets edited and ``--removals`` removed at the portal and a second full sync, so the
database holds versions, changes, removals, and a vector per dataset and text. That database is kept
(``built``) in the embedded PostgreSQL 18 under ``--home``; each measurement works on a fresh copy
of it (CREATE DATABASE ... TEMPLATE built), so a rerun after a migration changes skips the build.

On the copy: a run of the old code left in flight (about ``--in-flight`` records edited at the
portal, listed, compared and embedded, not committed: staging holds them); then today's `harvester
db migrate` (this checkout's CLI, its own process), wall time; each migration's duration from
schema_migrations.applied_at (each migration's transaction start: a migration lasts until the next
one starts; the last one until the CLI returned); each table's size (pg_total_relation_size: heap,
TOAST and indexes) and row count before and after; then today's code commits the run in flight (its
upsert, which also keys every dataset for duplicates, 018, and builds the model's HNSW index that
019 dropped), and the in-flight edits are counted in the datasets.

    .venv/bin/python bench/upgrade_bench.py          # 100,000: build about 7 min (kept), then about 4 min
    .venv/bin/python bench/upgrade_bench.py --datasets 2000 --home /tmp/ub   # a smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]

GEMINI_KEY = "AIza-bench-upgrade"
TABLES = ("datasets", "dataset_versions", "dataset_changes", "embeddings", "dataset_vectors", "dataset_search",
          "sync_runs", "staging_records", "record_outcomes", "dataset_keys", "duplicate_members",
          "duplicate_pending", "embedding_failures")


def child(spec_json: str) -> None:
    """A sync (or part of one: see ``sync``) by the code whose plugins/ is first on sys.path; prints JSON."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    spec = json.loads(spec_json)
    os.environ["HARVESTER_EMBED_RETRY_DELAY_SECS"] = "0"
    import harvester
    from harvester.config.portals import Portal
    from harvester.embeddings.gemini import GeminiProvider
    from harvester.pipeline import steps as pipeline
    from harvester.store import db

    assert str(Path(harvester.__file__).resolve()).startswith(spec["tree"]), harvester.__file__
    portal = Portal(name="bench", url=spec["portal_url"], type="ckan", politeness_delay=0, page_size=1000)
    provider = GeminiProvider(api_key=GEMINI_KEY, base_url=spec["gemini_url"])
    times = {}
    with db.prepare(db.connect_url(spec["db_url"])) as conn, db.prepare(db.connect_url(spec["db_url"])) as reader:
        def timed(name, call):
            started = time.perf_counter()
            out = call()
            times[name] = times.get(name, 0.0) + time.perf_counter() - started
            return out

        source = pipeline.source_for(portal)
        run_id, stats = spec.get("run_id"), {}
        if run_id is None:  # a new run, up to and including ``until``
            run_id = timed("begin", lambda: pipeline.begin(conn, portal, full_sync=spec["full"]))["run_id"]
            timed("fetch_modified", lambda: pipeline.fetch_modified(conn, portal, run_id, source))
            timed("reconcile", lambda: pipeline.reconcile(conn, portal, run_id, source))
            out = timed("hash_compare", lambda: pipeline.hash_compare(conn, reader, portal, run_id, provider.model))
            for work in out["embed_shards"]:
                timed("embed_changed", lambda: pipeline.embed_changed(
                    conn, reader, portal, run_id, provider, shard=work["shard"], shards=work["shards"],
                    bulk_index=bool(work.get("bulk_index")), planned=work.get("pending_texts")))
        if spec.get("until") != "embed_changed":  # the run's upsert (of a run begun by other code: run_id)
            stats = timed("upsert", lambda: pipeline.upsert(conn, portal, run_id, provider.model))
        stats = {"run_id": run_id, **stats}
    print(json.dumps({"times": times, "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float, str))}}))


def sync(tree: Path, db_url: str, portal_url: str, gemini_url: str, full: bool = True, until: str | None = None,
         run_id: int | None = None) -> dict:
    """One sync by the code of ``tree`` (its pipeline steps in a process of its own): a whole run;
    ``until="embed_changed"``: begin to embed_changed (the run left staged, its upsert not done);
    ``run_id``: only the upsert of that run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARVESTER_", "AIRFLOW_CONN_", "GEMINI_"))}
    env.update({"PYTHONPATH": str(tree / "plugins"), "_AIRFLOW__AS_LIBRARY": "1", "HARVESTER_EMBEDDED_DB": "off"})
    spec = json.dumps({"tree": str(tree.resolve()), "db_url": db_url, "portal_url": portal_url,
                       "gemini_url": gemini_url, "full": full, "until": until, "run_id": run_id})
    done = subprocess.run([sys.executable, __file__, "--child", spec], env=env, capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"the sync by the code of {tree} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def sizes(url: str) -> dict[str, tuple[int, int]]:
    """{table: (bytes, rows)} and the database's bytes under ''."""
    import psycopg

    out = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for table in TABLES:
            if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None:
                continue
            size = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (table,)).fetchone()[0]
            rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            out[table] = (size, rows)
        out[""] = (conn.execute("SELECT pg_database_size(current_database())").fetchone()[0], 0)
    return out


def mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def change(portal, args) -> None:
    """The edits and removals between the two syncs (the same each time: the portal is rebuilt
    for today's first run)."""
    portal.edit(range(0, args.edits * 7, 7))
    portal.remove(range(3, args.removals * 11, 11))


def in_flight_edits(portal, args) -> list[int]:
    """The records the run in flight across the upgrade edits (live ones)."""
    return [i for i in range(5, args.in_flight * 13, 13) if portal.record(i) is not None]


def build(args, server, old: Path) -> None:
    import psycopg

    from harvester.testing.gemini import FakeGemini
    from harvester.testing.scale_portal import ScalePortal

    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS built_partial WITH (FORCE)")
        conn.execute("CREATE DATABASE built_partial")
    url = server.url("built_partial")
    with ScalePortal(args.datasets) as portal, FakeGemini(valid_keys={GEMINI_KEY}) as gemini:
        print(f"building {args.datasets:,} datasets with the code of {args.commit} (its pipeline, local scale portal,"
              f" Gemini stand-in)...", flush=True)
        started = time.monotonic()
        first = sync(old, url, portal.base_url, gemini.base_url)
        print(f"  first full sync: {time.monotonic() - started:.0f} s "
              f"({', '.join(f'{k} {v:.0f} s' for k, v in first['times'].items())}): {first['stats']}", flush=True)
        change(portal, args)
        started = time.monotonic()
        second = sync(old, url, portal.base_url, gemini.base_url)
        print(f"  second full sync ({args.edits:,} edited, {args.removals:,} removed): "
              f"{time.monotonic() - started:.0f} s: {second['stats']}", flush=True)
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS built WITH (FORCE)")
        conn.execute("ALTER DATABASE built_partial RENAME TO built")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=100_000)
    parser.add_argument("--edits", type=int, default=5000)
    parser.add_argument("--removals", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=2000,
                        help="edits of the run the old code leaves staged across the upgrade")
    parser.add_argument("--home", type=Path, default=Path("/var/tmp/harvester-upgrade-bench"),
                        help="the embedded server and the old code live here; the built database is kept")
    parser.add_argument("--rebuild", action="store_true", help="build the old database again")
    parser.add_argument("--commit", default=None, help="the code to upgrade from (default: testing/upgrade.OLD_COMMIT)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0

    sys.path.insert(0, str(ROOT / "plugins"))  # this checkout (the child runs the old tree's)
    import psycopg

    from harvester.store.embedded.server import EmbeddedServer
    from harvester.testing.upgrade import OLD_COMMIT, extract_old_code, migrations_in

    args.commit = args.commit or OLD_COMMIT
    home = args.home.resolve()
    old = home / f"code-{args.commit}"
    if not (old / "plugins").is_dir():
        extract_old_code(old, args.commit)
    server = EmbeddedServer(home / "pg")
    server.start()
    try:
        with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
            have = conn.execute("SELECT 1 FROM pg_database WHERE datname = 'built'").fetchone()
            marker = home / "built.json"
            built_for = json.loads(marker.read_text()) if marker.exists() else None
        if args.rebuild or not have or built_for != {"datasets": args.datasets, "commit": args.commit}:
            build(args, server, old)
            marker.write_text(json.dumps({"datasets": args.datasets, "commit": args.commit}))
        else:
            print(f"the old database of {args.datasets:,} datasets is already built ({home}); --rebuild to redo")
        with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS upgraded WITH (FORCE)")
            started = time.monotonic()
            conn.execute("CREATE DATABASE upgraded TEMPLATE built")
            print(f"copied the old database in {time.monotonic() - started:.0f} s", flush=True)
        url = server.url("upgraded")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")  # as a database in use would be
            had = {v for (v,) in conn.execute("SELECT version FROM schema_migrations")}
        pending = [m for m in migrations_in(ROOT) if int(m[:3]) not in had]

        # A run in flight across the upgrade: the old code lists, compares and embeds --in-flight
        # edits (staging holds them), then the upgrade, then today's code commits that run.
        from harvester.testing.gemini import FakeGemini
        from harvester.testing.scale_portal import ScalePortal

        with psycopg.connect(url, autocommit=True) as conn:  # the same portal (its URL) as the build's
            port = urlsplit(conn.execute("SELECT portal_url FROM datasets LIMIT 1").fetchone()[0]).port
        portal = ScalePortal(args.datasets, port=port).__enter__()
        gemini = FakeGemini(valid_keys={GEMINI_KEY}).__enter__()
        try:
            change(portal, args)
            portal.edit(in_flight_edits(portal, args), suffix=" (in flight)")
            started = time.monotonic()
            staged = sync(old, url, portal.base_url, gemini.base_url, full=False, until="embed_changed")
            print(f"a run of the old code in flight: {len(in_flight_edits(portal, args)):,} edits listed, compared "
                  f"and embedded, not committed ({time.monotonic() - started:.0f} s; run {staged['stats']['run_id']})", flush=True)
            before = sizes(url)

            env = {k: v for k, v in os.environ.items() if not k.startswith(("HARVESTER_", "AIRFLOW_CONN_"))}
            env.update({"PYTHONPATH": str(ROOT / "plugins"), "HARVESTER_DATABASE_URL": url,
                        "HARVESTER_EMBEDDED_DB": "off", "_AIRFLOW__AS_LIBRARY": "1"})
            print(f"`harvester db migrate` (this checkout) applies {', '.join(pending)} ...", flush=True)
            started_wall = datetime.now(timezone.utc)
            started = time.monotonic()
            done = subprocess.run([str(Path(sys.executable).parent / "harvester"), "db", "migrate"], env=env,
                                  capture_output=True, text=True, timeout=7200)
            total = time.monotonic() - started
            ended_wall = datetime.now(timezone.utc)
            if done.returncode != 0:
                raise SystemExit(f"harvester db migrate failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
            with psycopg.connect(url, autocommit=True) as conn:
                applied = conn.execute("SELECT name, applied_at FROM schema_migrations WHERE applied_at >= %s"
                                       " ORDER BY version", (started_wall,)).fetchall()
            after = sizes(url)

            print(f"\n{args.datasets:,} datasets built by {args.commit}; today's `harvester db migrate`: "
                  f"{total:.1f} s in all (the CLI's own process included)")
            print(f"  {'migration':38s} {'seconds':>8s}")
            for i, (name, at) in enumerate(applied):
                end = applied[i + 1][1] if i + 1 < len(applied) else ended_wall
                print(f"  {name:38s} {(end - at).total_seconds():8.2f}")
            print(f"  (from the first migration's start: {(ended_wall - applied[0][1]).total_seconds():.1f} s;"
                  f" before it, the CLI's start-up: {(applied[0][1] - started_wall).total_seconds():.1f} s)"
                  if applied else "  (nothing applied)")
            print(f"\n  {'table':22s} {'before':>12s} {'rows':>10s} {'after':>12s} {'rows':>10s}")
            for table in [*TABLES, ""]:
                b, a = before.get(table), after.get(table)
                if not b and not a:
                    continue
                label = table or "(the whole database)"
                print(f"  {label:22s} {mb(b[0]) if b else '-':>12s} {(f'{b[1]:,}' if b and table else ''):>10s}"
                      f" {mb(a[0]) if a else '-':>12s} {(f'{a[1]:,}' if a and table else ''):>10s}")
            lost = [t for t in TABLES if t in before and t in after and after[t][1] < before[t][1]]
            print(f"\n  rows lost: {lost or 'none'}")

            # The first task of today's code after the upgrade: the in-flight run's upsert, which also
            # keys every dataset of the portal for duplicates (018: a portal never scanned) and builds
            # the model's HNSW index again (019 dropped it), concurrently.
            started = time.monotonic()
            first = sync(ROOT, url, portal.base_url, gemini.base_url, run_id=staged["stats"]["run_id"])
            took = time.monotonic() - started
            expected = len(in_flight_edits(portal, args))
        finally:
            portal.__exit__(None, None, None)
            gemini.__exit__(None, None, None)
        print(f"\n  today's code commits the run in flight (upsert): {took:.1f} s, {first['stats']}")
        with psycopg.connect(url, autocommit=True) as conn:
            hnsw = conn.execute("SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                                " JOIN pg_am am ON am.oid = c.relam AND am.amname = 'hnsw'"
                                " WHERE i.indrelid = 'embeddings'::regclass AND i.indisvalid").fetchone()[0]
            keyed = conn.execute("SELECT count(DISTINCT dataset_id) FROM dataset_keys").fetchone()[0]
            landed = conn.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL"
                                  " AND title LIKE '%(in flight)'").fetchone()[0]
        print(f"  the run in flight's edits committed: {landed:,} of {expected:,} live at the portal")
        then = sizes(url)
        print(f"  after it: {hnsw} valid HNSW index(es) on embeddings, {keyed:,} datasets keyed for duplicates; "
              f"embeddings {mb(then['embeddings'][0])}, dataset_keys {mb(then['dataset_keys'][0])}, "
              f"the whole database {mb(then[''][0])}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
