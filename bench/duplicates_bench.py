"""Benchmark: what grouping cross-portal duplicates (store/duplicates.regroup_run) costs a run.

A fresh embedded PostgreSQL (or --database-url: an existing, migrated, empty database) gets two
portals of --datasets synthetic datasets each, written by set-based SQL (INSERT ... SELECT over
generate_series, no harvest):

- a national CKAN portal: UUID ids, names, landing pages ``<portal>/dataset/<name>``, one to three
  resources with URLs, extras, an organization among 500, the CKAN ``url`` field set on a third;
- an aggregator (a DCAT catalogue, CKAN-shaped raw as the harvester stores it) that republishes
  --copied (default 40%) of them under its own IRIs, with an extras ``dct:identifier`` holding the
  source's id, its ``url`` and landing page the source's page, and the same resources and
  publisher; --decoys (default 2%) of its datasets take the title of a national dataset it does
  not copy, with another publisher, text and files; the rest are its own.

Then regroup_run, each stage in its own committed transaction, as a run's commit calls it:

1. national first scan: the portal has no duplicate_scans row, so all its datasets are keyed and
   examined (nothing to group yet: the aggregator has no keys);
2. aggregator first scan: all its datasets keyed and examined with their neighbours: the groups;
3. no-change run of the national portal: a run with no change rows and nothing staged;
4. a national run that changed --changed datasets (1,000; their title and text, spread over
   copied and uncopied ones): 'content_updated' change rows, then regroup_run.

Prints for each stage its seconds, keys written, datasets touched and examined, groups in scope,
and where the time went (each SQL statement's share, the Python grouping). --explain also runs
EXPLAIN (ANALYZE, BUFFERS) of every statement slower than --explain-over seconds (in a savepoint
rolled back, before the statement itself) and prints the plans. A statement that outlasts
--statement-timeout (300 s) rolls its stage back: the bench prints its plan (EXPLAIN without
ANALYZE) and exits 1. Checks, exit status 1 when one fails: every copy is grouped with its
source (groups == copies, two members each, one per portal, the national one canonical), no decoy
is in a group; the no-change run touches nothing.

    .venv/bin/python bench/duplicates_bench.py                       # 100,000 datasets per portal
    .venv/bin/python bench/duplicates_bench.py --datasets 2000       # a smoke run (seconds)
    .venv/bin/python bench/duplicates_bench.py --explain --explain-over 0.5
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NATIONAL = "https://data.nation.example"
AGGREGATOR = "https://aggregator.example/catalog.ttl"
AGG_IRI = "https://aggregator.example/set/data/"


# -- the synthetic portals ------------------------------------------------------------------------
# The national dataset i: its id a UUID derived from i, title and text unique to it.
_NATIONAL = """
INSERT INTO datasets (portal_url, source_id, name, url, url_hash, content_hash, metadata_hash, title, description,
                      tags, organization, metadata_modified, first_seen_at, updated_at, raw)
SELECT %(portal)s, id, name, page, md5(page), md5(title || ' ' || notes), md5(raw::text), title, notes, tags,
       org_title, modified, now() - interval '30 days', now(), raw
