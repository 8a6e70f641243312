"""`harvester duplicates list | show | split | merge | forget | stats | regroup`: the same dataset on
several portals (store/duplicates.py, docs/duplicates.md).

A dataset is named by its portal and its id there (``PORTAL SOURCE_ID``). PORTAL is a portal's name
in portals.yaml or a portal's URL (one in portals.yaml or one whose datasets the database holds).
An unknown portal or dataset raises LookupError naming it (main prints it and exits 2). split, merge
and forget record who decided (``--by``, default ``cli:<OS user>``); their decisions are kept across
runs until forgotten.
"""
from __future__ import annotations

import getpass

from harvester.cli import options, output
from harvester.cli.output import print_json, when


# -- helpers ----------------------------------------------------------------------------------
def _portal_url(conn, portal: str) -> str:
    """The URL of ``portal``: a name in portals.yaml or in the database's runs, or a URL known to
    portals.yaml or the database."""
    if "://" not in portal:
        return options.find_portal(conn, portal).url
    from harvester.config import portals as portal_config
    from harvester.config.portals import PortalConfigError

    try:
        configured = {p.url.rstrip("/") for p in portal_config.load_portals()}
    except PortalConfigError:
        configured = set()
    if portal.rstrip("/") in configured:
        return next(p.url for p in portal_config.load_portals() if p.url.rstrip("/") == portal.rstrip("/"))
    row = conn.execute("SELECT portal_url FROM datasets WHERE portal_url IN (%s, %s, %s) LIMIT 1",
                       (portal, portal.rstrip("/"), portal.rstrip("/") + "/")).fetchone()
    if row is None:
        raise LookupError(f"no portal {portal} in portals.yaml or in the database")
    return row[0]


def _dataset_id(conn, portal: str, source_id: str) -> int:
    from harvester.store import duplicates

    url = _portal_url(conn, portal)
    try:
        return duplicates.find_dataset_id(conn, url, source_id)
    except duplicates.DuplicateError:
        where = url if url == portal else f"portal {portal} ({url})"
        raise LookupError(f"no dataset with id {source_id!r} in {where}") from None


def _by(args) -> str:
    return args.by or f"cli:{getpass.getuser()}"


def _open():
    from harvester.store import db

    return db.open_cli()


def _member_line(m: dict) -> str:
    mark = "*" if m["is_canonical"] else " "
    how = "canonical" if m["is_canonical"] else f"{m['evidence']} {m['confidence']:.2f}" + (
        ", a copy" if m["copy_of"] else "")
    removed = f" (removed {when(m['removed_at'])})" if not m["live"] else ""
    return f"  {mark} [{m['dataset_id']}] {m['portal_name']}  {m['source_id']}  {m['title']}  ({how}){removed}"


def _print_group(group: dict, title: str) -> None:
    if group["group_id"] is None:
        print(f"{title}: alone (in no duplicate group)")
    else:
        print(f"{title}: group {group['group_id']}, {len(group['members'])} members (* canonical)")
        for m in group["members"]:
            print(_member_line(m))
    for o in group.get("overrides") or []:
        note = f": {o['note']}" if o["note"] else ""
        print(f"  override: {o['a']} and {o['b']} {o['decision']}, by {o['decided_by']} at {when(o['decided_at'])}"
              f"{note}")


# -- list -------------------------------------------------------------------------------------
def cmd_list(args) -> int:
    from harvester.store import duplicates

    with _open() as conn:
        url = _portal_url(conn, args.portal) if args.portal else None
        groups, total = duplicates.list_groups(conn, url, limit=args.limit, offset=args.offset)
        queued = duplicates.waiting(conn)
    if args.json:
        print_json({"total": total, "offset": args.offset, "groups": groups, "waiting": queued})
        return 0
    if queued:
        print(f"({queued:,} datasets changed by committed runs wait to be grouped: the next run of any portal "
              "groups them, or `harvester duplicates regroup`)")
    where = f" with a member on {args.portal}" if args.portal else ""
    if not groups:
        print(f"no duplicate groups{where}" + (f" from offset {args.offset}" if args.offset else ""))
        return 0
    print(f"{total} duplicate groups{where}; groups {args.offset + 1} to {args.offset + len(groups)},"
          " largest and newest first (* canonical)")
    for group in groups:
        print(f"group {group['group_id']} ({len(group['members'])} members)")
        for m in group["members"]:
            print(_member_line(m))
    return 0


# -- regroup ----------------------------------------------------------------------------------
def cmd_regroup(args) -> int:
    """Group the datasets waiting for it now (what a run's grouping left: it could not take the
    groups' lock within HARVESTER_GROUPING_WAIT_SECS, or its worker died past the commit)."""
    from harvester.store import duplicates

    with _open() as conn:
        try:
            out = duplicates.regroup_pending(conn, wait=args.wait)
        except duplicates.GroupingDeferred as exc:
            return output.error(str(exc))
    if args.json:
        print_json(out)
    elif not out["touched"]:
        print("no dataset waits to be grouped")
    else:
        print(f"{out['touched']:,} datasets re-keyed, {out['examined']:,} examined with their neighbours in "
              f"{out['seconds'] - out['waited']:.1f}s: {out['grouped']:,} in {out['groups']:,} groups")
    return 0


# -- show -------------------------------------------------------------------------------------
def cmd_show(args) -> int:
    from harvester.store import duplicates

    with _open() as conn:
        dataset_id = _dataset_id(conn, args.portal, args.source_id)
        group = duplicates.group_of(conn, dataset_id)
    if args.json:
        print_json(group)
        return 0
    _print_group(group, f"{args.source_id} on {args.portal} [{dataset_id}]")
    return 0


