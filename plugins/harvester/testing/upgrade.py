"""An upgrade from an older Harvester to this one, for tests and benches (issue 37).

The older code is the tree of a git commit, extracted with ``git archive`` (no worktree is
registered in the repository: a fresh clone's CI must not depend on one) and run with this venv:
its ``plugins/`` first on PYTHONPATH (and as Airflow's plugins folder), its ``dags/`` as the dags
folder. Its migrations.SQL_DIR is relative to its own file, so it migrates with its own ``sql/``.

``deploy(tree, app)`` copies a tree's dags/, plugins/ and sql/ to one place (``app``), as an image
holds them at one path: the cluster keeps its dags and plugins folders, the code in them changes.

What an upgrade must keep is read with SQL only (``content``: a table's rows by key, vectors as
lists of floats), so the same reader works on the schema before and after; search answers come
from each code's own ``store.search``, run in a process of that code (this file run as a script
with that tree's plugins on PYTHONPATH: it imports nothing of Harvester at module level).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# The commit just before the last six migrations (017_record_outcomes.sql .. 022) were added:
# 9841e28 added 017; this is its parent.
OLD_COMMIT = "4c2ae80"
CODE_PARTS = ("dags", "plugins", "sql")


class OldCodeMissing(RuntimeError):
    """The commit to upgrade from is not in this clone (a shallow clone: `git fetch --unshallow`)."""


def extract_old_code(dest: Path, commit: str = OLD_COMMIT, repo: Path = ROOT) -> Path:
    """The tree of ``commit`` in ``dest`` (made if missing), by ``git archive | tar -x``."""
    dest = Path(dest)
    probe = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        shallow = subprocess.run(["git", "-C", str(repo), "rev-parse", "--is-shallow-repository"],
                                 capture_output=True, text=True, timeout=60).stdout.strip()
        raise OldCodeMissing(
            f"commit {commit} (the code before migrations 017-022, to upgrade from) is not in {repo}"
            + (" (a shallow clone: run `git fetch --unshallow`)" if shallow == "true" else "")
            + f": {probe.stderr.strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", commit], stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, capture_output=True, timeout=300)
    archive.stdout.close()
    if archive.wait(60) != 0 or untar.returncode != 0:
        raise RuntimeError(f"git archive {commit} | tar -x -C {dest} failed: {untar.stderr.decode()[-500:]}")
    if not (dest / "plugins" / "harvester" / "store" / "migrations.py").is_file():
        raise RuntimeError(f"{dest}: the tree of {commit} has no plugins/harvester/store/migrations.py")
    return dest


def deploy(tree: Path, app: Path) -> Path:
    """The code of ``tree`` (dags/, plugins/, sql/) at ``app``, replacing what was there; caches
    (__pycache__) are not copied."""
    app = Path(app)
    app.mkdir(parents=True, exist_ok=True)
    for part in CODE_PARTS:
        shutil.rmtree(app / part, ignore_errors=True)
        shutil.copytree(Path(tree) / part, app / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return app


def migrations_in(tree: Path) -> list[str]:
    """The migration files of a tree, in order."""
    return sorted(p.name for p in (Path(tree) / "sql").glob("[0-9][0-9][0-9]_*.sql"))


# -- what an upgrade keeps ---------------------------------------------------------------------------
VECTOR_TYPES = ("vector", "halfvec")


def columns(conn, table: str) -> dict[str, str]:
    """{column: type name} of a table (dropped and virtual generated columns included as they read)."""
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute a"
        " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (table,)).fetchall()
    return dict(rows)


def content(conn, table: str, key: tuple[str, ...], where: str = "", params: tuple = (),
            extra: dict[str, str] | None = None) -> dict[tuple, dict]:
    """The rows of ``table`` ({key values: {column: value}}): vectors as lists of floats (their
    text form parsed), everything else as psycopg reads it. The table is ``t`` in ``where`` and in
    ``extra`` ({name: SQL expression} read besides its columns, e.g. ``{"title": "t.title"}``, which
    reads a column or, when the table has none, the function title(t))."""
    cols = columns(conn, table)
    extra = {name: expr for name, expr in (extra or {}).items() if name not in cols}
    select = ", ".join([f"t.{c}::text" if ty in VECTOR_TYPES else f"t.{c}" for c, ty in cols.items()]
                       + list(extra.values()))
    rows = conn.execute(f"SELECT {select} FROM {table} t {where}", params).fetchall()
    names = [*cols, *extra]
    out = {}
    for row in rows:
        values = dict(zip(names, row))
        for c, t in cols.items():
            if t in VECTOR_TYPES and values[c] is not None:
                values[c] = json.loads(values[c])
        out[tuple(values[k] for k in key)] = values
    return out


def half_close(a: list[float], b: list[float]) -> bool:
    """Whether ``b`` is ``a`` as half precision keeps it (within half a half-precision step)."""
    if len(a) != len(b):
        return False
    return all(abs(x - y) <= abs(x) * 2 ** -11 + 2 ** -24 + 1e-12 for x, y in zip(a, b))


def compare_rows(table: str, before: dict[tuple, dict], after: dict[tuple, dict], *, skip: set[str] = frozenset(),
                 vector_cols: set[str] = frozenset(), limit: int = 5) -> list[str]:
    """What of ``before`` is missing from ``after`` or differs in it: every row (by key) still
    there, every column of it (but ``skip``, and those the upgrade dropped) equal; vectors within
    half precision."""
    problems = []
    missing = [k for k in before if k not in after]
    if missing:
        problems.append(f"{table}: {len(missing)} of {len(before)} rows lost, e.g. {missing[:limit]}")
    differ: list[str] = []
    gone_cols: set[str] = set()
    for k, row in before.items():
        new = after.get(k)
        if new is None:
            continue
        for col, value in row.items():
            if col in skip:
                continue
            if col not in new:
                gone_cols.add(col)
                continue
            if col in vector_cols and value is not None and new[col] is not None:
                same = half_close(value, new[col])
            else:
                same = value == new[col]
            if not same:
                shown = (f"{len(value)} dims vs {len(new[col])}" if col in vector_cols and value and new[col]
                         else f"{value!r:.80} -> {new[col]!r:.80}")
                differ.append(f"{k} {col}: {shown}")
    if differ:
        problems.append(f"{table}: {len(differ)} values differ, e.g. {differ[:limit]}")
    return problems


# -- search answers, from the code of a tree ----------------------------------------------------------
def search_answers(plugins: Path, db_url: str, queries: list[tuple[str, str | None]], env: dict, limit: int = 20,
                   modes: tuple[str, ...] = ("text", "vector", "hybrid"), timeout: float = 300) -> dict:
    """{"<mode>:<portal_url>:<query>": [["<portal_url> <source_id>", score], ...]} (vector mode: the
    similarity) for each (query, portal_url or None: all portals), as the code of ``plugins``
    answers (a process of its own; its provider from ``env``: HARVESTER_EMBEDDING_PROVIDER, GEMINI_*)."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("HARVESTER_", "AIRFLOW_CONN_", "GEMINI_"))}
    child_env.update({"PYTHONPATH": str(plugins), "_AIRFLOW__AS_LIBRARY": "1", **env})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
        json.dump({"db_url": db_url, "queries": queries, "limit": limit, "modes": list(modes)}, spec)
    try:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "search", spec.name],
                              env=child_env, capture_output=True, text=True, timeout=timeout)
    finally:
        os.unlink(spec.name)
    if done.returncode != 0:
        raise RuntimeError(f"search with the code of {plugins} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _search_main(spec_path: str) -> None:
    import inspect

    import psycopg

    from harvester.store import db as store_db
    from harvester.store import search

    spec = json.loads(Path(spec_path).read_text())
    conn = store_db.prepare(psycopg.connect(spec["db_url"], application_name="upgrade search"), migrate=False)
    extra = {"all_copies": True} if "all_copies" in inspect.signature(search.search).parameters else {}
    out = {}
    try:
        for mode in spec["modes"]:
            for query, portal_url in spec["queries"]:
                found = search.search(conn, query, mode=mode, limit=spec["limit"], portal_url=portal_url, **extra)
                # a dataset by its portal and id (the old code's items carry no dataset_id); ranked
                # by similarity in vector mode (its score there is a rank's fusion weight)
                out[f"{mode}:{portal_url or '*'}:{query}"] = [
                    [f"{item['portal_url']} {item['source_id']}",
                     float(item["similarity"] if mode == "vector" and item.get("similarity") is not None
                           else item["score"])]
                    for item in found.items]
    finally:
        conn.close()
    print(json.dumps(out))


def compare_answers(before: dict, after: dict, tolerance: float = 2e-3) -> list[str]:
    """Each query's answer the same: the same datasets in the same order, but that two whose
    scores differ by less than ``tolerance`` (half precision moves a cosine by about 1e-4) may
    trade places, and one tied with the last kept may trade with one just past the limit."""
    problems = []
    for key, old in before.items():
        new = after.get(key)
        if new is None:
            problems.append(f"search {key}: no answer after the upgrade")
            continue
        if not old:
            if new:
                problems.append(f"search {key}: nothing found before, {len(new)} after")
            continue
        old_score = {d: s for d, s in old}
        new_score = {d: s for d, s in new}
        edge_old, edge_new = old[-1][1], new[-1][1] if new else None
        lost = [d for d, s in old if d not in new_score and not (len(new) == len(old) and s - edge_new < tolerance)]
        gained = [d for d, s in new if d not in old_score and not (len(new) == len(old) and s - edge_old < tolerance)]
        moved = []
        for d, s in old:
            if d in new_score and abs(new_score[d] - s) >= tolerance and key.startswith(("vector:", "text:")):
                moved.append((d, s, new_score[d]))
        order_new = [d for d, _ in new if d in old_score]
        swaps = [(a, b) for i, a in enumerate(order_new) for b in order_new[i + 1:]
                 if [d for d, _ in old].index(a) > [d for d, _ in old].index(b)
                 and abs(old_score[a] - old_score[b]) >= tolerance]
        if lost or gained or moved or swaps:
            problems.append(f"search {key}: lost {lost[:5]}, gained {gained[:5]}, scores moved {moved[:3]}, "
                            f"out of order {swaps[:3]} (before {old[:6]}..., after {new[:6]}...)")
    return problems


if __name__ == "__main__":
    # run as a script: its own folder (harvester/testing) must not shadow top-level modules
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    if len(sys.argv) == 3 and sys.argv[1] == "search":
        _search_main(sys.argv[2])
    else:
        raise SystemExit(f"usage: {sys.argv[0]} search SPEC.json")
