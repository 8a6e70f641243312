"""MkDocs hook: the reference pages, generated at build time from their sources of truth.

A page asks for a generated part with a marker line of its own:

    <!-- generated: settings -->   harvester.config.settings.markdown_table()
    <!-- generated: cli -->        the --help of `harvester` and of every subcommand (cli/main.py's build_parser())
    <!-- generated: api -->        method, path and summary of every operation of the UI's API (ui/app.py's OpenAPI)
    <!-- generated: codes -->      the reason codes of per-record outcomes (domain/outcomes.py's reference_table())
    <!-- generated: kinds -->      the kinds of portal: config/portals.py's PORTAL_TYPES, each with its module in
                                   sources/ and what sources/__init__.py's CAPABILITIES say it can do
    <!-- generated: shipped -->    the portals dags/portals.yaml ships, read by config/portals.py's loader
    <!-- generated: compose -->    the commands of docker-compose.yaml's own "Usage:" header

Each part is produced by a subprocess of the same Python with plugins/ on its path, so it works on a
fresh clone (no database, no network, no Airflow set-up) and a `mkdocs serve` rebuild sees edited
code. A part that cannot be produced stops the build with a message saying which part, from what,
and why; nothing is ever left out or made up.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generated: (?P<part>[a-z]+) -->[ \t]*$", re.MULTILINE)

SETTINGS = """
from harvester.config.settings import markdown_table
print(markdown_table())
"""

CLI = """
import argparse, json
from harvester.cli.main import build_parser

def walk(parser, out):
    out.append({"prog": parser.prog, "help": parser.format_help()})
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for sub in action.choices.values():
                if id(sub) not in seen:  # aliases name the same parser
                    seen.add(id(sub))
                    walk(sub, out)
    return out

print(json.dumps(walk(build_parser(), [])))
"""

CODES = """
from harvester.domain.outcomes import reference_table
print(reference_table())
"""

KINDS = """
import json
from harvester.config.portals import AUTH_HEADERS, PORTAL_TYPES
from harvester.sources import CAPABILITIES
out = []
for kind in PORTAL_TYPES:
    can = CAPABILITIES[kind]
    out.append({"type": kind, "incremental": can.incremental, "conditional": can.conditional,
                "reconcile": can.reconcile, "count": can.count.kind, "cap": getattr(can.count, "cap", None),
                "header": AUTH_HEADERS.get(kind)})
print(json.dumps(out))
"""

SHIPPED = """
import json
from harvester.config.portals import DEFAULT_PORTALS_FILE, load_portals
print(json.dumps([{"name": p.name, "type": p.type, "url": p.url, "schedule": p.schedule, "enabled": p.enabled,
                   "description": p.description} for p in load_portals(DEFAULT_PORTALS_FILE)]))