# -- split / merge / forget -------------------------------------------------------------------
def cmd_split(args) -> int:
    from harvester.store import duplicates

    with _open() as conn:
        dataset_id = _dataset_id(conn, args.portal, args.source_id)
        others = [_dataset_id(conn, p, s) for p, s in args.from_ or []]
        group = duplicates.split(conn, dataset_id, by=_by(args), note=args.note, from_ids=others or None)
    if args.json:
        print_json(group)
        return 0
    _print_group(group, f"split {args.source_id} on {args.portal} [{dataset_id}]; now")
    return 0


def cmd_merge(args) -> int:
    from harvester.store import duplicates

    with _open() as conn:
        dataset_id = _dataset_id(conn, args.portal, args.source_id)
        other_id = _dataset_id(conn, args.other_portal, args.other_source_id)
        group = duplicates.merge(conn, dataset_id, other_id, by=_by(args), note=args.note)
    if args.json:
        print_json(group)
        return 0
    _print_group(group, f"merged {args.source_id} on {args.portal} [{dataset_id}] with {args.other_source_id} on "
                        f"{args.other_portal} [{other_id}]; now")
    return 0


def cmd_forget(args) -> int:
    from harvester.store import duplicates

    with _open() as conn:
        dataset_id = _dataset_id(conn, args.portal, args.source_id)
        dropped = duplicates.forget(conn, dataset_id)
        group = duplicates.group_of(conn, dataset_id)
    if args.json:
        print_json({"forgotten": dropped, **group})
        return 0
    _print_group(group, f"forgot {dropped} overrides about {args.source_id} on {args.portal} [{dataset_id}]; now")
    return 0


# -- stats ------------------------------------------------------------------------------------
def cmd_stats(args) -> int:
    from harvester.store import duplicates

    with _open() as conn:
        url = _portal_url(conn, args.portal)
        copies = duplicates.portal_copies(conn, url)
    if args.json:
        print_json({"portal": args.portal, "portal_url": url, **copies})
        return 0
    print(f"{args.portal} ({url}): {copies['copies']} live datasets are copies of other portals' datasets")
    if copies["copies_of"]:
        output.table(f"{args.portal} copies", ["portal", "url", "datasets"],
                     [(c["portal_name"], c["portal_url"], c["datasets"]) for c in copies["copies_of"]])
    if copies["copied_by"]:
        output.table(f"Portals copying {args.portal}", ["portal", "url", "datasets"],
                     [(c["portal_name"], c["portal_url"], c["datasets"]) for c in copies["copied_by"]])
    else:
        print(f"no other portal copies {args.portal}'s datasets")
    return 0


# -- the parser -------------------------------------------------------------------------------
_PORTAL_HELP = "the portal: its name in portals.yaml, or its URL"


def _dataset_args(p) -> None:
    p.add_argument("portal", metavar="PORTAL", help=_PORTAL_HELP)
    p.add_argument("source_id", metavar="SOURCE_ID", help="the dataset's id on that portal")


def _decision_args(p) -> None:
    p.add_argument("--note", help="why (kept with the decision)")
    p.add_argument("--by", help="who decides (default: cli:<OS user>)")
    p.add_argument("--json", action="store_true")


def register(subparsers) -> None:
    """Add duplicates (list, show, split, merge, forget, stats, regroup) to the ``harvester`` subparsers."""
    top = subparsers.add_parser("duplicates", help="the same dataset on several portals: groups, and operators' "
                                                   "splits and merges (docs/duplicates.md)")
    sub = top.add_subparsers(dest="duplicates_command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="duplicate groups with their members, largest and newest first")
    p.add_argument("-p", "--portal", help="only groups with a member on this portal (" + _PORTAL_HELP + ")")
    p.add_argument("--limit", type=options.positive_int, default=20, help="at most this many groups (default 20)")
    p.add_argument("--offset", type=int, default=0, help="skip this many groups first")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="a dataset's group (or alone) and the overrides about it")
    _dataset_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("split", help="take a dataset out of its group, kept across runs")
    _dataset_args(p)
    p.add_argument("--from", dest="from_", nargs=2, action="append", metavar=("PORTAL", "SOURCE_ID"),
                   help="only apart from this dataset (repeatable; default: every other member)")
    _decision_args(p)
    p.set_defaults(func=cmd_split)

    p = sub.add_parser("merge", help="put two datasets in one group whatever the evidence, kept across runs")
    _dataset_args(p)
    p.add_argument("other_portal", metavar="OTHER_PORTAL", help=_PORTAL_HELP)
    p.add_argument("other_source_id", metavar="OTHER_SOURCE_ID", help="the other dataset's id on that portal")
    _decision_args(p)
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("forget", help="drop the overrides about a dataset: the evidence alone decides again")
    _dataset_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_forget)

    p = sub.add_parser("regroup", help="group now the datasets that wait for it (a run's grouping left them: "
                                       "another held the lock too long, or its worker died)")
    p.add_argument("--wait", type=options.positive_float, default=60.0,
                   help="seconds to wait for a grouping under way to end (default 60)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_regroup)

    p = sub.add_parser("stats", help="how many of a portal's datasets copy other portals', and who copies it")
    p.add_argument("portal", metavar="PORTAL", help=_PORTAL_HELP)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)
