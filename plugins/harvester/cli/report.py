"""`harvester report | validate`: what became of a run's records, and what a catalogue's would.

``report RUN_ID`` (or ``report --portal P --last``, the portal's newest run) prints the run and its
per-record outcomes grouped by reason code (store/outcomes.py); ``--csv FILE`` writes every row.
``validate URL_OR_FILE`` reads a catalogue without harvesting it and without a database
(pipeline/validate.py) and prints the same grouped table, so a catalogue can be checked before it
is added to portals.yaml: exit 0 when no record has an error, 1 when some do, 2 when the document
is not a catalogue or cannot be read.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterable, Iterator, Mapping

from harvester.cli import options, output
from harvester.cli.output import print_json, when
from harvester.config.portals import VALIDATE_TYPES as KINDS  # the kinds validation reads

TABLE_COLUMNS = ("severity", "code", "count", "examples", "message")


# -- the one table of grouped outcomes ----------------------------------------------------------------
def group_rows(groups: Iterable[Mapping]) -> list[tuple[str, str, str, str, str]]:
    """The table's rows: severity, code, count, examples (comma-separated), message."""
    return [(g["severity"], g["code"], str(g["count"]), ", ".join(g["examples"]), g["message"]) for g in groups]


def print_groups(title: str, groups: list[Mapping], severity: str | None = None) -> None:
    """The grouped table ``report`` and ``validate`` both print (one format: their groups compare);
    ``severity``: the only one shown, which an empty table then says it lacks."""
    if not groups:
        print(f"{title}: no {severity + 's' if severity else 'errors or warnings'}")
        return
    output.table(title, TABLE_COLUMNS, group_rows(groups))


@contextmanager
def _csv_target(path: str) -> Iterator:
    if path == "-":
        yield sys.stdout
        return
    with open(path, "w", encoding="utf-8", newline="") as out:
        yield out


def write_csv(path: str, rows: Iterable[Mapping]) -> int:
    """Every row as CSV (domain.outcomes.csv_chunks) to ``path`` ('-': standard output); how many."""
    from harvester.domain.outcomes import csv_chunks

    counted = [0]

    def counting(items: Iterable[Mapping]) -> Iterator[Mapping]:
        for item in items:
            counted[0] += 1
            yield item

    with _csv_target(path) as out:
        for chunk in csv_chunks(counting(rows)):
            out.write(chunk)
    return counted[0]


# -- report -------------------------------------------------------------------------------------------
def _run_of(conn, args) -> dict:
    """The run asked for (runs.RUN_COLUMNS): by id, or the portal's newest."""
    from harvester.store import runs

    if args.run_id is not None:
        if args.portal or args.last:
            raise ValueError("give a run id, or --portal P --last, not both")
        run = runs.run_item(conn, args.run_id)
        if run is None:
            raise LookupError(f"no run with run_id {args.run_id}")
        return run
    if not (args.portal and args.last):
        raise ValueError("give a run id (see harvester runs), or --portal P --last for the portal's newest run")
    portal = options.find_portal(conn, args.portal)
    found, _ = runs.page_runs(conn, portal.url, limit=1)
    if not found:
        raise LookupError(f"portal {portal.name} ({portal.url}) has no runs yet")
    return found[0]


def cmd_report(args) -> int:
    from harvester.store import db, outcomes

    try:
        with db.open_cli() as conn:
            run = _run_of(conn, args)
            run_id = run["run_id"]
            counts = outcomes.counts(conn, [run_id]).get(run_id, {"errors": 0, "warnings": 0})
            groups = outcomes.groups(conn, run_id, severity=args.severity)
            written = write_csv(args.csv, outcomes.iter_rows(conn, run_id, severity=args.severity)) \
                if args.csv else None
    except ValueError as exc:
        return output.error(str(exc))
    if args.csv == "-":
        return 0
    if args.json:
        print_json({"run": run, "counts": counts, "groups": groups})
    else:
        print(f"run {run_id} of {run['portal_name']} ({run['portal_url']}): {run['mode']}, {run['status']}, "
              f"started {when(run['started_at'])}" + (f": {run['error']}" if run["error"] else ""))
        print(f"{counts['errors']} errors, {counts['warnings']} warnings"
              + (f" (shown: {args.severity}s)" if args.severity else ""))
        print_groups(f"Record outcomes of run {run_id}", groups, args.severity)
    if written is not None:
        print(f"wrote {written} rows to {args.csv}", file=sys.stderr)
    return 0


