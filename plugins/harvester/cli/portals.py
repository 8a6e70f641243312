"""`harvester portals`: the portals of portals.yaml, validated."""
from __future__ import annotations

from harvester.cli.output import print_json, table


def cmd_portals(args) -> int:
    from harvester.config import portals as portal_config
    from harvester.domain.run import format_duration

    def every(delta):
        return None if delta is None else format_duration(delta)

    portals = portal_config.load_portals(args.file)
    if args.json:
        print_json([{"name": p.name, "url": p.url, "enabled": p.enabled, "schedule": p.schedule,
                     "dag_id": p.dag_id, "lookback": every(p.lookback), "reconcile_every": every(p.reconcile_every),
                     "full_sync_every": every(p.full_sync_every)} for p in portals])
        return 0
    table(f"Portals ({portal_config.portals_file() if not args.file else args.file})",
          ["name", "url", "enabled", "schedule", "dag", "lookback", "reconcile", "full sync"],
          [(p.name, p.url, "yes" if p.enabled else "no", p.schedule or "-", p.dag_id, every(p.lookback),
            every(p.reconcile_every) or "off", every(p.full_sync_every) or "off") for p in portals])
    return 0


def register(subparsers) -> None:
    """Add portals to the ``harvester`` subparsers."""
    p = subparsers.add_parser("portals", help="list the portals in portals.yaml (validating it)")
    p.add_argument("--file", help="portals file (default: $HARVESTER_PORTALS_FILE or dags/portals.yaml)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_portals)
