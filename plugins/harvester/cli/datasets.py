"""`harvester datasets | search`: the datasets we hold, and searching them."""
from __future__ import annotations

import sys

from harvester.cli import options
from harvester.cli.output import error, print_json, table


def cmd_datasets(args) -> int:
    from harvester.store import datasets, db

    with db.open_cli() as conn:
        url = options.find_portal_url(conn, args.portal)
        rows, total = datasets.page_live(conn, url, limit=args.limit)
    if args.json:
        print_json(rows)
        return 0
    table(f"Datasets ({len(rows)} of {total})", ["title", "organization", "modified", "embedded", "url"],
          [(r["title"][:70], (r["organization"] or "")[:40], r["metadata_modified"], "yes" if r["embedded"] else "pending",
            r["url"]) for r in rows])
    return 0


def cmd_search(args) -> int:
    from harvester.config import portals as portal_config
    from harvester.store import db, search

    try:
        settings = search.SearchSettings.from_env()
    except ValueError as exc:
        return error(str(exc))
    with db.open_cli() as conn:
        url = options.find_portal_url(conn, args.portal)
        filters = search.SearchFilters(portal_url=url, organization=args.organization, tag=args.tag,
                                       format=args.format, license=args.license, since=args.since, until=args.until,
                                       include_removed=args.include_removed)
        found = search.search(conn, args.query, mode=args.mode, filters=filters, limit=args.limit, settings=settings,
                              all_copies=args.all_copies)
        names = {}
        if found.items:  # portals.yaml's names first, then the ones the database's runs recorded
            from harvester.store.known_portals import known_portals

            names = {p.url: p.name for p in reversed(known_portals(conn))}
            names.update({p.url: p.name for p in portal_config.load_portals()})

    def also_on(copies: list[dict]) -> list[dict]:
        return [{**c, "portal": names.get(c["portal_url"], c["portal_name"])} for c in copies]

    if found.note:
        print(f"note: {found.note}", file=sys.stderr)
    results = [{"rank": r["rank"], "score": r["score"], "matched": r["matched"],
                "portal": names.get(r["portal_url"], r["portal_url"]), "portal_url": r["portal_url"],
                "title": r["title"], "url": r["url"], "organization": r["organization"], "snippet": r["snippet"],
                "id": r["source_id"], "source_id": r["source_id"], "similarity": r["similarity"],
                "text_rank": r["text_rank"], "metadata_modified": r["metadata_modified"],
                "removed": r["removed_at"] is not None, "dataset_id": r["dataset_id"], "group_id": r["group_id"],
                "canonical": r["canonical"], "also_on": also_on(r["also_on"]), "copies": r["copies"]}
               for r in found.items]
    if args.json:
        print_json(results)
        return 0
    table(f"Search: {args.query!r} ({args.mode}{', ' + found.model if found.model else ''})",
          ["#", "score", "matched", "portal", "title", "snippet", "url"],
          [(r["rank"], f"{r['score']:.4f}", "+".join(r["matched"]), r["portal"], _title_cell(r),
            r["snippet"][:160], r["url"]) for r in results])
    return 0


def _title_cell(result: dict) -> str:
    """The title, and under it the other portals a grouped result is on."""
    title = (result["title"] or "")[:70]
    portals = list(dict.fromkeys(c["portal"] for c in result["also_on"]))
    return f"{title}\nalso on: {', '.join(portals)}" if portals else title


def register(subparsers) -> None:
    """Add datasets and search to the ``harvester`` subparsers."""
    p = subparsers.add_parser("datasets", help="datasets we hold, most recently modified first")
    p.add_argument("-p", "--portal", help="the portal's name (in portals.yaml, or as its runs recorded it)")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_datasets)

    p = subparsers.add_parser("search", help="search the datasets: full text and vectors, fused (docs/search.md)")
    p.add_argument("query")
    p.add_argument("--mode", choices=["hybrid", "vector", "text"], default="hybrid",
                   help="hybrid (default): full text and vectors fused by reciprocal rank; or one side alone")
    p.add_argument("-p", "--portal", help="only this portal (its name in portals.yaml, or as its runs recorded it)")
    p.add_argument("--organization", help="only this organization (its title or name)")
    p.add_argument("--tag", help="only datasets with this tag")
    p.add_argument("--format", help="only datasets with a resource of this format (csv, json, ...)")
    p.add_argument("--license", help="only this licence (its id or title)")
    p.add_argument("--since", type=options.date_from, help="modified on or after (YYYY-MM-DD or ISO date and time, UTC)")
    p.add_argument("--until", type=options.date_until, help="modified on or before (a date: that whole day)")
    p.add_argument("--include-removed", action="store_true", help="datasets removed from their portal too")
    p.add_argument("--all-copies", action="store_true",
                   help="each portal's copy of a dataset as its own result (default: one result per duplicate group)")
    p.add_argument("--limit", type=options.positive_int, default=10)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_search)
