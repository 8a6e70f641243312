"""The `harvester` command: the database, portals, runs and datasets, without a scheduler.

Database: HARVESTER_DATABASE_URL, else the Airflow connection harvester_db
(AIRFLOW_CONN_HARVESTER_DB), else an embedded PostgreSQL that holds data: HARVESTER_HOME's,
else .harvester/'s, else the demo's (.harvester/demo/db), started if stopped and named on stderr.
No new empty one is made but by `harvester db start`; finding none is an error saying where it
looked. Portals (-p NAME): by their name in portals.yaml, else as their runs recorded it.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Sequence

def build_parser() -> argparse.ArgumentParser:
    from harvester.cli import datasets, db, demo, duplicates, embeddings, export, harvest, history, portals, report

    parser = argparse.ArgumentParser(prog="harvester", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    # one module per command family, in the order `harvester --help` lists their commands
    for family in (db, portals, harvest, datasets, duplicates, embeddings, history, export, report, demo):
        family.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # The CLI may read Airflow connections (gemini_default); importing Airflow must not take over
    # this process's logging (it would print log lines into --json output on stdout).
    if "airflow" not in sys.modules:
        os.environ.setdefault("_AIRFLOW__AS_LIBRARY", "1")
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from harvester.cli.output import error
    from harvester.config.portals import PortalConfigError
    from harvester.embeddings import EmbeddingError
    from harvester.sources.base import SourceError
    from harvester.store.db import DatabaseConfigError, DatabaseLookupError, LockWaitTimeout
    from harvester.store.embedded.server import EmbeddedServerError
    from harvester.store.migrations import MigrationError
    from harvester.store.runs import NotResumable, RunInProgress
    from harvester.store.vector_check import VectorExtensionError

    try:
        return args.func(args) or 0
    except (PortalConfigError, SourceError, EmbeddingError, EmbeddedServerError, VectorExtensionError,
            RunInProgress, NotResumable, DatabaseConfigError, DatabaseLookupError, MigrationError,
            LockWaitTimeout, LookupError) as exc:
        return error(str(exc))
    except BrokenPipeError:
        # The reader of the output went away (`harvester export changes --format csv -o - | head -3`):
        # stop quietly with a Unix tool's status when SIGPIPE ends it, 128 + 13. Python would print a
        # traceback, and another when it flushes stdout at exit: stdout goes to /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
