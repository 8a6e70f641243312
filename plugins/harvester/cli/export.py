"""`harvester export datasets | changes`: the datasets or their changes as Parquet, CSV or JSON Lines,
with a manifest.json, for pandas, DuckDB, Polars, spreadsheets (docs/export.md).

``register(subparsers)`` adds the commands. The files go to ``--output DIR`` (created if need be;
default: a new ``export-<what>-<UTC time>`` in the current directory; a symbolic link given as DIR is
followed, nothing inside it is); an earlier export's files there are never replaced or removed
without ``--force``. Prints a summary, or with ``--json`` the manifest.
"""
from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

from harvester.cli import options, output
from harvester.cli.output import print_json


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable


def _directory(args) -> Path:
    if args.output:
        return Path(args.output)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path.cwd() / f"export-{args.export_what}-{stamp}"


def cmd_export(args) -> int:
    from harvester.pipeline import export_files
    from harvester.store import db

    if args.format is None:  # typed columns for a directory; a pipe (| head, | grep) reads text
        args.format = "csv" if args.output == "-" else "parquet"
    if args.output == "-":
        if args.format == "parquet":
            return output.error("Parquet is not written to standard output: give --output a directory")
        with db.open_cli() as conn:
            url = options.find_portal_url(conn, args.portal)
            rows = export_files.to_stdout(conn, args.export_what, args.format, portal_url=url, since=args.since,
                                          include_removed=getattr(args, "include_removed", False),
                                          raw=getattr(args, "raw", False))
        print(f"exported {rows} {args.export_what} to standard output", file=sys.stderr)
        return 0
    directory = _directory(args)
    if directory.exists() and not directory.is_dir():
        return output.error(f"--output {directory} is a file, not a directory")
    created = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a symbolic link to nothing
        return output.error(f"--output {directory} is a symbolic link to a directory that does not exist")
    try:
        with db.open_cli() as conn:
            url = options.find_portal_url(conn, args.portal)  # unknown: the directory made above goes again
            manifest = export_files.export(
                conn, directory, args.export_what, args.format, portal_name=args.portal, portal_url=url,
                since=args.since, include_removed=getattr(args, "include_removed", False),
                raw=getattr(args, "raw", False), force=args.force)
    except export_files.ExportRefused as exc:
        if created and not any(directory.iterdir()):
            directory.rmdir()
        return output.error(str(exc))
    except BaseException:
        if created and not any(directory.iterdir()):
            directory.rmdir()  # a failed export leaves no empty directory behind
        raise
    if args.json:
        print_json(manifest)
        return 0
    for item in manifest["files"]:
        print(f"exported {item['rows']} {manifest['what']} to {directory / item['path']} ({_size(item['bytes'])})")
    print(f"manifest: {directory / export_files.MANIFEST}")
    return 0


def _common(p, since: str) -> None:
    from harvester.pipeline.export_files import FORMATS

    p.add_argument("--format", choices=FORMATS,
                   help="default: parquet into a directory, csv on standard output (-o -)")
    p.add_argument("-p", "--portal",
                   help="only this portal (its name in portals.yaml, or as its runs recorded it; default: every portal)")
    p.add_argument("--since", type=options.date_from, metavar="T",
                   help=f"only {since} at or after T: a date, or a date and time (UTC unless given)")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="the directory to write to (default: a new export-<what>-<UTC time> here); '-': "
                        "CSV or JSON Lines on standard output, without a manifest")
    p.add_argument("--force", action="store_true",
                   help="replace an earlier export in DIR (its manifest and data files, any format)")
    p.add_argument("--json", action="store_true", help="print the manifest instead of a summary")
    p.set_defaults(func=cmd_export)


def register(subparsers) -> None:
    """Add ``export datasets`` and ``export changes`` to the ``harvester`` subparsers."""
    p = subparsers.add_parser("export", help="datasets or changes as Parquet, CSV or JSON Lines, with a manifest")
    what = p.add_subparsers(dest="export_what", required=True)

    e = what.add_parser("datasets", help="the datasets (live ones unless --include-removed), by id")
    _common(e, "datasets updated or removed")
    e.add_argument("--include-removed", action="store_true", help="also datasets gone from their portal")
    e.add_argument("--raw", action="store_true", help="add a raw column: the record as fetched, as JSON text")

    e = what.add_parser("changes", help="detected changes, oldest first")
    _common(e, "changes detected")
