"""`harvester demo-portal`: serve CKAN records from JSONL files as a local CKAN portal."""
from __future__ import annotations


def cmd_demo_portal(args) -> int:
    from harvester.testing.ckan_portal import main as serve

    return serve(["--port", str(args.port), *sum((["--data", d] for d in args.data), [])])


def register(subparsers) -> None:
    """Add demo-portal to the ``harvester`` subparsers."""
    p = subparsers.add_parser("demo-portal", help="serve CKAN records from JSONL files as a local CKAN portal")
    p.add_argument("--data", action="append", required=True, help="a JSONL file of CKAN packages (repeatable)")
    p.add_argument("--port", type=int, default=8765)
    p.set_defaults(func=cmd_demo_portal)
