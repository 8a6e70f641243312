"""The docs' lists checked against the code they describe (issue 38, finding 6).

Every list in README.md, docs/*.md and the header of dags/portals.yaml that names kinds of portal,
CLI commands, settings, modules or pages is either generated from the code when the site is built
(docs/hooks.py: the reference pages, the table of kinds, the shipped portals, the compose steps) or
checked here against the code as it is at test time: a kind of portal, a command, an option, a
module, a page or a portals.yaml key added or removed in the code fails a test here naming the doc
and what it lacks or names in excess. Fast: no database, no network, no build of the site (`make
test` builds it with --strict before the suite).
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from pathlib import Path

import yaml

from harvester.cli.main import build_parser
from harvester.config import portals as portals_config
from harvester.config.portals import PORTAL_TYPES, load_portals
from harvester.config.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "plugins" / "harvester"

# How the prose of the README, the home page and the site's description calls each kind of portal
# (its `type:` is config/portals.py's). A kind added to PORTAL_TYPES fails the test below until it
# has its name here and in those places.
KIND_NAMES = {
    "ckan": "CKAN",
    "dcat-json": "data.json",
    "dcat-rdf": "DCAT-AP",
    "socrata": "Socrata",
    "opendatasoft": "OpenDataSoft",
    "arcgis-hub": "ArcGIS Hub",
    "csw": "CSW",
    "iso-waf": "Web Accessible Folder",
    "udata": "udata",
    "dcat-sparql": "SPARQL",
    "stac": "STAC",
    "sdmx": "SDMX",
    "oai-pmh": "OAI-PMH",
}

# Code spans that start with "harvester " but are no command line.
NOT_COMMANDS = {
    "harvester cli pid=N": "the CLI's application_name in pg_stat_activity (operations.md)",
    "harvester embeddings prune --portal canada": "the example of an option an action refuses (embeddings.md)",
}


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def first_paragraph(text: str) -> str:
    """The first paragraph after the page's title."""
    body = text.split("\n# ", 1)[-1] if not text.startswith("# ") else text
    paragraphs = [p for p in re.split(r"\n\s*\n", body) if p.strip() and not p.lstrip().startswith("#")]
    return " ".join(paragraphs[0].split())


def mkdocs_config() -> dict:
    return yaml.safe_load(read(ROOT / "mkdocs.yml"))


# -- kinds of portal --------------------------------------------------------------------------------
def portals_yaml_header() -> str:
    text = read(ROOT / "dags" / "portals.yaml")
    return text[:text.index("\nportals:")]


def header_keys(header: str) -> dict[str, str]:
    """The keys the header of dags/portals.yaml describes (``#   key   what it is``), with their text."""
    keys, current = {}, None
    for line in header.splitlines():
        found = re.match(r"^#   ([a-z_]+)(?:\s+(.*))?$", line)
        if found:
            current = found.group(1)
            keys[current] = found.group(2) or ""
        elif current and re.match(r"^#\s{4,}\S", line):
            keys[current] += " " + line.lstrip("# ").strip()
        else:
            current = None
    return keys


def type_ids(text: str) -> set[str]:
    return {kind for kind in PORTAL_TYPES if re.search(rf"(?<![\w-]){re.escape(kind)}(?![\w-])", text)}


def every_key_table() -> dict[str, str]:
    text = read(DOCS / "configuration.md")
    section = text[text.index("### Every key"):]
    section = section[:section.index("\n#", 1)]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_]+)` \|(.*)$", section, re.MULTILINE)}


def readme_portal_example() -> str:
    text = read(ROOT / "README.md")
    section = text[text.index("## A portal"):]
    start = section.index("```yaml")
    return section[start:section.index("```\n", start + 7)]


