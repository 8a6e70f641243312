"""`harvester harvest | runs`: a harvest now, without Airflow, and the runs so far."""
from __future__ import annotations

from harvester.cli import options
from harvester.cli.output import print_json, table


def cmd_harvest(args) -> int:
    from harvester.embeddings import get_provider
    from harvester.pipeline import steps as pipeline
    from harvester.store import db

    from harvester.config.portals import PortalConfigError

    try:
        portal = options.portal(args.portal)
    except PortalConfigError as exc:
        known = str(exc).startswith("no portal named") and _known_elsewhere(args.portal)
        if not known:
            raise
        raise PortalConfigError(f"{exc}; the harvester database knows {args.portal} "
                          f"({known}) from its runs, but a harvest needs the portal's settings: add it to that "
                          "file, or set HARVESTER_PORTALS_FILE to the file it came from (the demo's: "
                          "dags/portals.demo.yaml)") from None
    provider = get_provider()
    with db.open_cli() as conn, db.open_cli() as reader:
        stats = pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider, full_sync=args.full,
                                 reconcile=args.reconcile, force_removals=args.force_removals,
                                 takeover=args.takeover)
    if args.json:
        print_json(stats)
    else:
        print(" ".join(f"{k}={v}" for k, v in stats.items()))
    return 0


def _known_elsewhere(name: str) -> str | None:
    """The URL the database's runs recorded for a portal named ``name``, None when they know none."""
    from harvester.store import db
    from harvester.store.known_portals import portals_named

    with db.open_cli() as conn:
        found = portals_named(conn, name)
    return found[0].url if found else None


def cmd_runs(args) -> int:
    from harvester.domain.run import RECONCILE_KEYS, STAT_KEYS
    from harvester.store import db, runs

    with db.open_cli() as conn:
        url = options.find_portal_url(conn, args.portal)
        rows, _ = runs.page_runs(conn, url, limit=args.limit)
    rows.reverse()  # oldest first: the newest run in the last column
    if args.json:
        print_json([{"run_id": r["run_id"], "portal": r["portal_name"], "mode": r["mode"], "status": r["status"],
                     "started_at": r["started_at"], "finished_at": r["finished_at"], "stats": r["stats"],
                     "error": r["error"], "reconciled": r["reconcile_reason"]} for r in rows])
        return 0
    reconciled = any(r["reconcile_reason"] for r in rows)
    # One column per run, one row per figure: readable in any terminal.
    table("Harvest runs", ["", *[f"run {r['run_id']}" for r in rows]],
          [("portal", *[r["portal_name"] for r in rows]), ("mode", *[r["mode"] for r in rows]),
           ("status", *[r["status"] for r in rows]), ("started", *[r["started_at"] for r in rows]),
           ("took", *[f"{(r['finished_at'] - r['started_at']).total_seconds():.1f}s" if r["finished_at"] else "-"
                      for r in rows]),
           ("reconciled", *["yes" if r["reconcile_reason"] else ("-" if r["mode"] == "incremental" else "full listing")
                            for r in rows]),
           *[(key, *[r["stats"].get(key, 0) for r in rows]) for key in STAT_KEYS
             + (RECONCILE_KEYS if reconciled else ())]])
    for r in rows:
        if r["reconcile_reason"]:
            print(f"run {r['run_id']} reconciled: {r['reconcile_reason']}")
        if r["error"]:
            print(f"run {r['run_id']}: {r['error']}")
    return 0


def register(subparsers) -> None:
    """Add harvest and runs to the ``harvester`` subparsers."""
    p = subparsers.add_parser("harvest", help="run one harvest of a portal now, without Airflow")
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

    p = subparsers.add_parser("runs", help="recent harvest runs with their stats")
    p.add_argument("-p", "--portal", help="the portal's name (in portals.yaml, or as its runs recorded it)")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_runs)
