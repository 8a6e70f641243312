"""The package's shape, read from the source (nothing is imported): no import cycle among the
modules of plugins/harvester/ (an import inside a function counts: that is where cycles hide), the
domain imports no IO library, the runtime rooms never import harvester.testing, the pipeline
imports no concrete source (only harvester.sources and its protocol, harvester.sources.base), the
package root holds rooms and no loose modules, and tests and benches get their helpers from harvester.testing,
never from conftest or another test module. Each rule is also run on a small package built in
tmp_path, so each can be seen to fail."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "plugins" / "harvester"

IO_LIBRARIES = ("airflow", "psycopg", "requests", "httpx", "google")
RUNTIME_ROOMS = ("pipeline", "store", "sources", "embeddings", "domain", "config", "http", "ui")
ROOT_MODULES = ("__init__.py", "http.py")


# -- the walker ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    importer: str  # the importing module, e.g. harvester.pipeline.notify
    target: str    # the imported module, absolute, e.g. harvester.config.portals or requests
    path: Path     # as messages show it: relative to the package's folder
    line: int

    def where(self) -> str:
        return f"{self.path.as_posix()}:{self.line}"


def module_name(path: Path, package_dir: Path) -> str:
    parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(package_dir: Path) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its __init__.py)."""
    return {module_name(path, package_dir): path for path in sorted(package_dir.rglob("*.py"))
            if "__pycache__" not in path.parts}


