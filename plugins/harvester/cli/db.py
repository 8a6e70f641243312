"""`harvester db start | stop | url | status | check | migrate`: the embedded server and the schema.

``start`` is the one command that makes a new embedded server (in HARVESTER_HOME, default
`.harvester/`); the others act on the one the CLI uses (store/db.py cli_database_url)."""
from __future__ import annotations

import argparse


def cmd_db(args) -> int:
    from harvester.store import db
    from harvester.store.embedded.server import EmbeddedServer, cli_homes, embedded

    homes = cli_homes()
    # start makes (or starts) the default home's server, the one explicit way to a new one; the other
    # actions act on the server the CLI uses: the first holding data (HARVESTER_HOME, .harvester/, the demo's)
    server = embedded() if args.action == "start" else (db.cli_embedded_server() or embedded())
    if args.action == "start":
        from harvester.store.vector_check import ensure_vector_works

        url = server.start()
        print(url)
        with db.connect_url(url) as conn:
            conn.autocommit = True
            # a pgvector this CPU cannot run: say so now (main prints it), not at the first harvest
            ensure_vector_works(conn, server.logfile)
    elif args.action == "stop":
        stopped = [home for home in homes if EmbeddedServer(home).is_running() and EmbeddedServer(home).stop()]
        if len(homes) == 1:
            print("stopped" if stopped else "not running")
        else:
            print("\n".join(f"stopped the embedded PostgreSQL in {home}" for home in stopped) or "not running")
    elif args.action == "url":
        url = db.cli_database_url() if args.resolve else server.url()
        from harvester.config.secrets import redact_url

        print(redact_url(url) if args.redact else url)
    elif args.action == "status":
        shown = [EmbeddedServer(home) for home in homes if EmbeddedServer(home).exists()] or [server]
        for each in shown:
            print(f"embedded server in {each.home}: "
                  f"{'running at ' + each.url() if each.is_running() else 'not running'}")
    elif args.action == "check":
        from harvester.store import migrations

        with db.connect_url(db.cli_database_url()) as conn:
            conn.autocommit = True
            facts = migrations.server_facts(conn)
            reason = migrations.unsupported(facts)
            if reason:
                raise migrations.UnsupportedServer(reason)
            pending = migrations.pending(conn)
        installed = (f"{facts.vector_installed} installed" if facts.vector_installed else
                     "not installed yet (the first migration creates it, if the role may)")
        print(f"PostgreSQL {facts.version}, pgvector {facts.vector_available} on the server, {installed} in database "
              f"\"{facts.database}\": supported ({migrations.SUPPORTED})")
        print(f"pending migrations: {', '.join(pending)}" if pending else "schema is up to date")
    elif args.action == "migrate":
        from harvester.store.migrations import migrate

        conn = db.connect_url(db.cli_database_url())
        conn.autocommit = True
        with conn:
            applied = migrate(conn)
        print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return 0


def register(subparsers) -> None:
    """Add db to the ``harvester`` subparsers: one subcommand an action, each with its own --help."""
    top = subparsers.add_parser("db", help="the database: embedded server and migrations")
    # url's options may still come before the action (`harvester db --resolve url`, as the one
    # parser of old took them): the parent keeps them, hidden; url's own never overwrite them.
    top.add_argument("--resolve", action="store_true", help=argparse.SUPPRESS)
    top.add_argument("--redact", action="store_true", help=argparse.SUPPRESS)
    actions = top.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("start", "start the embedded server (checking that pgvector runs on this CPU); prints its URL"),
                       ("stop", "stop the embedded server"),
                       ("status", "whether the embedded server runs, and where"),
                       ("check", "the server's PostgreSQL and pgvector, and the migrations pending (changes nothing)"),
                       ("migrate", "apply the pending migrations (sql/NNN_*.sql)")):
        actions.add_parser(name, help=text).set_defaults(func=cmd_db)
    p = actions.add_parser("url", help="the embedded server's URL", argument_default=argparse.SUPPRESS)
    p.add_argument("--resolve", action="store_true", help="the database the CLI would use (configured or embedded)")
    p.add_argument("--redact", action="store_true", help="hide the password")
    p.set_defaults(func=cmd_db)