"""

API = """
import json
from harvester.ui.app import PREFIX, app
print(json.dumps({"prefix": PREFIX, "openapi": app.openapi()}))
"""


def _run(part: str, code: str, source: str) -> str:
    """What ``code`` prints, run by this Python with plugins/ first on its path."""
    with tempfile.TemporaryDirectory(prefix="harvester-docs-") as home:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "plugins"), os.environ.get("PYTHONPATH")])),
            "COLUMNS": "100",  # argparse wraps --help to the terminal's width: the same on every machine
            # Nothing here reads Airflow's configuration; if something did, it stays out of ~/airflow.
            "AIRFLOW_HOME": home,
            "_AIRFLOW__AS_LIBRARY": "1",
        }
        result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=120)
    if result.returncode != 0:
        raise PluginError(
            f"docs/hooks.py: the generated part '{part}' comes from {source}, which failed "
            f"(exit status {result.returncode}); its error output ends:\n{result.stderr.strip()[-2000:]}")
    return result.stdout


def settings() -> str:
    try:
        return _run("settings", SETTINGS, "harvester.config.settings.markdown_table()").strip() + "\n"
    except PluginError as exc:
        if "No module named 'harvester.config.settings'" in str(exc) or "cannot import name 'markdown_table'" in str(exc):
            raise PluginError(
                "docs/hooks.py: docs/reference/settings.md is generated from "
                "harvester.config.settings.markdown_table() (plugins/harvester/config/settings.py, the registry of "
                "every environment variable), which does not exist in this checkout. Add that module with a "
                "markdown_table() returning the settings table as Markdown, or take the page out of mkdocs.yml's "
                "nav and remove it.") from None
        raise


def _fence(text: str) -> str:
    return "```text\n" + text.rstrip() + "\n```\n"


def cli() -> str:
    commands = json.loads(_run("cli", CLI, "build_parser() in harvester.cli.main (plugins/harvester/cli/main.py)"))
    out = []
    for command in commands:
        depth = command["prog"].count(" ")  # harvester: 0, harvester db: 1, harvester export changes: 2
        out.append(f"{'#' * min(2 + depth, 4)} `{command['prog']}`\n\n{_fence(command['help'])}")
    return "\n".join(out)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def api() -> str:
    data = json.loads(_run("api", API, "the OpenAPI description of harvester.ui.app (plugins/harvester/ui/app.py)"))
    rows = ["| method | path | summary | parameters |", "|---|---|---|---|"]
    for path, operations in data["openapi"]["paths"].items():
        for method, operation in operations.items():
            parameters = ", ".join(
                f"`{p['name']}`" for p in operation.get("parameters", []) if p.get("in") == "query")
            if operation.get("requestBody"):
                parameters = ", ".join(filter(None, [parameters, "JSON body"]))
            rows.append(f"| `{method.upper()}` | `{data['prefix']}{path}` | {_cell(operation.get('summary') or '')} "
                        f"| {parameters} |")
    if len(rows) == 2:
        raise PluginError("docs/hooks.py: the OpenAPI description of harvester.ui.app has no operations")
    return "\n".join(rows) + "\n"


def codes() -> str:
    return _run("codes", CODES, "harvester.domain.outcomes.reference_table() (plugins/harvester/domain/outcomes.py)"
                ).strip() + "\n"


def source_module(kind: str) -> Path:
    """The module of a kind of portal: ``type: arcgis-hub`` is plugins/harvester/sources/arcgis_hub.py."""
    return ROOT / "plugins" / "harvester" / "sources" / (kind.replace("-", "_") + ".py")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def kinds() -> str:
    data = json.loads(_run("kinds", KINDS, "PORTAL_TYPES of harvester.config.portals and CAPABILITIES of "
                                          "harvester.sources (plugins/harvester/sources/__init__.py)"))
    rows = ["| `type:` | module | incremental | conditional (304) | reconcile | its count | token header "
            "(`conn_id`) |", "|---|---|---|---|---|---|---|"]
    for kind in data:
        module = source_module(kind["type"])
        if not module.is_file():
            raise PluginError(f"docs/hooks.py: the kind of portal '{kind['type']}' (config/portals.py PORTAL_TYPES) "
                              f"has no module {module.relative_to(ROOT)}; a kind's module is named after its type")
        count = {"exact": "exact", "absent": "none"}.get(kind["count"]) or f"{kind['count']} at {kind['cap']:,}"
        header = kind["header"]
        header = f"`{header[0]}: {header[1]}`".replace("{token}", "<token>") if header else "named by `auth_header`"
        rows.append(f"| `{kind['type']}` | `sources/{module.name}` | {_yes(kind['incremental'])} "
                    f"| {_yes(kind['conditional'])} | {_yes(kind['reconcile'])} | {count} | {header} |")
    return "\n".join(rows) + "\n"


def shipped() -> str:
    data = json.loads(_run("shipped", SHIPPED, "dags/portals.yaml, read by harvester.config.portals.load_portals()"))
    rows = ["| name | type | url | schedule | enabled |", "|---|---|---|---|---|"]
    for p in data:
        rows.append(f"| `{p['name']}` | `{p['type']}` | <{p['url']}> | `{p['schedule']}` "
                    f"| {'**yes**' if p['enabled'] else 'no'} |")
    enabled = [p["name"] for p in data if p["enabled"]]
    if not enabled:
        note = f"All {len(data)} are disabled (`enabled: false`): a fresh install harvests nothing until you enable one."
    else:
        note = (f"{len(enabled)} of {len(data)} are enabled ({', '.join(f'`{n}`' for n in enabled)}); "
                f"the others are disabled.")
    return note + "\n\n" + "\n".join(rows) + "\n"


USAGE = re.compile(r"^# Usage:\n((?:#   .*\n)+)", re.MULTILINE)


def compose() -> str:
    path = ROOT / "docker-compose.yaml"
    found = USAGE.search(path.read_text(encoding="utf-8"))
    if not found:
        raise PluginError("docs/hooks.py: the generated part 'compose' is docker-compose.yaml's header lines under "
                          "'# Usage:' (each '#   <command>'), and the file has none")
    lines = [line[len("#   "):] for line in found.group(1).splitlines()]
    commands = [line for line in lines if not line.startswith(("UI", " "))]
    notes = [line for line in lines if line.startswith("UI")]
    return "```bash\n" + "\n".join(commands) + "\n```\n" + "".join(f"\n{n}\n" for n in notes)


PARTS = {"settings": settings, "cli": cli, "api": api, "codes": codes, "kinds": kinds, "shipped": shipped,
         "compose": compose}


def on_page_markdown(markdown: str, page, config, files) -> str:
    def generate(match: re.Match) -> str:
        part = match.group("part")
        if part not in PARTS:
            raise PluginError(f"docs/hooks.py: {page.file.src_uri} asks for the generated part '{part}'; "
                              f"known parts: {', '.join(PARTS)}")
        return PARTS[part]()

    return MARKER.sub(generate, markdown)