def imports_in(path: Path, module: str | None = None, known: frozenset[str] | set[str] = frozenset(),
               shown: Path | None = None) -> list[Import]:
    """Every import statement in the file, at any depth (module level, in functions, in classes),
    relative ones resolved against ``module`` (the file's dotted name). ``from X import name`` is
    an import of ``X.name`` when that is one of the ``known`` modules, else of ``X``. ``shown`` is
    the path messages give (default: ``path``)."""
    shown = path if shown is None else shown
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(module or "", alias.name, shown, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = (module or "").split(".")
                anchor = here if is_package else here[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(module or "", sub if sub in known else base, shown, node.lineno))
    return found


def package_imports(package_dir: Path) -> dict[str, list[Import]]:
    modules = modules_of(package_dir)
    known = set(modules)
    return {name: imports_in(path, name, known, path.relative_to(package_dir)) for name, path in modules.items()}


def _internal(target: str, known: set[str]) -> str | None:
    """The package module an import lands in: the target or its longest known prefix."""
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return None


def import_cycles(graph: dict[str, list[Import]]) -> list[tuple[list[Import], list[str]]]:
    """Per strongly connected group of modules (a knot: each reaches every other through imports),
    one shortest cycle through its first module, as the chain of imports, and the group."""
    known = set(graph)
    edges: dict[str, dict[str, Import]] = {name: {} for name in graph}
    for name, imports in graph.items():
        for imp in imports:
            target = _internal(imp.target, known)
            if target is not None:
                edges[name].setdefault(target, imp)

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm (the graph is a few dozen modules deep at most)
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in edges[node]:
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in edges[node]:
                groups.append(sorted(group))

    for name in sorted(edges):
        if name not in index:
            connect(name)

    cycles = []
    for group in sorted(groups):
        start, members = group[0], set(group)
        paths = {start: [start]}  # breadth first: the shortest way back to start
        frontier, cycle = [start], None
        while frontier and cycle is None:
            following = []
            for node in frontier:
                for succ in sorted(edges[node]):
                    if succ == start:
                        cycle = [*paths[node], start]
                        break
                    if succ in members and succ not in paths:
                        paths[succ] = [*paths[node], succ]
                        following.append(succ)
                if cycle:
                    break
            frontier = following
        cycles.append(([edges[a][b] for a, b in zip(cycle, cycle[1:])], group))
    return cycles


def describe_cycle(chain: list[Import], knot: list[str]) -> str:
    names = " -> ".join([imp.importer for imp in chain] + [chain[0].importer])
    text = f"import cycle {names} ({', '.join(imp.where() for imp in chain)})"
    others = [name for name in knot if name not in {imp.importer for imp in chain}]
    return text + (f"; tied into it too: {', '.join(others)}" if others else "")


# -- the rules ------------------------------------------------------------------------------------------
def cycle_problems(package_dir: Path) -> list[str]:
    return [describe_cycle(chain, knot) for chain, knot in import_cycles(package_imports(package_dir))]


def _top(target: str) -> str:
    return target.split(".")[0]


def domain_problems(package_dir: Path) -> list[str]:
    domain = f"{package_dir.name}.domain"
    return [f"{imp.importer} imports {imp.target} ({imp.where()}): the domain is pure, no IO library;"
            f" move the IO to an adapter room (store/, sources/, embeddings/, http.py)"
            for name, imports in sorted(package_imports(package_dir).items())
            if name == domain or name.startswith(domain + ".")
            for imp in imports if _top(imp.target).startswith(IO_LIBRARIES)]


def runtime_testing_problems(package_dir: Path) -> list[str]:
    testing = f"{package_dir.name}.testing"
    runtime = tuple(f"{package_dir.name}.{room}" for room in RUNTIME_ROOMS)
    return [f"{imp.importer} imports {imp.target} ({imp.where()}): runtime code never imports"
            f" {testing}; move what it needs out of testing/"
            for name, imports in sorted(package_imports(package_dir).items())
            if name in runtime or name.startswith(tuple(room + "." for room in runtime))
            for imp in imports if imp.target == testing or imp.target.startswith(testing + ".")]


def pipeline_source_problems(package_dir: Path) -> list[str]:
    """The pipeline works through the source protocol alone (sources/base.py): it may import the
    package harvester.sources (source_for, as_source, CAPABILITIES) and harvester.sources.base, never
    a kind's module (sources/ckan.py, dcat_json.py, ... or any added later)."""
    pipeline, sources = f"{package_dir.name}.pipeline", f"{package_dir.name}.sources"
    allowed = (sources, f"{sources}.base")
    return [f"{imp.importer} imports {imp.target} ({imp.where()}): the pipeline imports no concrete source;"
            f" reach it through {sources} (source_for) and the protocol of {sources}.base"
            for name, imports in sorted(package_imports(package_dir).items())
            if name == pipeline or name.startswith(pipeline + ".")
            for imp in imports
            if imp.target.startswith(sources + ".") and not any(
                imp.target == ok or imp.target.startswith(ok + ".") for ok in allowed[1:])]


def root_problems(package_dir: Path) -> list[str]:
    return [f"{package_dir.name}/{path.name} is a module at the package root: put it in its room"
            f" ({', '.join(RUNTIME_ROOMS)}, cli, testing); the root holds only {', '.join(ROOT_MODULES)}"
            for path in sorted(package_dir.glob("*.py")) if path.name not in ROOT_MODULES]


def _changes_sys_path(node: ast.AST) -> ast.AST | None:
    """What this node puts on sys.path or in a PYTHONPATH (``sys.path.insert(0, x)``,
    ``sys.path[:0] = x``, ``env["PYTHONPATH"] = x``, ``dict(env, PYTHONPATH=x)``,
    ``{"PYTHONPATH": x}``), None when it does neither."""
    def is_sys_path(expr):
        return ast.unparse(expr) == "sys.path" or (isinstance(expr, ast.Subscript) and (
            is_sys_path(expr.value) or ast.unparse(expr.slice) == "'PYTHONPATH'"))

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("insert", "append", "extend") and is_sys_path(node.func.value):
        return ast.Tuple(elts=list(node.args), ctx=ast.Load())
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(is_sys_path(target) for target in targets):
            return node.value
    if isinstance(node, ast.keyword) and node.arg == "PYTHONPATH":
        return node.value
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant) and key.value == "PYTHONPATH":
                return value
    return None


def _names_tests(value: ast.AST, in_tests: bool) -> bool:
    """Does this path expression name the tests folder: a "tests" path part, or (in a test file)
    the file's own folder without climbing out of it?"""
    for node in ast.walk(value):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "tests" in node.value.replace("\\", "/").split("/"):
            return True
    text = ast.unparse(value)
    return in_tests and "__file__" in text and not any(up in text for up in ("parents[", ".parent.parent", "'..'"))


