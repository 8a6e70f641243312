"""The `harvester` command: the database, portals, runs and datasets, without a scheduler.

Database: HARVESTER_DATABASE_URL, else the Airflow connection harvester_db
(AIRFLOW_CONN_HARVESTER_DB), else the embedded PostgreSQL under .harvester/ (an error instead
with HARVESTER_EMBEDDED_DB=off).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import datetime
from typing import Sequence

from harvester.config import portals as portal_config


def _print_json(data) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=lambda o: o.isoformat() if isinstance(o, datetime) else str(o)))


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*["" if v is None else (v.strftime("%Y-%m-%d %H:%M:%S") if isinstance(v, datetime) else str(v))
                        for v in row])
    Console(width=max(100, Console().width)).print(table)


def _resolve_portal(name: str | None):
    if name is None:
        return None
    return portal_config.get_portal(name)


# -- db ---------------------------------------------------------------------------------------
def cmd_db(args) -> int:
    from harvester.store import db
    from harvester.store.embedded.server import embedded

    server = embedded()
    if args.action == "start":
        from harvester.store.vector_check import ensure_vector_works

        url = server.start()
        print(url)
        with db.connect_url(url) as conn:
            conn.autocommit = True
            # a pgvector this CPU cannot run: say so now (main prints it), not at the first harvest
            ensure_vector_works(conn, server.logfile)
    elif args.action == "stop":
        print("stopped" if server.stop() else "not running")
    elif args.action == "url":
        url = db.cli_database_url() if args.resolve else server.url()
        print(db.redact(url) if args.redact else url)
    elif args.action == "status":
        print(f"embedded server in {server.home}: {'running at ' + server.url() if server.is_running() else 'not running'}")
    elif args.action == "migrate":
        from harvester.store.migrations import migrate

        conn = db.connect_url(db.cli_database_url())
        conn.autocommit = True
        with conn:
            applied = migrate(conn)
        print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return 0


# -- portals ----------------------------------------------------------------------------------
def cmd_portals(args) -> int:
    from harvester.domain.run import format_duration

    def every(delta):
        return None if delta is None else format_duration(delta)

    portals = portal_config.load_portals(args.file)
    if args.json:
        _print_json([{"name": p.name, "url": p.url, "enabled": p.enabled, "schedule": p.schedule,
                      "dag_id": p.dag_id, "lookback": every(p.lookback), "reconcile_every": every(p.reconcile_every),
                      "full_sync_every": every(p.full_sync_every)} for p in portals])
        return 0
    _table(f"Portals ({portal_config.portals_file() if not args.file else args.file})",
           ["name", "url", "enabled", "schedule", "dag", "lookback", "reconcile", "full sync"],
           [(p.name, p.url, "yes" if p.enabled else "no", p.schedule or "-", p.dag_id, every(p.lookback),
             every(p.reconcile_every) or "off", every(p.full_sync_every) or "off") for p in portals])
    return 0


# -- harvest ----------------------------------------------------------------------------------
def cmd_harvest(args) -> int:
    from harvester.pipeline import steps as pipeline
    from harvester.embeddings import get_provider
    from harvester.store import db

    portal = _resolve_portal(args.portal)
    provider = get_provider()
    with db.open_cli() as conn, db.open_cli() as reader:
        stats = pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider, full_sync=args.full,
                                 reconcile=args.reconcile, force_removals=args.force_removals,
                                 takeover=args.takeover)
    if args.json:
        _print_json(stats)
    else:
        print(" ".join(f"{k}={v}" for k, v in stats.items()))
    return 0


# -- runs -------------------------------------------------------------------------------------
def cmd_runs(args) -> int:
    from harvester.domain.run import RECONCILE_KEYS, STAT_KEYS
    from harvester.store import db

    portal = _resolve_portal(args.portal)
    with db.open_cli() as conn:
        rows = conn.execute(
            "SELECT run_id, portal_name, mode, status, started_at, finished_at, stats, error, reconcile_reason"
            " FROM sync_runs"
            " WHERE (%(portal)s::text IS NULL OR portal_url = %(portal)s)"
            " ORDER BY started_at DESC, run_id DESC LIMIT %(limit)s",
            {"portal": portal.url if portal else None, "limit": args.limit}).fetchall()
    rows = list(reversed(rows))
    if args.json:
        _print_json([{"run_id": r[0], "portal": r[1], "mode": r[2], "status": r[3], "started_at": r[4],
                      "finished_at": r[5], "stats": r[6], "error": r[7], "reconciled": r[8]} for r in rows])
        return 0
    reconciled = any(r[8] for r in rows)
    # One column per run, one row per figure: readable in any terminal.
    _table("Harvest runs", ["", *[f"run {r[0]}" for r in rows]],
           [("portal", *[r[1] for r in rows]), ("mode", *[r[2] for r in rows]), ("status", *[r[3] for r in rows]),
            ("started", *[r[4] for r in rows]),
            ("took", *[f"{(r[5] - r[4]).total_seconds():.1f}s" if r[5] else "-" for r in rows]),
            ("reconciled", *["yes" if r[8] else ("-" if r[2] == "incremental" else "full listing") for r in rows]),
            *[(key, *[r[6].get(key, 0) for r in rows]) for key in STAT_KEYS
              + (RECONCILE_KEYS if reconciled else ())]])
    for r in rows:
        if r[8]:
            print(f"run {r[0]} reconciled: {r[8]}")
        if r[7]:
            print(f"run {r[0]}: {r[7]}")
    return 0


# -- datasets ---------------------------------------------------------------------------------
def cmd_datasets(args) -> int:
    from harvester.store import db

    portal = _resolve_portal(args.portal)
    with db.open_cli() as conn:
        rows = conn.execute(
            "SELECT title, organization, url, metadata_modified, content_hash,"
            " embedded_content_hash = content_hash AS embedded, tags FROM datasets"
            " WHERE (%(portal)s::text IS NULL OR portal_url = %(portal)s) AND removed_at IS NULL"
            " ORDER BY metadata_modified DESC NULLS LAST, id LIMIT %(limit)s",
            {"portal": portal.url if portal else None, "limit": args.limit}).fetchall()
        total = conn.execute("SELECT count(*) FROM datasets WHERE (%(portal)s::text IS NULL OR portal_url = %(portal)s)"
                             " AND removed_at IS NULL", {"portal": portal.url if portal else None}).fetchone()[0]
    if args.json:
        _print_json([{"title": r[0], "organization": r[1], "url": r[2], "metadata_modified": r[3],
                      "content_hash": r[4], "embedded": bool(r[5]), "tags": r[6]} for r in rows])
        return 0
    _table(f"Datasets ({len(rows)} of {total})", ["title", "organization", "modified", "embedded", "url"],
           [(r[0][:70], (r[1] or "")[:40], r[3], "yes" if r[5] else "pending", r[2]) for r in rows])
    return 0


# -- search -------------------------------------------------------------------------------------
def _when(value: str):
    """A --since / --until value: a date (its whole day) or an ISO date and time."""
    from datetime import date

    try:
        return date.fromisoformat(value) if len(value) == 10 else datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a date (YYYY-MM-DD) or ISO date and time") from None


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be a whole number of at least 1")
    return number


def cmd_search(args) -> int:
    from harvester.store import search
    from harvester.store import db

    portal = _resolve_portal(args.portal)
    filters = search.SearchFilters(portal_url=portal.url if portal else None, organization=args.organization,
                                   tag=args.tag, format=args.format, license=args.license, since=args.since,
                                   until=args.until, include_removed=args.include_removed)
    try:
        settings = search.SearchSettings.from_env()
    except ValueError as exc:
        print(f"harvester: error: {exc}", file=sys.stderr)
        return 2
    with db.open_cli() as conn:
        found = search.search(conn, args.query, mode=args.mode, filters=filters, limit=args.limit, settings=settings)
        names = {p.url: p.name for p in portal_config.load_portals()} if found.items else {}
    if found.note:
        print(f"note: {found.note}", file=sys.stderr)
    results = [{"rank": r["rank"], "score": r["score"], "matched": r["matched"],
                "portal": names.get(r["portal_url"], r["portal_url"]), "portal_url": r["portal_url"],
                "title": r["title"], "url": r["url"], "organization": r["organization"], "snippet": r["snippet"],
                "id": r["source_id"], "source_id": r["source_id"], "similarity": r["similarity"],
                "text_rank": r["text_rank"], "metadata_modified": r["metadata_modified"],
                "removed": r["removed_at"] is not None} for r in found.items]
    if args.json:
        _print_json(results)
        return 0
    _table(f"Search: {args.query!r} ({args.mode}{', ' + found.model if found.model else ''})",
           ["#", "score", "matched", "portal", "title", "snippet", "url"],
           [(r["rank"], f"{r['score']:.4f}", "+".join(r["matched"]), r["portal"], r["title"][:70],
             r["snippet"][:160], r["url"]) for r in results])
    return 0


# -- embeddings: stats, invalidate, prune ---------------------------------------------------------
def cmd_stats(args) -> int:
    from harvester.embeddings import get_provider
    from harvester.store import db, vectors

    model = get_provider().model
    with db.open_cli() as conn:
        cache = vectors.cache_stats(conn)
        rows = conn.execute(
            """
            SELECT r.portal_name, r.portal_url, count(*),
                   sum((stats->>'embedding_requests')::bigint), sum((stats->>'embedded')::bigint),
                   sum((stats->>'embeddings_reused')::bigint), sum(coalesce((stats->>'embedding_calls_saved')::bigint, 0)),
                   sum(coalesce((stats->>'embedding_tokens_saved')::bigint, 0))
            FROM sync_runs r WHERE status = 'committed' GROUP BY r.portal_name, r.portal_url ORDER BY 1
            """).fetchall()
        portals = []
        for name, url, n_runs, *sums in rows:
            requests, embedded, reused, calls, tokens = (int(x or 0) for x in sums)
            covered, live = vectors.coverage(conn, url).get(model, (0, None))
            if live is None:
                live = conn.execute("SELECT count(*) FROM datasets WHERE portal_url = %s AND removed_at IS NULL",
                                    (url,)).fetchone()[0]
            looked_up = (embedded or 0) + (reused or 0)
            portals.append({"portal": name, "runs": n_runs, "embedding_requests": int(requests or 0),
                            "embedded": int(embedded or 0), "reused": int(reused or 0),
                            "hit_rate": round((reused or 0) / looked_up, 4) if looked_up else None,
                            "calls_saved": int(calls or 0), "tokens_saved": int(tokens or 0),
                            "datasets": int(live), "with_vector": int(covered)})
    if args.json:
        _print_json({"active_model": model, "cache": cache, "portals": portals})
        return 0
    _table(f"Embedding cache ({cache['bytes'] / 1e6:.1f} MB)", ["model", "dimension", "vectors"],
           [(m["model"] + (" (active)" if m["model"] == model else ""), m["dimension"], m["vectors"])
            for m in cache["models"]])
    _table("Per portal (committed runs)", ["portal", "runs", "requests", "embedded", "reused", "hit rate",
                                           "calls saved", "tokens saved", "with vector"],
           [(p["portal"], p["runs"], p["embedding_requests"], p["embedded"], p["reused"],
             "-" if p["hit_rate"] is None else f"{p['hit_rate']:.0%}", p["calls_saved"], p["tokens_saved"],
             f"{p['with_vector']}/{p['datasets']}") for p in portals])
    return 0


def cmd_embeddings(args) -> int:
    from harvester.embeddings import EmbeddingError, get_provider
    from harvester.store import db, vectors

    with db.open_cli() as conn:
        if args.action == "prune":
            print(f"pruned {vectors.prune(conn)} vectors no dataset uses")
            return 0
        chosen = [x for x in (args.portal, args.dataset, args.model) if x]
        if len(chosen) != 1:
            print("harvester: error: invalidate takes exactly one of --portal, --dataset, --model", file=sys.stderr)
            return 2
        if args.model:
            try:
                active = get_provider().model
            except EmbeddingError:  # no usable provider configured: every dataset that lost its vector is pending
                active = None
            n = vectors.invalidate(conn, args.model, all_of_model=True, active_model=active)
            print(f"invalidated {n} vectors of model {args.model}")
            return 0
        model = get_provider().model
        portal = _resolve_portal(args.portal)
        n = vectors.invalidate(conn, model, portal_url=portal.url if portal else None, source_id=args.dataset)
        print(f"invalidated {n} vectors of {model}; their datasets are embedded again on the next run")
    return 0


# -- demo portal ------------------------------------------------------------------------------
def cmd_demo_portal(args) -> int:
    from harvester.testing.ckan_portal import main as serve

    return serve(["--port", str(args.port), *sum((["--data", d] for d in args.data), [])])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harvester", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("db", help="the database: embedded server and migrations")
    p.add_argument("action", choices=["start", "stop", "url", "status", "migrate"])
    p.add_argument("--resolve", action="store_true",
                   help="with url: the database the CLI would use (configured or embedded)")
    p.add_argument("--redact", action="store_true", help="with url: hide the password")
    p.set_defaults(func=cmd_db)

    p = sub.add_parser("portals", help="list the portals in portals.yaml (validating it)")
    p.add_argument("--file", help="portals file (default: $HARVESTER_PORTALS_FILE or dags/portals.yaml)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_portals)

    p = sub.add_parser("harvest", help="run one harvest of a portal now, without Airflow")
    p.add_argument("portal", help="the portal's name in portals.yaml")
    p.add_argument("--full", action="store_true", help="list every dataset, not only modified ones")
    p.add_argument("--reconcile", action="store_true",
                   help="also list every identifier (ids and modification times only), fetch what we lack or hold "
                        "stale and remove what the portal no longer lists")
    p.add_argument("--force-removals", action="store_true",
                   help="on a full sync or a reconciliation, remove unlisted datasets even past the portal's "
                        "max_removal_share")
    p.add_argument("--takeover", action="store_true",
                   help="if another run of the portal is running (a DAG run, another harvest), abort it and run "
                        "this one; without it, harvest refuses and names that run")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_harvest)

    p = sub.add_parser("runs", help="recent harvest runs with their stats")
    p.add_argument("-p", "--portal", help="the portal's name in portals.yaml")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("datasets", help="datasets we hold, most recently modified first")
    p.add_argument("-p", "--portal", help="the portal's name in portals.yaml")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_datasets)

    p = sub.add_parser("search", help="search the datasets: full text and vectors, fused (README: Search)")
    p.add_argument("query")
    p.add_argument("--mode", choices=["hybrid", "vector", "text"], default="hybrid",
                   help="hybrid (default): full text and vectors fused by reciprocal rank; or one side alone")
    p.add_argument("-p", "--portal", help="only this portal (its name in portals.yaml)")
    p.add_argument("--organization", help="only this organization (its title or name)")
    p.add_argument("--tag", help="only datasets with this tag")
    p.add_argument("--format", help="only datasets with a resource of this format (csv, json, ...)")
    p.add_argument("--license", help="only this licence (its id or title)")
    p.add_argument("--since", type=_when, help="modified on or after (YYYY-MM-DD or ISO date and time, UTC)")
    p.add_argument("--until", type=_when, help="modified on or before (a date: that whole day)")
    p.add_argument("--include-removed", action="store_true", help="datasets removed from their portal too")
    p.add_argument("--limit", type=_positive_int, default=10)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("stats", help="the embedding cache: size, hit rate and savings per portal")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("embeddings", help="force re-embedding (invalidate) or drop unused vectors (prune)")
    p.add_argument("action", choices=["invalidate", "prune"])
    p.add_argument("--portal", help="invalidate the active model's vectors of this portal's datasets")
    p.add_argument("--dataset", help="invalidate the active model's vector of this dataset (its CKAN id)")
    p.add_argument("--model", help="invalidate every vector of this model")
    p.set_defaults(func=cmd_embeddings)

    from harvester.cli import history as history_cli

    history_cli.register(sub)

    p = sub.add_parser("demo-portal", help="serve CKAN records from JSONL files as a local CKAN portal")
    p.add_argument("--data", action="append", required=True, help="a JSONL file of CKAN packages (repeatable)")
    p.add_argument("--port", type=int, default=8765)
    p.set_defaults(func=cmd_demo_portal)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # The CLI may read Airflow connections (gemini_default); importing Airflow must not take over
    # this process's logging (it would print log lines into --json output on stdout).
    if "airflow" not in sys.modules:
        os.environ.setdefault("_AIRFLOW__AS_LIBRARY", "1")
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from harvester.sources.ckan import CkanError
    from harvester.embeddings import EmbeddingError
    from harvester.config.portals import PortalConfigError
    from harvester.store.db import DatabaseConfigError, DatabaseLookupError
    from harvester.store.migrations import MigrationError
    from harvester.store.runs import NotResumable, RunInProgress
    from harvester.store.embedded.server import EmbeddedServerError
    from harvester.store.vector_check import VectorExtensionError

    try:
        return args.func(args) or 0
    except (PortalConfigError, CkanError, EmbeddingError, EmbeddedServerError, VectorExtensionError,
            RunInProgress, NotResumable, DatabaseConfigError, DatabaseLookupError, MigrationError,
            LookupError) as exc:
        print(f"harvester: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