# -- validate -----------------------------------------------------------------------------------------
def _is_url(target: str) -> bool:
    return "://" in target


def cmd_validate(args) -> int:
    from harvester.pipeline import validate as v
    from harvester.sources import SourceError

    try:
        if _is_url(args.target):
            report = v.validate_url(args.target, args.type, pages=args.pages, max_rows=args.max_rows or v.MAX_ROWS)
        else:
            report = v.validate_path(args.target, args.type, max_rows=args.max_rows or v.MAX_ROWS)
    except (SourceError, ValueError, OSError) as exc:
        # One line naming the target once: the error names the URL that failed (pipeline/validate.py)
        said = str(exc)
        if said.startswith(f"{args.target}: "):
            said = said[len(args.target) + 2:]
        return output.error(f"cannot validate the catalogue: {said}" if args.target in said
                            else f"cannot validate {args.target}: {said}")
    if args.csv:
        written = write_csv(args.csv, ({**row, "portal_url": report.source} for row in report.rows))
    if args.csv != "-":
        if args.json:
            print_json({k: v_ for k, v_ in report.as_dict().items() if k != "rows"})
        else:
            guessed = f" (guessed: {report.guessed})" if report.guessed else ""
            cut = "" if report.complete else " (not the whole catalogue: the listing was cut, see --pages)"
            print(f"{report.source}: {report.kind}{guessed}")
            print(f"{report.records} records{cut}: {report.failed} failed (a harvest would not store them), "
                  f"{report.warned} with warnings")
            print_groups(f"Record outcomes of {report.source}", report.groups)
        if args.csv:
            print(f"wrote {written} rows to {args.csv}", file=sys.stderr)
    if report.rows_total > len(report.rows) and (args.csv or args.json):
        print(f"kept the first {len(report.rows)} of {report.rows_total} rows (--max-rows); the counts are of "
              "all of them", file=sys.stderr)
    return 1 if report.failed else 0


# -- the parser ---------------------------------------------------------------------------------------
def register(subparsers) -> None:
    """Add report and validate to the ``harvester`` subparsers."""
    p = subparsers.add_parser("report", help="a run's record outcomes (errors and warnings) grouped by reason")
    p.add_argument("run_id", nargs="?", type=int, help="the run's id (harvester runs lists them)")
    p.add_argument("-p", "--portal", help="with --last: the portal's name in portals.yaml")
    p.add_argument("--last", action="store_true", help="the portal's newest run")
    p.add_argument("--severity", choices=["error", "warning"], help="only errors, or only warnings")
    p.add_argument("--csv", metavar="FILE", help="write every row as CSV to FILE ('-': standard output)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_report)

    p = subparsers.add_parser("validate", help="check a catalogue (a URL or a file) as a harvest would, "
                                               "storing nothing; exit 1 when a record has an error")
    p.add_argument("target", metavar="URL_OR_FILE", help="a catalogue's URL (a CKAN portal, a data.json, an RDF "
                                                         "catalogue) or a local file")
    p.add_argument("--type", choices=KINDS, help="the kind of catalogue (default: guessed from the name and "
                                                 "the content)")
    p.add_argument("--pages", type=options.positive_int, default=3,
                   help="a CKAN portal: how many pages of package_search to read (default 3)")
    p.add_argument("--csv", metavar="FILE", help="write every row as CSV to FILE ('-': standard output)")
    p.add_argument("--max-rows", type=options.positive_int,
                   help="how many rows to keep, the first ones (default 10000, pipeline/validate.py MAX_ROWS; "
                        "the counts are of every row)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)