FROM (
    SELECT g.id, g.name, g.page, g.title, g.notes, g.tags, g.org_title, g.modified,
           jsonb_build_object(
               'id', g.id, 'name', g.name, 'title', g.title, 'notes', g.notes, 'type', 'dataset',
               'url', CASE WHEN g.i %% 3 = 0 THEN 'https://www.' || g.org || '.gov.example/datasets/' || g.i
                           ELSE '' END,
               'metadata_modified', g.modified, 'license_id', 'ogl',
               'organization', jsonb_build_object('name', g.org, 'title', g.org_title),
               'tags', g.tags,
               'extras', jsonb_build_array(jsonb_build_object('key', 'theme', 'value', 'statistics'),
                                           jsonb_build_object('key', 'update_frequency', 'value', 'annual')),
               'resources', (SELECT jsonb_agg(jsonb_build_object(
                                 'id', md5(g.id || r), 'format', 'CSV', 'name', 'part ' || r,
                                 'url', 'https://files.' || g.org || '.gov.example/' || g.i || '/part-' || r || '.csv'))
                             FROM generate_series(1, 1 + g.i %% 3) r)) AS raw
    FROM (
        SELECT i, md5('national ' || i)::uuid::text AS id, 'dataset-' || i AS name,
               %(portal)s || '/dataset/dataset-' || i AS page,
               (ARRAY['Population', 'Road traffic', 'Air quality', 'School census', 'Spending', 'Planning',
                      'Flood risk', 'Bus stops', 'Crime', 'Housing'])[1 + i %% 10] || ' ' || i || ' of ' ||
               'Public Body ' || (i %% 500) AS title,
               'Figures ' || i || ' published by Public Body ' || (i %% 500) || ', updated yearly.' AS notes,
               jsonb_build_array(jsonb_build_object('name', 'topic-' || (i %% 40))) AS tags,
               'body-' || (i %% 500) AS org, 'Public Body ' || (i %% 500) AS org_title,
               timestamptz '2024-01-01' + i * interval '1 minute' AS modified
        FROM generate_series(1, %(n)s) i
    ) g
) x
"""

# The aggregator's dataset i: a copy of national i (i %% 100 < copied), a decoy of it (the next
# `decoys` per hundred: same title, another publisher, text and files), or its own.
_AGGREGATOR = """
INSERT INTO datasets (portal_url, source_id, name, url, url_hash, content_hash, metadata_hash, title, description,
                      tags, organization, metadata_modified, first_seen_at, updated_at, raw)
SELECT %(portal)s, a.iri, NULL, a.page, md5(a.page), md5(a.title || ' ' || a.notes), md5(a.raw::text), a.title, a.notes,
       '[]'::jsonb, a.org_title, now(), now(), now(), a.raw
