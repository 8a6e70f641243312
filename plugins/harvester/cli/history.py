"""`harvester changes | versions | diff | review | purge`: dataset history from the shell (`harvester export
changes` is in export.py).

``register(subparsers)`` adds the commands to the ``harvester`` parser. ``-p``/``--portal`` takes a
portal's name in portals.yaml, or as its runs recorded it (cli/options.py find_portal). A dataset
that is not found raises LookupError (the CLI prints it and exits 2).
"""
from __future__ import annotations

import os

from harvester.cli import options, output
from harvester.cli.output import print_json, short, when


# -- helpers ----------------------------------------------------------------------------------
def _version(number: int | None) -> str:
    return "-" if number is None else str(number)


def _portal_url(conn, name: str) -> str:
    return options.find_portal(conn, name).url


def _open():
    from harvester.store import db

    return db.open_cli()


def _dataset(conn, portal_name: str, portal_url: str, args) -> dict:
    from harvester.store import history

    found = history.find_dataset(conn, portal_url, url=args.url, source_id=args.id)
    if found is None:
        what = f"url {args.url}" if args.url else f"id {args.id}"
        raise LookupError(f"no dataset with {what} in portal {portal_name} ({portal_url})")
    return found


# -- changes ----------------------------------------------------------------------------------
def cmd_changes(args) -> int:
    from rich.text import Text

    from harvester.store import history

    with _open() as conn:
        url = _portal_url(conn, args.portal)
        rows = history.list_changes(conn, url, review_only=args.review, since=args.since, limit=args.limit)
    if args.json:
        print_json([{"n": n, **row} for n, row in enumerate(rows, 1)])
        return 0
    console = output.console()
    what = "changes needing review" if args.review else "changes"
    if not rows:
        console.print(f"no {what} in {args.portal}" + (f" since {when(args.since)}" if args.since else ""))
        return 0
    console.print(Text(f"{len(rows)} {what} in {args.portal} ({url}), newest first", style="bold"))
    for n, row in enumerate(rows, 1):
        console.print()
        header = Text(f"[{n}] {row['change_type'].upper()}", style="bold")
        if row["requires_review"]:
            header.append(" (REVIEW)", style="bold red")
        console.print(header, soft_wrap=True)
        for label, value in (("title", row["title"]), ("url", row["url"]), ("detected", when(row["detected_at"])),
                             ("significance", f"{round(row['significance'] * 100)}%"),
                             ("changed", row["summary"])):
            console.print(Text(f"    {label + ':':<14}{value}"), soft_wrap=True)
        console.print(Text(f"    Version {_version(row['old_version'])} -> {_version(row['new_version'])}"),
                      soft_wrap=True)
    return 0


# -- versions ---------------------------------------------------------------------------------
def cmd_versions(args) -> int:
    from rich.table import Table

    from harvester.domain import changes as ch
    from harvester.store import history

    with _open() as conn:
        url = _portal_url(conn, args.portal)
        dataset = _dataset(conn, args.portal, url, args)
        versions = history.list_versions(conn, dataset["id"])
    if args.json:
        print_json({"dataset": dataset, "versions": [
            {k: v for k, v in item.items() if k not in ("snapshot", "description")} for item in versions]})
        return 0
    removed = f", removed {when(dataset['removed_at'])}" if dataset["removed_at"] else ""
    table = Table(title=f"{dataset['title']} ({dataset['url']}){removed}: {len(versions)} versions")
    for column in ("version", "first seen (UTC)", "last seen (UTC)", "change", "content hash"):
        table.add_column(column, no_wrap=True)
    table.add_column("changed fields", overflow="fold")
    for item in versions:
        fields = ch.summarize(item["changed_fields"]) or ("first version" if item["version_number"] == 1 else "")
        table.add_row(f"{item['version_number']}{' (current)' if item['is_current'] else ''}",
                      short(item["first_seen_at"]), short(item["last_seen_at"]), item["change_type"],
                      item["content_hash"][:10], fields)
    output.console(120).print(table)
    return 0