def test_every_list_of_the_kinds_of_portal_names_each_kind():
    problems = []
    if set(KIND_NAMES) != set(PORTAL_TYPES):
        problems.append(f"KIND_NAMES in tests/test_docs.py (how the prose calls each kind) lacks "
                        f"{sorted(set(PORTAL_TYPES) - set(KIND_NAMES))} and names kinds config/portals.py has not: "
                        f"{sorted(set(KIND_NAMES) - set(PORTAL_TYPES))}")
    prose = {"README.md's introduction": first_paragraph(read(ROOT / "README.md")),
             "docs/index.md's introduction": first_paragraph(read(DOCS / "index.md")),
             "mkdocs.yml's site_description": mkdocs_config()["site_description"]}
    for where, text in prose.items():
        missing = [f"{kind} ({KIND_NAMES[kind]})" for kind in PORTAL_TYPES if KIND_NAMES.get(kind, kind) not in text]
        if missing:
            problems.append(f"{where} does not name the kinds {', '.join(missing)}")
    by_type = {"dags/portals.yaml's header on `type`": header_keys(portals_yaml_header()).get("type", ""),
               "docs/configuration.md's `type` row": every_key_table().get("type", ""),
               "README.md's portals.yaml example (## A portal)": readme_portal_example()}
    for where, text in by_type.items():
        missing = [kind for kind in PORTAL_TYPES if kind not in type_ids(text)]
        if missing:
            problems.append(f"{where} does not name the kinds {', '.join(missing)}")
    for page in ("configuration.md", "add-a-portal-kind.md"):
        if not (DOCS / page).is_file() or "<!-- generated: kinds -->" not in read(DOCS / page):
            problems.append(f"docs/{page} does not show the table of kinds docs/hooks.py generates "
                            f"(<!-- generated: kinds -->)")
    assert not problems, "the kinds of portal are config/portals.py's PORTAL_TYPES " \
                         f"({', '.join(PORTAL_TYPES)}):\n" + "\n".join(problems)


def test_every_list_of_portals_yaml_keys_names_each_key():
    keys = set(portals_config._KEYS)
    problems = []
    for where, listed in (("dags/portals.yaml's header", set(header_keys(portals_yaml_header()))),
                          ("docs/configuration.md's 'Every key' table", set(every_key_table()))):
        if listed != keys:
            problems.append(f"{where}: keys config/portals.py takes that it lacks: {sorted(keys - listed)}; "
                            f"keys it names that are not taken: {sorted(listed - keys)}")
    assert not problems, "\n".join(problems)