def helper_problems(roots: list[Path], repo: Path) -> list[str]:
    """Test and bench files that import conftest, a test module or the tests folder, or put tests/
    on sys.path: their shared helpers belong in harvester.testing."""
    problems = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            where = path.relative_to(repo).as_posix()
            for imp in imports_in(path):
                parts = imp.target.split(".")
                if parts[0] in ("conftest", "tests") or any(part.startswith("test_") for part in parts):
                    problems.append(f"{where}:{imp.line} imports {imp.target}: shared test helpers go to"
                                    f" plugins/harvester/testing/, fixtures to a conftest.py (never imported)")
            in_tests = root.name == "tests"
            nodes = [node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
                     if hasattr(node, "lineno")]
            for node in sorted(nodes, key=lambda node: (node.lineno, node.col_offset)):
                value = _changes_sys_path(node)
                if value is not None and _names_tests(value, in_tests):
                    problems.append(f"{where}:{node.lineno} puts tests/ on the import path"
                                    f" ({ast.unparse(value)}): import helpers from harvester.testing instead")
    return problems


def _fail_on(problems: list[str]) -> None:
    assert not problems, "\n".join(problems)


# -- this repository --------------------------------------------------------------------------------------
def test_no_import_cycles_among_the_package_modules():
    _fail_on(cycle_problems(PACKAGE))


def test_the_domain_imports_no_io_library():
    _fail_on(domain_problems(PACKAGE))


def test_runtime_rooms_never_import_the_testing_room():
    _fail_on(runtime_testing_problems(PACKAGE))


def test_the_pipeline_imports_no_concrete_source():
    _fail_on(pipeline_source_problems(PACKAGE))


def test_the_package_root_holds_only_its_init_and_http():
    _fail_on(root_problems(PACKAGE))


def test_tests_and_benches_take_helpers_from_harvester_testing():
    _fail_on(helper_problems([ROOT / "tests", ROOT / "bench"], ROOT))


def test_the_walker_sees_this_package():
    """(So the rules above cannot pass by reading nothing.)"""
    graph = package_imports(PACKAGE)
    assert {"harvester.http", "harvester.domain.breaker", "harvester.store.breaker", "harvester.sources"} <= set(graph)
    targets = {imp.target for imp in graph["harvester.store.breaker"]}
    assert {"harvester.domain.breaker", "harvester.domain"} & targets


# -- the rules fail where they should: a package built for it ---------------------------------------------
def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_cycle_through_an_import_inside_a_function_is_found_and_named(tmp_path):
    pkg = write(tmp_path / "pkg", {
        "__init__.py": "",
        "config/__init__.py": "",
        "config/portals.py": "import os\n\n\ndef targets():\n    from pkg.pipeline import notify\n    return notify\n",
        "pipeline/__init__.py": "",
        "pipeline/notify.py": "from ..config.portals import targets\n",
        "pipeline/steps.py": "from . import notify\nfrom pkg.config import portals\n",
    })
    assert cycle_problems(pkg) == [
        "import cycle pkg.config.portals -> pkg.pipeline.notify -> pkg.config.portals"
        " (config/portals.py:5, pipeline/notify.py:1)"]
    (pkg / "config/portals.py").write_text("import os\n")
    assert cycle_problems(pkg) == []


def test_relative_imports_resolve_to_the_module_they_name(tmp_path):
    pkg = write(tmp_path / "pkg", {
        "__init__.py": "from . import store\n",
        "store/__init__.py": "from .db import connect\nfrom . import vector_check\n",
        "store/db.py": "def f():\n    from .vector_check import ok\n    from .. import store\n",
        "store/vector_check.py": "from pkg.store.db import connect as c\n",
    })
    graph = package_imports(pkg)
    assert [i.target for i in graph["pkg"]] == ["pkg.store"]
    assert [i.target for i in graph["pkg.store"]] == ["pkg.store.db", "pkg.store.vector_check"]
    assert [i.target for i in graph["pkg.store.db"]] == ["pkg.store.vector_check", "pkg.store"]
    assert cycle_problems(pkg) == [
        "import cycle pkg.store -> pkg.store.db -> pkg.store (store/__init__.py:1, store/db.py:3);"
        " tied into it too: pkg.store.vector_check"]