# -- diff -------------------------------------------------------------------------------------
def cmd_diff(args) -> int:
    from rich.text import Text

    from harvester.domain import diff
    from harvester.store import history

    with _open() as conn:
        url = _portal_url(conn, args.portal)
        dataset = _dataset(conn, args.portal, url, args)
        current = history.current_version_number(conn, dataset["id"])
        from_n, to_n = diff.versions_to_compare(current, args.from_, args.to)
        if to_n is None:
            raise LookupError(f"dataset {dataset['url']} has no versions")
        if from_n is None or from_n < 1:
            print(f"{dataset['url']} has only version {to_n}: nothing to compare it with")
            return 0
        old, new = history.get_version(conn, dataset["id"], from_n), history.get_version(conn, dataset["id"], to_n)
    missing = [str(n) for n, version in ((from_n, old), (to_n, new)) if version is None]
    if missing:
        raise LookupError(f"dataset {dataset['url']} has no version {' or '.join(missing)}"
                          f" (versions 1 to {current} exist)")
    lines = diff.unified_diff(
        old["snapshot"], new["snapshot"],
        f"version {from_n} ({old['change_type']}, first seen {when(old['first_seen_at'])})",
        f"version {to_n} ({new['change_type']}, first seen {when(new['first_seen_at'])})")
    if args.json:
        print_json({"dataset": dataset, "from": from_n, "to": to_n, "diff": lines})
        return 0
    console = output.console()
    console.print(Text(f"{dataset['title']} ({dataset['url']})", style="bold"), soft_wrap=True)
    if not lines:
        console.print(f"versions {from_n} and {to_n} have the same snapshot")
        return 0
    for line in lines:
        style = ("bold" if line.startswith(("---", "+++")) else "cyan" if line.startswith("@@")
                 else "red" if line.startswith("-") else "green" if line.startswith("+") else None)
        console.print(Text(line, style=style or ""), soft_wrap=True)
    return 0


# -- purge ------------------------------------------------------------------------------------
def cmd_purge(args) -> int:
    from harvester.store import history

    from datetime import datetime, timezone

    from harvester.config.settings import report_settings

    keep = report_settings().keep
    keep_days = keep.days
    outcomes_before = datetime.now(timezone.utc) - keep
    with _open() as conn:
        url = _portal_url(conn, args.portal)
        counts = history.purge(conn, url, args.removed_before, dry_run=args.dry_run, outcomes_before=outcomes_before)
    if args.json:
        print_json({"portal": args.portal, "portal_url": url, "removed_before": args.removed_before,
                    "outcomes_before": outcomes_before, **counts})
        return 0
    verb = "would purge" if args.dry_run else "purged"
    print(f"{verb} {counts['datasets']} datasets of {args.portal} removed before {when(args.removed_before)}"
          f" ({counts['versions']} versions, {counts['changes']} changes), and {counts['outcomes']} record "
          f"outcomes older than {keep_days} days (HARVESTER_OUTCOMES_KEEP_DAYS)")
    return 0


# -- review -----------------------------------------------------------------------------------
def _reviewer(name: str | None) -> str:
    import getpass

    if name and name.strip():
        return name.strip()
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):  # no login name to be found
        raise ValueError("say who reviews with --by NAME (no $USER here)") from None


def cmd_review(args) -> int:
    from harvester.store import history, review

    if args.queue:
        if args.change_id is not None or args.dismiss or args.note or args.by:
            return output.error("--queue lists the queue; it takes no change id, --dismiss, --note or --by")
        return _review_queue(args)
    if args.change_id is None:
        return output.error("give the id of the change to review (see harvester review --queue), or --queue")
    outcome = "dismissed" if args.dismiss else "reviewed"
    try:
        by = _reviewer(args.by)
        with _open() as conn:
            review.review(conn, args.change_id, outcome=outcome, by=by, note=args.note)
            change = history.get_change(conn, args.change_id)
    except (review.AlreadyReviewed, ValueError) as exc:
        return output.error(str(exc))
    if args.json:
        print_json(change)
        return 0
    print(f"change {change['id']} ({change['change_type']}: {change['title']}) {outcome} by {change['reviewed_by']}"
          f" at {when(change['reviewed_at'])}" + (f": {change['review_note']}" if change["review_note"] else ""))
    return 0