FROM (
    SELECT b.*, jsonb_strip_nulls(jsonb_build_object(
               'id', b.iri, 'title', b.title, 'notes', b.notes, 'url', b.page,
               'organization', jsonb_build_object('name', b.org_title, 'title', b.org_title),
               'extras', CASE WHEN b.kind = 'copy' THEN jsonb_build_array(
                              jsonb_build_object('key', 'dct:identifier', 'value', b.source_id)) ELSE '[]' END,
               'resources', b.resources)) AS raw
    FROM (
        SELECT s.i, s.kind, %(iri)s || lpad(s.i::text, 7, '0') AS iri,
               CASE WHEN s.kind = 'copy' THEN n.source_id END AS source_id,
               CASE WHEN s.kind = 'copy' THEN n.url ELSE %(iri)s || lpad(s.i::text, 7, '0') END AS page,
               CASE WHEN s.kind = 'own' THEN 'Aggregated collection ' || s.i ELSE n.title END AS title,
               CASE WHEN s.kind = 'copy' THEN n.description
                    ELSE 'Another survey ' || s.i || ', by a regional body.' END AS notes,
               CASE WHEN s.kind = 'copy' THEN n.organization ELSE 'Regional Body ' || (s.i %% 97) END AS org_title,
               CASE WHEN s.kind = 'copy' THEN n.raw -> 'resources'
                    ELSE jsonb_build_array(jsonb_build_object(
                        'url', 'https://files.region-' || (s.i %% 97) || '.example/' || s.i || '.csv', 'format', 'CSV'))
               END AS resources
        FROM (SELECT i, CASE WHEN i %% 100 < %(copied)s THEN 'copy'
                             WHEN i %% 100 < %(copied)s + %(decoys)s THEN 'decoy' ELSE 'own' END AS kind
              FROM generate_series(1, %(n)s) i) s
        LEFT JOIN datasets n ON n.portal_url = %(national)s AND n.source_id = md5('national ' || s.i)::uuid::text
                            AND s.kind <> 'own'
    ) b
) a
"""

_CHANGE = """
WITH picked AS (
    SELECT id FROM datasets WHERE portal_url = %(portal)s ORDER BY md5(id::text || 'changed') LIMIT %(changed)s
), edited AS (
    UPDATE datasets d SET title = d.title || ' (revised)', description = d.description || ' Revised.',
                          content_hash = md5(d.title || ' (revised) ' || d.description || ' Revised.'),
                          raw = d.raw || jsonb_build_object('title', d.title || ' (revised)'), updated_at = now()
    FROM picked WHERE d.id = picked.id
    RETURNING d.id
)
-- (no versions: the bench writes no history, and grouping reads only the change rows' dataset ids)
INSERT INTO dataset_changes (dataset_id, run_id, change_type, significance_score, detected_at)
SELECT id, %(run)s, 'content_updated', 0.5, now() FROM edited
"""


def new_run(conn, portal_url: str, name: str) -> int:
    return conn.execute("INSERT INTO sync_runs (portal_url, portal_name, mode, status) VALUES (%s, %s, 'full', "
                        "'running') RETURNING run_id", (portal_url, name)).fetchone()[0]


# -- timing each statement ----------------------------------------------------------------------
def _shape(sql: str) -> str:
    """A statement's first words, to name it in the breakdown."""
    text = re.sub(r"\s+", " ", sql).strip()
    return text[:90] + ("..." if len(text) > 90 else "")


class Timed:
    """A connection that times each statement. Each runs in a savepoint: one that outlasts the
    stage's statement_timeout is rolled back to it and EXPLAINed (without ANALYZE: it would not end)
    before the error goes on. With ``explain_over``, each statement is first EXPLAIN ANALYZEd in a
    rolled-back savepoint, and the plans of those slower than that are kept."""

    def __init__(self, conn, explain_over: float | None = None):
        self.conn, self.explain_over = conn, explain_over
        self.spent: dict[str, float] = {}
        self.plans: list[tuple[float, str, str]] = []
        self.stuck: tuple[str, str] | None = None

    def _plan(self, sql, params, analyze: bool) -> str:
        self.conn.execute("SAVEPOINT bench_explain")
        try:
            plan = "\n".join(r[0] for r in self.conn.execute(
                ("EXPLAIN (ANALYZE, BUFFERS) " if analyze else "EXPLAIN ") + sql, params))
            return re.sub(r"'\{[^}]{80,}\}'", "'{...}'", plan)  # the ids, as a literal array
        finally:
            self.conn.execute("ROLLBACK TO SAVEPOINT bench_explain")

    def _spend(self, name: str, seconds: float) -> None:
        self.spent[name] = self.spent.get(name, 0.0) + seconds

    def execute(self, sql, params=None):
        import psycopg

        plannable = re.match(r"\s*(WITH|SELECT|INSERT|DELETE|UPDATE)\b", sql, re.I) and "pg_advisory" not in sql
        plan = self._plan(sql, params, True) if self.explain_over is not None and plannable else None
        self.conn.execute("SAVEPOINT bench_statement")
        started = time.perf_counter()
        try:
            cur = self.conn.execute(sql, params)
        except psycopg.errors.QueryCanceled:
            self.conn.execute("ROLLBACK TO SAVEPOINT bench_statement")
            self.stuck = (sql, self._plan(sql, params, False) if plannable else "")
            raise
        took = time.perf_counter() - started
        self._spend(_shape(sql), took)
        if plan is not None and took >= self.explain_over:
            self.plans.append((took, sql, plan))
        return cur

    def __getattr__(self, name):
        return getattr(self.conn, name)


class StageTimedOut(Exception):
    pass


def stage(conn, name: str, run_id: int, portal_url: str, args) -> dict:
    import psycopg

    from harvester.domain import duplicates as dd
    from harvester.store import duplicates

    timed = Timed(conn, args.explain_over if args.explain else None)
    python = [0.0]
    group = dd.group

    def timed_group(*args, **kwargs):
        started = time.perf_counter()
        try:
            return group(*args, **kwargs)
        finally:
            python[0] += time.perf_counter() - started

    dd.group = timed_group
    try:
        started = time.perf_counter()
        with conn.transaction():
            conn.execute(f"SET LOCAL statement_timeout = {int(args.statement_timeout * 1000)}")
            try:
                out = duplicates.regroup_run(timed, run_id, portal_url)
            except psycopg.errors.QueryCanceled:
                sql, plan = timed.stuck or ("?", "")
                raise StageTimedOut(
                    f"{name}: a statement did not end within --statement-timeout {args.statement_timeout:g} s "
                    f"(rolled back); its plan:\n    {_shape(sql)}\n    " + plan.replace("\n", "\n    ")) from None
            conn.execute("UPDATE sync_runs SET status = 'committed', finished_at = now() WHERE run_id = %s",
                         (run_id,))
        seconds = time.perf_counter() - started
    finally:
        dd.group = group
    out.update(stage=name, wall=seconds, python_grouping=python[0],
               statements=sorted(timed.spent.items(), key=lambda kv: -kv[1]), plans=timed.plans)
    return out


# -- checks -------------------------------------------------------------------------------------
def check(conn, n: int, copied: int, decoys: int) -> list[str]:
    copies = sum(1 for i in range(1, n + 1) if i % 100 < copied)
    decoy_count = sum(1 for i in range(1, n + 1) if copied <= i % 100 < copied + decoys)
    problems = []
    groups, grouped = conn.execute("SELECT count(DISTINCT group_id), count(*) FROM duplicate_members").fetchone()
    if groups != copies or grouped != 2 * copies:
        problems.append(f"{groups} groups of {grouped} datasets; expected {copies} groups of two")
    bad = conn.execute(
        """
        SELECT count(*) FROM (
            SELECT m.group_id FROM duplicate_members m JOIN datasets d ON d.id = m.dataset_id
            GROUP BY m.group_id
            HAVING count(*) <> 2 OR count(DISTINCT d.portal_url) <> 2
                OR bool_or(m.is_canonical AND d.portal_url <> %(national)s)
                OR bool_or(d.portal_url = %(agg)s AND d.raw #>> '{extras,0,value}' IS DISTINCT FROM
                           (SELECT n.source_id FROM duplicate_members o JOIN datasets n ON n.id = o.dataset_id
                            WHERE o.group_id = m.group_id AND n.portal_url = %(national)s))
        ) g
        """, {"national": NATIONAL, "agg": AGGREGATOR}).fetchone()[0]
    if bad:
        problems.append(f"{bad} groups are not a national dataset (canonical) with the aggregator's copy of it")
    grouped_decoys = conn.execute(
        "SELECT count(*) FROM duplicate_members m JOIN datasets d ON d.id = m.dataset_id"
        " WHERE d.portal_url = %s AND d.raw #>> '{extras,0,key}' IS NULL AND d.title NOT LIKE 'Aggregated%%'",
        (AGGREGATOR,)).fetchone()[0]
    if grouped_decoys:
        problems.append(f"{grouped_decoys} of the {decoy_count} decoys are in a group")
    return problems


# -- the run ------------------------------------------------------------------------------------
def print_stage(r: dict, top: int) -> None:
    print(f"{r['stage']:<24} {r['wall']:8.3f} s  keys={r['keys']:<8} touched={r['touched']:<8} "
          f"examined={r['examined']:<8} groups={r['groups']:<7} (python grouping {r['python_grouping']:.3f} s)")
    for sql, seconds in r["statements"][:top]:
        if seconds >= 0.001:
            print(f"    {seconds:8.3f} s  {sql}")
    for took, sql, plan in r["plans"]:
        print(f"  EXPLAIN ANALYZE of a {took:.3f} s statement:\n    {_shape(sql)}")
        print("    " + plan.replace("\n", "\n    "))


def bench(url: str, args) -> int:
    from harvester.store import db

    with db.prepare(db.connect_url(url)) as conn:
        if conn.execute("SELECT count(*) FROM datasets").fetchone()[0]:
            raise SystemExit(f"the database {url} already holds datasets: give an empty one")
        started = time.perf_counter()
        conn.execute(_NATIONAL, {"portal": NATIONAL, "n": args.datasets})
        conn.execute(_AGGREGATOR, {"portal": AGGREGATOR, "national": NATIONAL, "iri": AGG_IRI, "n": args.datasets,
                                   "copied": args.copied, "decoys": args.decoys})
        conn.execute("ANALYZE datasets")
        total = conn.execute("SELECT count(*) FROM datasets").fetchone()[0]
        print(f"{total} datasets written in {time.perf_counter() - started:.1f} s ({args.datasets} per portal; "
              f"the aggregator copies {args.copied}% and has {args.decoys}% same-title decoys)")
        try:
            results = [stage(conn, "national first scan", new_run(conn, NATIONAL, "national"), NATIONAL, args)]
            results.append(stage(conn, "aggregator first scan", new_run(conn, AGGREGATOR, "aggregator"),
                                 AGGREGATOR, args))
        except StageTimedOut as exc:
            print(str(exc))
            return 1
        conn.execute("ANALYZE dataset_keys; ANALYZE duplicate_members")
        problems = check(conn, args.datasets, args.copied, args.decoys)
        results.append(stage(conn, "no-change run", new_run(conn, NATIONAL, "national"), NATIONAL, args))
        if results[-1]["touched"] or results[-1]["examined"]:
            problems.append(f"the no-change run touched {results[-1]['touched']} datasets")
        run_id = new_run(conn, NATIONAL, "national")
        conn.execute(_CHANGE, {"portal": NATIONAL, "changed": args.changed, "run": run_id})
        results.append(stage(conn, f"{args.changed} changed", run_id, NATIONAL, args))
        if results[-1]["touched"] != min(args.changed, args.datasets):
            problems.append(f"the run with {args.changed} changes touched {results[-1]['touched']} datasets")
        problems += check(conn, args.datasets, args.copied, args.decoys)
        copies = conn.execute("SELECT count(DISTINCT group_id) FROM duplicate_members").fetchone()[0]
    print(f"\n{'stage':<24} {'seconds':>10}")
    for r in results:
        print_stage(r, args.top)
    print(f"\ngroups: {copies}; checks: " + ("all passed" if not problems else "FAILED: " + "; ".join(problems)))
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k not in ("statements", "plans")} for r in results]))
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=100_000, help="datasets per portal (default 100,000)")
    parser.add_argument("--copied", type=int, default=40, help="percent the aggregator copies (default 40)")
    parser.add_argument("--decoys", type=int, default=2, help="percent same-title decoys (default 2)")
    parser.add_argument("--changed", type=int, default=1000, help="datasets the last run changes (default 1,000)")
    parser.add_argument("--top", type=int, default=6, help="statements shown per stage (default 6)")
    parser.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE the slow statements")
    parser.add_argument("--explain-over", type=float, default=0.5, help="seconds (default 0.5)")
    parser.add_argument("--statement-timeout", type=float, default=300,
                        help="seconds a statement of a stage may take before the stage is rolled back, its plan "
                             "printed and the bench stopped (default 300)")
    parser.add_argument("--database-url", help="an existing, migrated, empty database instead of a fresh server")
    parser.add_argument("--json", action="store_true", help="also print the stages' figures as JSON")
    args = parser.parse_args()
    if not 0 <= args.copied and args.copied + args.decoys <= 100:
        parser.error("--copied + --decoys must be at most 100")
    sys.path.insert(0, str(ROOT / "plugins"))
    if args.database_url:
        return bench(args.database_url, args)
    from harvester.store.embedded.server import EmbeddedServer

    home = Path(tempfile.mkdtemp(prefix="harvester-duplicates-bench-"))
    server = EmbeddedServer(home)
    try:
        return bench(server.start(), args)
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