# -- the package's modules in architecture.md -------------------------------------------------------
def architecture_rows() -> dict[str, str]:
    text = read(DOCS / "architecture.md")
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_]+)/` \|(.*)$", text, re.MULTILINE)}


def rooms() -> list[Path]:
    return sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file())


def test_architecture_names_every_room_and_module_and_no_other():
    rows = architecture_rows()
    names = {room.name for room in rooms()}
    problems = []
    if set(rows) != names:
        problems.append(f"rooms of plugins/harvester without a row: {sorted(names - set(rows))}; rows of rooms that "
                        f"do not exist: {sorted(set(rows) - names)}")
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    if loose:
        problems.append(f"modules at the package's root, in no room: {loose}")
    for room in sorted(names & set(rows)):
        modules = {p.name for p in (PACKAGE / room).rglob("*.py") if "__pycache__" not in p.parts}
        named = set(re.findall(r"`([a-z0-9_]+\.py)`", rows[room]))
        missing, extra = sorted(modules - named - {"__init__.py"}), sorted(named - modules)
        if missing or extra:
            problems.append(f"the row of `{room}/`: modules of plugins/harvester/{room} it does not name: {missing}; "
                            f"modules it names that do not exist there: {extra}")
    assert not problems, "docs/architecture.md's rooms table:\n" + "\n".join(problems)


# -- CLI commands -----------------------------------------------------------------------------------
def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def positional_choices(parser: argparse.ArgumentParser) -> list:
    return [action.choices for action in parser._actions
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction)]


def mentions() -> list[tuple[str, int, str]]:
    """Every command line of `harvester` the docs show: (file, line, text), from code spans that start
    with it (a span may run over a line break, so a paragraph is read whole and the line is where the
    paragraph starts) and from the lines of code blocks that start with it (after `$ ` or
    `.venv/bin/`)."""
    found = []
    for path in doc_files():
        where = path.relative_to(ROOT).as_posix()
        in_block, paragraph, start = False, [], 0

        def spans():
            text = " ".join(line.strip() for line in paragraph)
            for span in re.findall(r"`([^`]+)`", text):
                m = re.match(r"^(?:\$ |\.venv/bin/|/entrypoint (?:bash -c \")?)?(harvester [a-z][^\"]*)", span)
                if m:
                    found.append((where, start, m.group(1)))

        for number, line in enumerate(read(path).splitlines(), 1):
            if line.lstrip().startswith("```") or (not line.strip() and not in_block):
                spans()
                paragraph = []
                if line.lstrip().startswith("```"):
                    in_block = not in_block
                continue
            if in_block:
                m = re.match(r"^\s*(?:\$ )?(?:\.venv/bin/)?(harvester [a-z].*)$", line)
                if m:
                    found.append((where, number, m.group(1)))
                continue
            if not paragraph:
                start = number
            paragraph.append(line)
        spans()
    return found


def problems_of(command: str) -> list[str]:
    """What is wrong with one command line as the docs show it: a command, a subcommand, a choice or an
    option the parser does not have, or a required option left out. `[...]` marks optional parts,
    `a|b` alternatives (each checked), `<...>`, `...` and upper-case words values."""
    if command in NOT_COMMANDS:
        return []
    text = command.split(" #", 1)[0].split(" && ", 1)[0].replace("\\|", "|")
    text = re.sub(r"\s\|\s*(jq|head|less|tail|grep)\b.*$", "", text)
    text = text.replace("[", " ").replace("]", " ").replace("...", " ")
    text = re.sub(r"\s*\|\s*", "|", text)  # `start | stop`: alternatives
    text = re.sub(r"<[^>]*>", "VALUE", text)
    try:
        tokens = shlex.split(text)[1:]
    except ValueError:
        tokens = text.split()[1:]
    return walk(build_parser(), "harvester", tokens, command)


def take_options(parser, prog: str, rest: list[str], command: str, given: set, stop_at_word: bool) -> list[str]:
    """Consume the options at the head of ``rest`` (all of them, or up to the first word when
    ``stop_at_word``), each with its value; the words met on the way are returned in ``given``'s
    stead through ``rest``. Problems: options ``parser`` does not have."""
    flags, problems, words = options(parser), [], []
    while rest:
        if not rest[0].startswith("-") or rest[0] == "-":
            if stop_at_word:
                break
            words.append(rest.pop(0))
            continue
        token = rest.pop(0)
        for flag in token.split("|"):
            name = flag.split("=", 1)[0]
            if name not in flags:
                problems.append(f"`{command}`: `{prog}` has no option {name}; its options are {', '.join(flags)}")
                continue
            given.add(flags[name].dest)
            if "=" not in flag and flags[name].nargs != 0 and rest and not rest[0].startswith("-"):
                rest.pop(0)
    rest[:0] = words
    return problems


def walk(parser, prog: str, tokens: list[str], command: str, given: set | None = None) -> list[str]:
    given = set() if given is None else given
    rest = list(tokens)
    subs = subcommands(parser)
    if subs:
        # options the family takes may come before its command (`harvester embeddings --model M reindex`)
        problems = take_options(parser, prog, rest, command, given, stop_at_word=True)
        if not rest:
            return problems  # a family named alone (`harvester duplicates`)
        for word in rest[0].split("|"):
            if word not in subs:
                problems.append(f"`{command}`: `{prog}` has no command `{word}`; its commands are {', '.join(subs)}")
            else:
                problems += walk(subs[word], f"{prog} {word}", rest[1:], command, set(given))
        return problems
    problems = take_options(parser, prog, rest, command, given, stop_at_word=False)
    positionals = rest
    choices = positional_choices(parser)
    if positionals and choices and choices[0]:
        for word in positionals[0].split("|"):
            if word not in choices[0]:
                problems.append(f"`{command}`: `{prog}` takes one of {', '.join(choices[0])}, not `{word}`")
    for action in parser._actions:
        if action.option_strings and action.required and action.dest not in given:
            problems.append(f"`{command}`: `{prog}` requires {' or '.join(action.option_strings)}, which it does not show")
    return problems


def test_every_command_and_setting_the_docs_name_is_one_the_code_has():
    """The CLI reference and the settings reference are generated (docs/hooks.py); every other mention
    of a command line or a setting in the docs is checked here against build_parser() and the
    settings registry."""
    assert "<!-- generated: cli -->" in read(DOCS / "reference" / "cli.md")
    assert "<!-- generated: settings -->" in read(DOCS / "reference" / "settings.md")
    # the check itself can fail, and reads something
    assert problems_of("harvester changes") == [
        "`harvester changes`: `harvester changes` requires -p or --portal, which it does not show"]
    assert problems_of("harvester changes -p canada --json") == []
    assert "`nap`" in " ".join(problems_of("harvester db start | stop | nap"))
    assert "has no command `nope`" in problems_of("harvester nope")[0]
    assert "has no option --nope" in problems_of("harvester runs --nope")[0]
    assert problems_of("harvester export changes --format csv -o - \\| jq ...") == []
    assert problems_of("harvester embeddings --model M reindex") == []
    assert len(mentions()) > 50
    problems = [f"{where}:{line}: {problem}" for where, line, command in mentions() for problem in problems_of(command)]
    assert not problems + unknown_settings(), "\n".join(problems + unknown_settings())


# -- settings ---------------------------------------------------------------------------------------
def read_outside_the_package(name: str) -> bool:
    """A variable some other part of the project reads: docker-compose.yaml's ${...}, the tests, the
    benches, the docs' own scripts."""
    if re.search(rf"\$\{{{name}\b", read(ROOT / "docker-compose.yaml")):
        return True
    sources = [*ROOT.joinpath("tests").rglob("*.py"), *DOCS.glob("*.py"), *ROOT.joinpath("bench").rglob("*.py")]
    return any(name in read(p) for p in sources if p.resolve() != Path(__file__).resolve())


def unknown_settings() -> list[str]:
    """The HARVESTER_* names the docs give that nothing reads."""
    registered = {name for name, s in SETTINGS.items() if not getattr(s, "pattern", None)}
    unknown = []
    for path in [*doc_files(), ROOT / "dags" / "portals.yaml"]:
        for name in sorted(set(re.findall(r"\bHARVESTER_[A-Z0-9_]*[A-Z0-9]\b", read(path)))):
            if name not in registered and not read_outside_the_package(name):
                unknown.append(f"{path.relative_to(ROOT).as_posix()}: {name} is no setting (not in the settings "
                               f"registry, plugins/harvester/config/settings.py, nor read by docker-compose.yaml, the "
                               f"tests or the benches)")
    return unknown


# -- pages ------------------------------------------------------------------------------------------
def nav_pages() -> list[str]:
    pages = []

    def visit(items):
        for item in items:
            for value in item.values():
                if isinstance(value, list):
                    visit(value)
                else:
                    pages.append(value)
    visit(mkdocs_config()["nav"])
    return pages


def linked_pages(text: str, prefix: str = "") -> set[str]:
    return {m.group(1)[len(prefix):] for m in re.finditer(r"\]\(((?:docs/)?[a-z0-9/-]+\.md)(?:#[^)]*)?\)", text)
            if m.group(1).startswith(prefix)}


def ui_pages() -> list[str]:
    """The paths of the Harvester UI's pages: ui/app.py's routes that serve the page (`_serve_page`)."""
    import ast

    tree = ast.parse(read(PACKAGE / "ui" / "app.py"))
    pages = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "_serve_page" in ast.unparse(node):
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "app.get":
                    pages.append(decorator.args[0].value)
    return pages


def test_the_lists_of_pages_name_every_page_of_the_nav():
    """The docs' pages (mkdocs.yml's nav, the home page's and the README's lists) and the UI's pages
    (ui/app.py's routes, named in docs/ui.md)."""
    problems = []
    from harvester.ui.app import PREFIX

    ui = read(DOCS / "ui.md")
    assert len(ui_pages()) >= 5, ui_pages()
    for path in ui_pages():
        # `/harvester/portals/<name>` names the route /portals/{name}: a {parameter} is any <...>
        pattern = "".join("<[^>]+>" if part.startswith("{") else re.escape(part)
                          for part in re.split(r"(\{[^}]*\})", PREFIX + path))
        if not re.search(f"`{pattern}`", ui):
            example = re.sub(r"\{([^}:]*)[^}]*\}", r"<\1>", PREFIX + path)
            problems.append(f"docs/ui.md does not name the UI page {PREFIX}{path} (ui/app.py), e.g. as `{example}`")
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    nav = set(nav_pages())
    if on_disk != nav:
        problems.append(f"mkdocs.yml's nav: pages in docs/ it leaves out: {sorted(on_disk - nav)}; pages it lists that "
                        f"do not exist: {sorted(nav - on_disk)}")
    reference = {p for p in nav if p.startswith("reference/")}
    for where, start, prefix in (("docs/index.md", "## Where to read on", ""), ("README.md", "## Documentation", "docs/")):
        text = read(ROOT / where)
        section = text[text.index(start):]
        section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
        listed = linked_pages(section, prefix)
        # the reference pages are listed as one entry (any of them), the others each by its own link
        missing = sorted(nav - reference - {"index.md"} - listed) + ([] if listed & reference else ["reference/..."])
        extra = sorted(listed - nav)
        if missing or extra:
            problems.append(f"{where}'s list of pages ({start}): nav pages it does not list: {missing}; pages it "
                            f"lists that are not in the nav: {extra}")
    assert not problems, "\n".join(problems)


# -- operations: compose and the shipped portals ----------------------------------------------------
def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_operations_shows_the_compose_steps_as_the_compose_file_has_them():
    text = read(DOCS / "operations.md")
    assert "<!-- generated: compose -->" in text, (
        "docs/operations.md must show docker-compose.yaml's own usage (<!-- generated: compose -->)")
    steps = load_hooks().compose()
    assert "docker compose up airflow-init && docker compose up -d" in steps, steps
    compose = read(ROOT / "docker-compose.yaml")
    # no other compose command line in the page than the file's own ones
    shown = set(re.findall(r"docker compose up[^`\n]*", text.replace("<!-- generated: compose -->", steps)))
    stray = sorted(line.strip() for line in shown if line.strip() not in compose)
    assert not stray, f"docs/operations.md shows compose commands docker-compose.yaml does not: {stray}"


def test_operations_says_which_shipped_portals_are_enabled():
    text = read(DOCS / "operations.md")
    assert "<!-- generated: shipped -->" in text, (
        "docs/operations.md must list the portals dags/portals.yaml ships, enabled or not (<!-- generated: shipped -->)")
    shipped = load_portals(ROOT / "dags" / "portals.yaml")
    table = load_hooks().shipped()
    for portal in shipped:
        assert f"| `{portal.name}` |" in table
    if not any(p.enabled for p in shipped):
        assert f"All {len(shipped)} are disabled" in table


def test_configuration_does_not_count_the_shipped_portals_by_hand():
    text = read(DOCS / "configuration.md")
    counted = re.findall(r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten|\d+) real [A-Za-z]* ?portals", text)
    assert not counted, f"docs/configuration.md counts the shipped portals by hand ({counted}): link the list instead"


# -- record reports: what Download CSV gives --------------------------------------------------------
def test_reports_says_download_csv_gives_every_row_of_the_filters_shown():
    script = read(PACKAGE / "ui" / "static" / "harvester.js")
    # the run page's link carries the severity tab and the reason code the page is filtered by
    assert 'csv.searchParams.set("severity"' in script and 'csv.searchParams.set("code"' in script
    text = " ".join(read(DOCS / "reports.md").split())
    sentence = text[text.index("**Download CSV**"):]
    sentence = sentence[:sentence.index(". ")]
    assert "all rows" not in sentence and "rows shown" not in sentence, sentence
    for word in ("severity", "reason", "every row"):
        assert word in sentence, f"docs/reports.md on Download CSV: {sentence!r} does not say {word!r}"


# -- the page on adding a kind of portal ------------------------------------------------------------
def test_the_page_on_adding_a_kind_names_only_files_that_exist():
    page = DOCS / "add-a-portal-kind.md"
    assert "add-a-portal-kind.md" in nav_pages(), "docs/add-a-portal-kind.md must be in mkdocs.yml's nav"
    text = read(page)
    paths = set(re.findall(r"`((?:plugins|tests|dags|docs)/[A-Za-z0-9_./-]+\.(?:py|md|yaml|json))`", text))
    assert len(paths) >= 8, paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/add-a-portal-kind.md names files that do not exist: {missing}"