def _review_queue(args) -> int:
    from rich.text import Text

    from harvester.store import history

    with _open() as conn:
        url = _portal_url(conn, args.portal) if args.portal else None
        rows, total = history.page_changes(conn, portal_urls=[url] if url else None, queue=True, limit=args.limit)
    if args.json:
        print_json({"items": rows, "total": total})
        return 0
    console = output.console()
    where = f" in {args.portal}" if args.portal else ""
    if not rows:
        console.print(f"no changes waiting for review{where}")
        return 0
    console.print(Text(f"{total} changes waiting for review{where}, newest first"
                       + (f" (the first {len(rows)})" if len(rows) < total else ""), style="bold"))
    for row in rows:
        console.print()
        console.print(Text(f"[{row['id']}] {row['change_type'].upper()} {round(row['significance'] * 100)}%",
                           style="bold"), soft_wrap=True)
        for label, value in (("portal", row["portal_name"] or row["portal_url"]), ("title", row["title"]),
                             ("url", row["url"]), ("detected", when(row["detected_at"])), ("changed", row["summary"])):
            console.print(Text(f"    {label + ':':<14}{value}"), soft_wrap=True)
    console.print()
    console.print("harvester review <id> [--note TEXT] marks one reviewed; --dismiss dismisses it")
    return 0


# -- the parser -------------------------------------------------------------------------------
def _dataset_args(p) -> None:
    p.add_argument("-p", "--portal", required=True,
                   help="the portal's name (in portals.yaml, or as its runs recorded it)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("-u", "--url", help="the dataset's landing page URL (<portal>/dataset/<name>)")
    which.add_argument("--id", help="the dataset's CKAN id")


def register(subparsers) -> None:
    """Add changes, versions, diff, review and purge to the ``harvester`` subparsers."""
    p = subparsers.add_parser("changes", help="detected dataset changes, newest first")
    p.add_argument("-p", "--portal", required=True,
                   help="the portal's name (in portals.yaml, or as its runs recorded it)")
    p.add_argument("--review", action="store_true", help="only changes that require review")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--since", type=options.date_from, help="only changes detected at or after DATE (UTC unless given)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_changes)

    p = subparsers.add_parser("versions", help="every version of a dataset, newest first")
    _dataset_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_versions)

    p = subparsers.add_parser("diff", help="what changed between two versions of a dataset")
    _dataset_args(p)
    p.add_argument("--from", dest="from_", type=int, metavar="N", help="default: the version before --to")
    p.add_argument("--to", type=int, metavar="M", help="default: the current version")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_diff)

    p = subparsers.add_parser("review", help="mark a change reviewed or dismiss it; --queue: what waits for review")
    p.add_argument("change_id", nargs="?", type=int, help="the change's id (harvester review --queue lists them)")
    p.add_argument("--dismiss", action="store_true", help="dismiss the change instead of marking it reviewed")
    p.add_argument("--note", help="why (kept with the review)")
    p.add_argument("--by", help="who reviews (default: $USER)")
    p.add_argument("--queue", action="store_true", help="list the changes that require review and have none yet")
    p.add_argument("-p", "--portal",
                   help="with --queue: only this portal (its name in portals.yaml, or as its runs recorded it)")
    p.add_argument("--limit", type=int, default=50, help="with --queue: at most this many (default 50)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_review)

    p = subparsers.add_parser("purge", help="delete removed datasets, their versions and changes for good, and record outcomes "
                                   "older than HARVESTER_OUTCOMES_KEEP_DAYS")
    p.add_argument("-p", "--portal", required=True,
                   help="the portal's name (in portals.yaml, or as its runs recorded it)")
    p.add_argument("--removed-before", type=options.date_from, required=True, metavar="DATE")
    p.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_purge)