def test_the_domain_rule_and_the_testing_rule_name_the_import(tmp_path):
    pkg = write(tmp_path / "pkg", {
        "__init__.py": "",
        "http.py": "import requests\n",
        "helpers.py": "",
        "domain/__init__.py": "",
        "domain/records.py": "import hashlib\n\n\ndef load():\n    import psycopg\n    from google import genai\n",
        "store/__init__.py": "",
        "store/db.py": "def demo():\n    from pkg.testing.samples import load\n",
        "cli/main.py": "from pkg.testing import demo\n",
        "testing/__init__.py": "",
        "testing/samples.py": "import requests\n",
    })
    assert domain_problems(pkg) == [
        "pkg.domain.records imports psycopg (domain/records.py:5): the domain is pure, no IO library; move the IO to an"
        " adapter room (store/, sources/, embeddings/, http.py)",
        "pkg.domain.records imports google (domain/records.py:6): the domain is pure, no IO library; move the IO to an"
        " adapter room (store/, sources/, embeddings/, http.py)"]
    assert runtime_testing_problems(pkg) == [
        "pkg.store.db imports pkg.testing.samples (store/db.py:2): runtime code never imports pkg.testing; move what it"
        " needs out of testing/"]  # cli may (the demo portal command)
    assert [p.split(" is ")[0] for p in root_problems(pkg)] == ["pkg/helpers.py"]


def test_the_pipeline_rule_names_each_concrete_source_import(tmp_path):
    pkg = write(tmp_path / "pkg", {
        "__init__.py": "",
        "sources/__init__.py": "from pkg.sources.base import Source\n\n\ndef source_for(p):\n"
                               "    from pkg.sources.ckan import CkanSource\n",
        "sources/base.py": "",
        "sources/ckan.py": "",
        "sources/socrata.py": "",
        "store/db.py": "from pkg.sources.ckan import CkanClient\n",
        "pipeline/__init__.py": "",
        "pipeline/steps.py": "from pkg.sources import Source, source_for\nfrom pkg.sources.base import to_ms\n"
                             "from ..sources import base\n\n\ndef reconcile():\n"
                             "    from pkg.sources.ckan import CkanClient\n",
        "pipeline/tasks.py": "from ..sources import socrata, base\nimport pkg.sources.dcat_json\n",
    })
    problems = pipeline_source_problems(pkg)
    assert [p.split(":")[0] + ":" + p.split(":")[1].split(")")[0] for p in problems] == [
        "pkg.pipeline.steps imports pkg.sources.ckan (pipeline/steps.py:7",
        "pkg.pipeline.tasks imports pkg.sources.socrata (pipeline/tasks.py:1",
        "pkg.pipeline.tasks imports pkg.sources.dcat_json (pipeline/tasks.py:2"]  # not yet a module: still named
    assert "the pipeline imports no concrete source" in problems[0]
    (pkg / "pipeline/steps.py").write_text("from pkg.sources import source_for\nfrom pkg.sources.base import IdPage\n")
    (pkg / "pipeline/tasks.py").write_text("from .. import sources\nfrom ..sources.base import Source\n")
    assert pipeline_source_problems(pkg) == []  # store/ and sources/ may import a kind: the rule is the pipeline's


def test_the_helper_rule_finds_conftest_and_test_module_imports_and_tests_on_sys_path(tmp_path):
    tests, bench = tmp_path / "tests", tmp_path / "bench"
    write(tests, {
        "conftest.py": "import sys\nsys.path.insert(0, str(ROOT / 'plugins'))\n",
        "store/test_a.py": "def test_x():\n    from conftest import GEMINI_KEY\n",
        "store/test_b.py": "from store.test_a import helper\nimport sys, os\n"
                           "sys.path.append(os.path.dirname(__file__))\n",
        "store/test_c.py": "from harvester.testing.samples import load_samples\n",
    })
    write(bench, {
        "one_bench.py": "import sys\nsys.path[:0] = [str(ROOT / 'tests'), str(ROOT / 'plugins')]\nimport other_bench\n",
        "two_bench.py": "import os, subprocess\nsubprocess.run([], env=dict(os.environ, PYTHONPATH='tests'))\n",
        "three_bench.py": "env = {'PATH': '/bin', 'PYTHONPATH': os.pathsep.join([str(ROOT / 'plugins'), 'tests'])}\n"
                          "env['PYTHONPATH'] += ':' + str(ROOT / 'tests')\n",
    })
    problems = helper_problems([tests, bench], tmp_path)
    assert [p.split(" ")[0:2] for p in problems] == [
        ["tests/store/test_a.py:2", "imports"],
        ["tests/store/test_b.py:1", "imports"],
        ["tests/store/test_b.py:3", "puts"],
        ["bench/one_bench.py:2", "puts"],
        ["bench/three_bench.py:1", "puts"],
        ["bench/three_bench.py:2", "puts"],
        ["bench/two_bench.py:2", "puts"]]
    assert "imports conftest:" in problems[0] and "imports store.test_a:" in problems[1]
