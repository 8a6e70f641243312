"""A real Airflow for tests and benches: `airflow scheduler`, `airflow dag-processor` and
`airflow api-server` as subprocesses, LocalExecutor, the metadata database in PostgreSQL. Not
dag.test(): every task is its own process, started by the executor, re-parsing its DAG file, talking
to the API server; DAG runs are triggered, backfilled and watched through the REST API (/api/v2).

    from harvester.testing.airflow_cluster import AirflowCluster, harvester_env, write_portals

    env = harvester_env(harvester_db_url, portals_file, gemini_url=fake.base_url, gemini_key=KEY,
                        HARVESTER_TASK_RETRIES="1")
    with AirflowCluster(home, metadata_url, env) as airflow:    # config, db migrate, 3 processes up
        airflow.wait_for_dags(["harvest_a", "harvest_b"])
        airflow.unpause("harvest_a")
        run_id = airflow.trigger("harvest_a", {"full_sync": True})
        states = airflow.wait_for_runs("harvest_a", [run_id], timeout=120)   # {run_id: "success"}
        airflow.require_success([("harvest_a", run_id)], timeout=120)      # or fail, diagnosed

``home`` is the cluster's own AIRFLOW_HOME (a fresh directory: airflow.cfg, logs/, and the three
processes' output in scheduler.out, dag-processor.out, api-server.out). ``metadata_url`` is a
PostgreSQL URL of an existing, empty database (``postgresql://`` is taken as
``postgresql+psycopg2://``). ``env`` is what the processes (and so every task) get on top of a
minimal environment built here (PATH with this venv's bin first, HOME, LANG): nothing of the
caller's environment is inherited otherwise, so the conftest's AIRFLOW_HOME for dag.test() or a
developer's GEMINI_API_KEY never leak in. ``env`` may also override any Airflow setting
(``AIRFLOW__SECTION__KEY``).

From a bench script::

    from harvester.testing.airflow_cluster import AirflowCluster, harvester_env, write_portals
    from harvester.store.embedded.server import EmbeddedServer

    server = EmbeddedServer(home / "pg")
    server.start()
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE airflow_meta")     # empty: `airflow db migrate` fills it
    portals = write_portals(home / "portals.yaml", [{"name": "bench", "url": portal_url}])
    env = harvester_env(server.url(), portals, gemini_url=..., gemini_key=...)  # `harvester` db: migrated by begin
    with AirflowCluster(home / "airflow", server.url("airflow_meta"), env, parallelism=8) as airflow:
        airflow.wait_for_dags(["harvest_bench"]); airflow.unpause("harvest_bench")
        run = ("harvest_bench", airflow.trigger("harvest_bench", {"full_sync": True}))
        airflow.require_success([run], timeout=3600)
        print(airflow.task_instances(*run))            # start_date, end_date, duration, pid of each task

Every wait has a timeout; on timeout (and on a run that did not succeed, with ``require_success``)
the AssertionError carries ``describe()`` of the DAG runs concerned: their task states, the tail of
the log of each task that failed or is still running, and the tail of each process's output.
Pools: only Airflow's default_pool exists unless ``create_pool`` makes another.

Another executor: ``executor="CeleryExecutor"`` (its settings, e.g. AIRFLOW__CELERY__BROKER_URL, in
``env``) and the processes that run its tasks in ``extra_processes``: {name: (airflow CLI arguments,
environment on top of the cluster's)}, started after the three above, watched, described and
stopped like them (output in <home>/<name>.out)::

    AirflowCluster(home, metadata_url, env, executor="CeleryExecutor", extra_processes={
        "worker1": (["celery", "worker", "--celery-hostname", "w1@%h", "--concurrency", "4",
                     "--pid", str(home / "worker1.pid"), "--skip-serve-logs"], {}),
        ...})
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

import requests

ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent
TERMINAL = {"success", "failed"}
PROCESSES = ("scheduler", "dag-processor", "api-server")
# Inherited from the caller when set: nothing else of its environment reaches the cluster.
_PASSED = ("HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME", "HARVESTER_SAMPLES_DIR")


class ClusterError(AssertionError):
    """The cluster did not start, or something it was asked to do did not happen in time; the
    message says what, with the diagnostics."""


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Routine lines of the processes' output, left out of diagnostics: successful API calls (the
# harness's own polling, task heartbeats), the dag-processor's schedule bookkeeping.
NOISE = re.compile(r"\[http\.access\].*status_code=[23]\d\d|next_dagrun|Adopting or resetting orphaned tasks"
                   r"|Refreshing bundle|Searching for files in|Found \d+ files for bundle|Bulk-writing dags")


def tail(path: Path, lines: int = 40, skip: re.Pattern | None = None) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        return f"({path}: {exc.strerror})"
    kept = [line for line in text.splitlines() if not (skip and skip.search(line))]
    return "\n".join(kept[-lines:])


def _log_line(line: str) -> str:
    """A task log line (Airflow 3 writes JSON lines) as text."""
    try:
        entry = json.loads(line)
    except ValueError:
        return line
    if not isinstance(entry, dict):
        return line
    when = str(entry.get("timestamp", ""))[11:23]
    text = f"{when} {str(entry.get('level', '')).upper():7} {entry.get('logger', '')}: {entry.get('event', '')}"
    for key in ("error_detail", "exception"):
        if entry.get(key):
            detail = entry[key]
            if isinstance(detail, list):  # structlog's dict tracebacks
                parts = []
                for exc in detail:
                    frames = exc.get("frames", [])[-4:]
                    parts += [f"    {f.get('filename')}:{f.get('lineno')} {f.get('name')}" for f in frames]
                    parts.append(f"  {exc.get('exc_type')}: {exc.get('exc_value')}")
                detail = "\n".join(parts)
            text += f"\n{detail}"
    return text


class AirflowCluster:
    """One Airflow: ``start()``/``stop()`` or a ``with`` block.

    REST: ``wait_for_dags``, ``unpause``/``pause``, ``trigger`` (-> run id), ``backfill`` (-> backfill
    id), ``run``, ``runs_of``, ``task_instances``, ``task_states``, ``xcom``, ``pools``/``create_pool``,
    ``api`` (any other call). Waiting: ``wait_for_runs``/``wait_for`` (-> states), ``require_success``,
    ``wait_until``. Diagnostics: ``task_log``, ``describe``, ``process_tails``. Processes:
    ``kill_task_process`` (only a descendant of this cluster's processes), ``airflow(...)`` (the CLI),
    ``restart`` (stop and start again: e.g. on other code in the same folders), ``descendants``
    (every process under the cluster's, with its start time: ``alive(...)`` says which still run).
    ``dags_folder``/``plugins_folder``: this checkout's by default (its plugins folder also goes first
    on the processes' PYTHONPATH). ``parse_interval``: seconds between two parses of a DAG file.
    ``executor`` (LocalExecutor) and ``extra_processes`` (e.g. Celery workers): see the module docstring."""

    def __init__(self, home: Path, metadata_url: str, env: dict | None = None, *,
                 dags_folder: Path = ROOT / "dags", plugins_folder: Path = ROOT / "plugins",
                 parallelism: int = 16, parse_interval: int = 10, start_timeout: float = 180,
                 executor: str = "LocalExecutor", extra_processes: dict | None = None):
        from cryptography.fernet import Fernet

        self.home = Path(home)
        self.metadata_url = self._sqlalchemy_url(metadata_url)
        self.extra_env = {k: str(v) for k, v in (env or {}).items()}
        self.dags_folder, self.plugins_folder = Path(dags_folder), Path(plugins_folder)
        self.parallelism, self.parse_interval, self.start_timeout = parallelism, parse_interval, start_timeout
        self.executor = executor
        # name -> (airflow CLI arguments, environment on top of the cluster's): e.g. Celery workers
        self.extra_processes = {name: (list(args), {k: str(v) for k, v in (extra or {}).items()})
                                for name, (args, extra) in (extra_processes or {}).items()}
        self.api_port = free_port()
        self.base_url = f"http://127.0.0.1:{self.api_port}"
        # The log servers' default ports (8793, 8794) would clash with any other Airflow on the machine.
        self._ports = {"worker_log": free_port(), "trigger_log": free_port()}
        self._secrets = {"fernet": Fernet.generate_key().decode(), "jwt": secrets.token_urlsafe(32),
                         "api": secrets.token_urlsafe(32)}
        self.procs: dict[str, subprocess.Popen] = {}
        self.http = requests.Session()

    @staticmethod
    def _sqlalchemy_url(url: str) -> str:
        scheme, sep, rest = url.partition("://")
        if scheme in ("postgresql", "postgres"):
            return f"postgresql+psycopg2://{rest}"
        return url

    # -- configuration ------------------------------------------------------------------------------
    @property
    def logs(self) -> Path:
        return self.home / "logs"

    def settings(self) -> dict[str, str]:
        """Every Airflow setting this cluster makes (AIRFLOW__SECTION__KEY); ``env`` may override them."""
        return {
            "AIRFLOW__CORE__EXECUTOR": self.executor,
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.plugins_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__CORE__FERNET_KEY": self._secrets["fernet"],
            # Tasks get tokens signed by the scheduler and checked by the API server: one secret.
            "AIRFLOW__API_AUTH__JWT_SECRET": self._secrets["jwt"],
            "AIRFLOW__API__SECRET_KEY": self._secrets["api"],
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__EXPOSE_STACKTRACE": "True",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.metadata_url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_SIZE": "3",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_MAX_OVERFLOW": "10",
            "AIRFLOW__DATABASE__CHECK_MIGRATIONS": "True",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs),
            "AIRFLOW__LOGGING__DAG_PROCESSOR_CHILD_PROCESS_LOG_DIRECTORY": str(self.logs / "dag_processor"),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self._ports["worker_log"]),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self._ports["trigger_log"]),
            "AIRFLOW__LOGGING__COLORED_CONSOLE_LOG": "False",
            # Quick: the DAG file is re-parsed every few seconds, the scheduler loops fast.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": str(self.parse_interval),
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": str(self.parse_interval),
            "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "2",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "600",
            "AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD": "600",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_STORAGE_PATH": str(self.home / "bundles"),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
            "AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL": "600",
            "AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY": "64",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "2",
            "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MIN": "0.2",
            "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MAX": "2",
            "AIRFLOW__WORKERS__MISSING_DAG_RETRY_DELAY": "2",
        }

    def environment(self) -> dict[str, str]:
        """The processes' whole environment."""
        env = {k: os.environ[k] for k in _PASSED if k in os.environ}
        env.update({
            "PATH": f"{VENV_BIN}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
            # The code of the plugins folder given, ahead of whatever copy is installed in the venv.
            "PYTHONPATH": str(self.plugins_folder),
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW_CONFIG": str(self.home / "airflow.cfg"),
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            **self.settings(),
            **self.extra_env,
        })
        return env

    def write_config(self) -> None:
        """airflow.cfg (empty: the settings are in the environment, which wins) and env.sh, to run
        `airflow ...` by hand against this cluster: ``. <home>/env.sh; airflow tasks states-for-dag-run ...``"""
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        (self.home / "airflow.cfg").write_text("# settings: see env.sh (AIRFLOW__* environment variables)\n")
        lines = [f"export {k}={_shell_quote(v)}" for k, v in sorted(self.environment().items())]
        (self.home / "env.sh").write_text("\n".join(lines) + "\n")

    # -- lifecycle -----------------------------------------------------------------------------------
    def __enter__(self) -> "AirflowCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def airflow(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        """`airflow <args>` in the cluster's environment (output in <home>/airflow-<args[0]>.out)."""
        out = self.home / f"airflow-{'-'.join(args[:2])}.out"
        with out.open("ab") as handle:
            try:
                done = subprocess.run([str(VENV_BIN / "airflow"), *args], env=self.environment(), stdout=handle,
                                      stderr=subprocess.STDOUT, timeout=timeout, cwd=self.home)
            except subprocess.TimeoutExpired:
                raise ClusterError(f"`airflow {' '.join(args)}` did not finish in {timeout:.0f}s:\n"
                                   f"{tail(out)}") from None
        if check and done.returncode != 0:
            raise ClusterError(f"`airflow {' '.join(args)}` exited with status {done.returncode}:\n{tail(out)}")
        return done

    def start(self) -> None:
        started = time.monotonic()
        self.write_config()
        self.airflow("db", "migrate")
        for name in PROCESSES:
            args = [name] + (["--host", "127.0.0.1", "--port", str(self.api_port)] if name == "api-server" else [])
            out = (self.home / f"{name}.out").open("ab")
            self.procs[name] = subprocess.Popen([str(VENV_BIN / "airflow"), *args], env=self.environment(),
                                                stdout=out, stderr=subprocess.STDOUT, cwd=self.home,
                                                start_new_session=True)  # its own process group: stop() ends it whole
            out.close()
        for name, (args, extra) in self.extra_processes.items():
            out = (self.home / f"{name}.out").open("ab")
            self.procs[name] = subprocess.Popen([str(VENV_BIN / "airflow"), *args], env={**self.environment(), **extra},
                                                stdout=out, stderr=subprocess.STDOUT, cwd=self.home,
                                                start_new_session=True)
            out.close()
        self._until(self._healthy, self.start_timeout - (time.monotonic() - started), "the cluster to be healthy",
                    lambda: json.dumps(self._health(), indent=1))

    def _health(self) -> dict:
        try:
            return self.http.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).json()
        except (requests.RequestException, ValueError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    def _healthy(self) -> bool:
        self.check_processes()
        health = self._health()
        return all((health.get(part) or {}).get("status") == "healthy"
                   for part in ("metadatabase", "scheduler", "dag_processor"))

    def check_processes(self) -> None:
        """ClusterError if one of the processes exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise ClusterError(f"airflow {name} exited with status {proc.returncode}:\n"
                                   f"{tail(self.home / f'{name}.out', 60)}")

    def stop(self) -> None:
        """SIGTERM to each process's group, SIGKILL to what is left after 20 s, and then SIGKILL to
        every task process still alive: Airflow's supervisor puts each task in a process group of
        its own (os.setpgid), so a task whose supervisor died in the group's SIGKILL would outlive
        the cluster, orphaned (as a container's stop kills everything in it, this does too). The
        cluster's descendants are noted while they still descend from it (an orphan's parent is
        init), each with its start time, so that a pid used again meanwhile is left alone."""
        seen = self.descendants()
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(proc.poll() is None for proc in self.procs.values()):
            seen.update(self.descendants())
            time.sleep(0.2)
        for proc in self.procs.values():
            seen.update(self.descendants())
            _signal_group(proc, signal.SIGKILL)  # the group: executor workers, supervisors
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        left = {pid: start for pid, start in seen.items() if _start_time(pid) == start}
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        until = time.monotonic() + 10
        while left and time.monotonic() < until:
            left = {pid: start for pid, start in left.items() if _start_time(pid) == start}
            time.sleep(0.1)
        self.procs.clear()
        self.http.close()

    def descendants(self) -> dict[int, int]:
        """{pid: start time} of every process descending from the cluster's processes now."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
        found: dict[int, int] = {}
        stack = [proc.pid for proc in self.procs.values()]
        while stack:
            for child in children.get(stack.pop(), ()):
                start = _start_time(child)
                if child not in found and start is not None:
                    found[child] = start
                    stack.append(child)
        return found

    def restart(self) -> None:
        """``stop()``, then ``start()`` again with the same home, metadata database, settings, ports
        and secrets: an operator's restart (``docker compose up -d`` with a new image), whatever code
        the dags and plugins folders hold by then. Task processes die with the processes; Airflow
        then resets or fails their task instances, and retries them as it would."""
        self.stop()
        self.http = requests.Session()
        try:
            self.start()
        except BaseException:
            self.stop()
            raise

    # -- REST -----------------------------------------------------------------------------------------
    def api(self, method: str, path: str, expect: Iterable[int] = (200,), **kwargs):
        """A call of /api/v2<path>; ClusterError (with the answer) on an unexpected status."""
        url = f"{self.base_url}/api/v2{path}"
        try:
            answer = self.http.request(method, url, timeout=kwargs.pop("timeout", 30), **kwargs)
        except requests.RequestException as exc:
            raise ClusterError(f"{method} {url}: {type(exc).__name__}: {exc}\n{self.process_tails()}") from None
        if answer.status_code not in tuple(expect):
            raise ClusterError(f"{method} {url} -> HTTP {answer.status_code}: {answer.text[:2000]}")
        return answer.json() if answer.content else None

    def dag(self, dag_id: str) -> dict | None:
        answer = self.http.get(f"{self.base_url}/api/v2/dags/{dag_id}", timeout=30)
        return answer.json() if answer.status_code == 200 else None

    def import_errors(self) -> list[dict]:
        return self.api("GET", "/importErrors", params={"limit": 100}).get("import_errors", [])

    def wait_for_dags(self, dag_ids: Iterable[str], timeout: float = 90) -> None:
        """Until the dag-processor has parsed and stored every one of ``dag_ids``."""
        wanted = list(dag_ids)

        def missing():
            self.check_processes()
            return [d for d in wanted if self.dag(d) is None]

        self._until(lambda: not missing(), timeout, f"the DAGs {wanted} to be parsed",
                    lambda: f"missing: {missing()}\nimport errors: {json.dumps(self.import_errors(), indent=1)}\n"
                            f"{self.process_tails()}\n--- dag-processor file log ---\n{self.dag_processor_log()}")

    def unpause(self, dag_id: str) -> None:
        self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def pause(self, dag_id: str) -> None:
        self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": True})

    def trigger(self, dag_id: str, conf: dict | None = None, run_id: str | None = None) -> str:
        """A manual DAG run (no logical date); returns its run id."""
        body = {"logical_date": None, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        return self.api("POST", f"/dags/{dag_id}/dagRuns", json=body)["dag_run_id"]

    def trigger_at_once(self, dag_ids: list[str], conf: dict | None = None) -> list[tuple[str, str]]:
        """One DAG run of each DAG, all triggered at the same moment (one thread each, released
        together); returns their (dag_id, run_id)."""
        barrier = threading.Barrier(len(dag_ids))
        out: dict[str, str] = {}
        errors: list[BaseException] = []

        def go(dag_id):
            try:
                barrier.wait(30)
                out[dag_id] = self.trigger(dag_id, conf)
            except BaseException as exc:  # re-raised below
                errors.append(exc)

        threads = [threading.Thread(target=go, args=(d,)) for d in dag_ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        if errors:
            raise errors[0]
        return [(d, out[d]) for d in dag_ids]

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")

    def runs_of(self, dag_id: str) -> list[dict]:
        """Every DAG run of ``dag_id``, oldest first (dicts of the REST API: dag_run_id, state,
        run_type, logical_date, conf, ...)."""
        return self.api("GET", f"/dags/{dag_id}/dagRuns",
                        params={"limit": 100, "order_by": "run_after"})["dag_runs"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
                        params={"limit": 100})["task_instances"]

    def task_states(self, dag_id: str, run_id: str) -> dict[tuple[str, int], str | None]:
        """{(task_id, map_index): state} of one DAG run."""
        return {(ti["task_id"], ti["map_index"]): ti["state"] for ti in self.task_instances(dag_id, run_id)}

    def backfill(self, dag_id: str, from_date: datetime, to_date: datetime, *, max_active_runs: int | None = None,
                 conf: dict | None = None, reprocess_behavior: str = "none") -> int:
        """A backfill through POST /api/v2/backfills; returns its id."""
        body = {"dag_id": dag_id, "from_date": _iso(from_date), "to_date": _iso(to_date),
                "reprocess_behavior": reprocess_behavior, "dag_run_conf": conf or {}}
        if max_active_runs is not None:
            body["max_active_runs"] = max_active_runs
        return self.api("POST", "/backfills", json=body)["id"]

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1):
        """What a task pushed (its return value by default), as JSON."""
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}",
                        params={"map_index": map_index})["value"]

    def pools(self) -> dict[str, int]:
        return {p["name"]: p["slots"] for p in self.api("GET", "/pools", params={"limit": 100})["pools"]}

    def create_pool(self, name: str, slots: int, description: str = "") -> None:
        self.api("POST", "/pools", json={"name": name, "slots": slots, "description": description,
                                         "include_deferred": False})

    # -- waiting ------------------------------------------------------------------------------------------
    def wait_for_runs(self, dag_id: str, run_ids: Iterable[str], timeout: float = 180) -> dict[str, str]:
        """Until each DAG run has ended (success or failed): {run_id: state}."""
        return {run_id: state for (_, run_id), state in self.wait_for([(dag_id, r) for r in run_ids], timeout).items()}

    def wait_for(self, runs: Iterable[tuple[str, str]], timeout: float = 180) -> dict[tuple[str, str], str]:
        """Until each (dag_id, run_id) has ended: {(dag_id, run_id): state}."""
        pending = list(runs)
        states: dict[tuple[str, str], str] = {}

        def done():
            self.check_processes()
            for key in pending:
                if key not in states:
                    state = self.run(*key)["state"]
                    if state in TERMINAL:
                        states[key] = state
            return len(states) == len(pending)

        self._until(done, timeout, f"DAG runs {[k for k in pending if k not in states]} to end",
                    lambda: self.describe([k for k in pending if k not in states]))
        return states

    def require_success(self, runs: Iterable[tuple[str, str]], timeout: float = 180) -> None:
        """Wait for the runs; ClusterError describing those that did not succeed."""
        states = self.wait_for(runs, timeout)
        bad = [key for key, state in states.items() if state != "success"]
        if bad:
            raise ClusterError(f"DAG runs did not succeed: {[(k, states[k]) for k in bad]} (cluster: {self.home})\n"
                               f"{self.describe(bad)}")

    def wait_until(self, condition, timeout: float, what: str, runs: Iterable[tuple[str, str]] = ()):
        """Until ``condition()`` is truthy (returned); on timeout, ClusterError describing ``runs``."""
        runs = list(runs)
        found = []

        def check():
            self.check_processes()
            value = condition()
            if value:
                found.append(value)
            return bool(value)

        self._until(check, timeout, what, lambda: self.describe(runs) if runs else self.process_tails())
        return found[-1]

    def _until(self, condition, timeout: float, what: str, diagnose) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if condition():
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what} (cluster: {self.home})\n"
                                   f"{diagnose()}")
            time.sleep(0.5)

    # -- diagnostics ----------------------------------------------------------------------------------------
    def task_log_path(self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1) -> Path:
        path = self.logs / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        if map_index >= 0:
            path = path / f"map_index={map_index}"
        return path / f"attempt={try_number}.log"

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1,
                 lines: int | None = None) -> str:
        """A task attempt's log as text (None lines: all of it)."""
        path = self.task_log_path(dag_id, run_id, task_id, try_number, map_index)
        try:
            raw = path.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no log at {path})"
        text = [_log_line(line) for line in raw]
        return "\n".join(text if lines is None else text[-lines:])

    def describe(self, runs: Iterable[tuple[str, str]]) -> str:
        """Each DAG run's state and task states, the log tail of each task attempt that failed or did
        not finish, and the tail of each process's output."""
        parts = []
        for dag_id, run_id in runs:
            try:
                run = self.run(dag_id, run_id)
                tis = sorted(self.task_instances(dag_id, run_id), key=lambda t: (t["start_date"] or "~", t["task_id"]))
            except ClusterError as exc:
                parts.append(f"=== {dag_id} / {run_id}: {exc}")
                continue
            parts.append(f"=== {dag_id} / {run_id}: {run['state']} ({run['run_type']})")
            for ti in tis:
                index = f"[{ti['map_index']}]" if ti["map_index"] >= 0 else ""
                parts.append(f"  {ti['task_id']}{index}: {ti['state']} try {ti['try_number']}/{ti['max_tries'] + 1}"
                             f" pool {ti['pool']} pid {ti['pid']}")
            for ti in tis:
                if ti["state"] in ("success", "skipped", "removed", "upstream_failed", None, "scheduled"):
                    continue
                for attempt in range(1, ti["try_number"] + 1):
                    parts.append(f"--- log of {ti['task_id']} map {ti['map_index']} attempt {attempt} "
                                 f"({ti['state']}) ---")
                    parts.append(self.task_log(dag_id, run_id, ti["task_id"], attempt, ti["map_index"], lines=30))
        parts.append(self.process_tails())
        return "\n".join(parts)

    def process_tails(self, lines: int = 25) -> str:
        """The last ``lines`` lines of each process's output that say something (NOISE left out)."""
        return "\n".join(f"--- {name}.out (last {lines} lines but routine ones; all in {self.home / (name + '.out')})"
                         f" ---\n{tail(self.home / f'{name}.out', lines, skip=NOISE)}"
                         for name in (*PROCESSES, *self.extra_processes))

    def dag_processor_log(self, lines: int = 30) -> str:
        files = sorted((self.logs / "dag_processor").rglob("*.log"), key=lambda p: p.stat().st_mtime)
        return tail(files[-1], lines) if files else "(no dag-processor file log)"

    # -- processes ---------------------------------------------------------------------------------------------
    def is_descendant(self, pid: int) -> bool:
        """Whether ``pid`` is a process this cluster started (a descendant of one of its processes)."""
        roots = {proc.pid for proc in self.procs.values()}
        seen = set()
        while pid > 1 and pid not in seen:
            if pid in roots:
                return True
            seen.add(pid)
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return False
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        return False

    def kill_task_process(self, pid: int, sig: int = signal.SIGKILL) -> None:
        """Signal a task's process (SIGKILL: the worker dies mid-task); only one of this cluster's."""
        if not self.is_descendant(pid):
            raise ClusterError(f"pid {pid} is not a process of this Airflow cluster: not signalled")
        os.kill(pid, sig)


def alive(processes: dict[int, int]) -> list[int]:
    """The pids of ``processes`` ({pid: start time}, as ``AirflowCluster.descendants`` gives them)
    still running (the same process: a pid used again by another is not)."""
    return [pid for pid, start in processes.items() if _start_time(pid) == start]


def _start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, /proc/<pid>/stat field 22); None once it is gone
    (a zombie counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # its own group (start_new_session)
    except ProcessLookupError:
        pass


def _iso(when: datetime) -> str:
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).isoformat()


def _shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


# -- the harvester in such a cluster --------------------------------------------------------------------
def write_portals(path: Path, entries: Iterable[dict]) -> Path:
    """A portals.yaml of ``entries`` (name, url, and what else a portal takes; schedule defaults to
    None, politeness_delay to 0)."""
    import yaml

    portals = [{"schedule": None, "enabled": True, "page_size": 100, "politeness_delay": 0, "lookback": "1h", **e}
               for e in entries]
    Path(path).write_text(yaml.safe_dump({"portals": portals}, sort_keys=False))
    return Path(path)


def harvester_env(database_url: str, portals_file: Path, *, gemini_url: str, gemini_key: str, **extra) -> dict:
    """What tasks of harvest_<portal> need: the harvester database (as the Airflow connection
    harvester_db, no embedded fallback), the portals, Gemini at ``gemini_url``; ``extra`` on top."""
    return {
        "AIRFLOW_CONN_HARVESTER_DB": database_url,
        "HARVESTER_EMBEDDED_DB": "off",
        "HARVESTER_PORTALS_FILE": str(portals_file),
        "HARVESTER_EMBEDDING_PROVIDER": "gemini",
        "GEMINI_API_KEY": gemini_key,
        "GEMINI_BASE_URL": gemini_url,
        "HARVESTER_EMBED_RETRY_DELAY_SECS": "0",
        **{k: str(v) for k, v in extra.items()},
    }


# -- lock waits, as operators would see them in pg_stat_activity ------------------------------------
class LockWatch:
    """Samples pg_stat_activity of one database every ``interval`` seconds from a thread of its own:
    every backend waiting for a lock (wait_event_type = 'Lock'), all but the sampler itself. For
    each statement (pid, query_start): its longest continuous wait (seen waiting in consecutive
    samples: one wait, or waits less than ``interval`` apart, which sampling cannot tell apart),
    how long it was seen waiting in all, what it waited on (wait_event: relation, tuple,
    transactionid, virtualxid, extend, advisory, ...) and who blocked it (application_name, or the
    backend type when it has none: autovacuum worker, ...)."""

    QUERY = ("SELECT a.pid, a.query_start, a.application_name, a.backend_type, a.wait_event,"
             " pg_blocking_pids(a.pid), left(regexp_replace(a.query, '\\s+', ' ', 'g'), 160),"
             " (SELECT array_agg(DISTINCT coalesce(nullif(b.application_name, ''), b.backend_type))"
             "   FROM pg_stat_activity b"
             "   WHERE b.pid = ANY(pg_blocking_pids(a.pid)))"
             " FROM pg_stat_activity a WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'"
             " AND a.pid <> pg_backend_pid()")

    def __init__(self, db_url: str, interval: float = 0.2):
        self.db_url, self.interval = db_url, interval
        self.waits: dict[tuple, dict] = {}
        self.errors: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lock-watch", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    def _run(self):
        import psycopg

        conn = None
        while not self._stop.wait(self.interval):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.db_url, autocommit=True, application_name="lock-watch")
                rows = conn.execute(self.QUERY).fetchall()
            except psycopg.Error as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                if conn is not None:
                    conn.close()
                conn = None
                continue
            now = time.monotonic()
            sample = self.samples
            self.samples += 1
            for pid, started, app, backend, event, blockers, query, blocker_apps in rows:
                seen = self.waits.setdefault((pid, started), {
                    "first": now, "app": app or "", "backend": backend, "events": set(), "query": query,
                    "blockers": set(), "blocker_apps": set(), "seen": 0, "sample": -2, "since": now,
                    "continuous": 0.0})
                if seen["sample"] != sample - 1:  # not waiting at the previous look: a new wait
                    seen["since"] = now
                seen["sample"] = sample
                seen["seen"] += 1
                seen["last"] = now
                seen["continuous"] = max(seen["continuous"], now - seen["since"] + self.interval)
                seen["events"].add(event)
                seen["blockers"].update(blockers or ())
                seen["blocker_apps"].update(a or "?" for a in (blocker_apps or ()))
        if conn is not None:
            conn.close()

    @staticmethod
    def kind(wait: dict) -> str:
        """build: the upsert's concurrent index build; task: a task's statement; other: anything else."""
        app = wait["app"]
        if app.endswith(" build"):
            return "build"
        if app.startswith("harvester "):
            return "task"
        return "other"

    def longest(self, kind: str | None = None) -> list[tuple[float, dict]]:
        """(longest continuous wait in seconds, the statement's waits), longest first; a wait seen
        once counts one interval."""
        return sorted(((w["continuous"], w) for w in self.waits.values()
                       if kind is None or self.kind(w) == kind), key=lambda x: -x[0])

    def report(self, indent: str = "  ", top: int = 6) -> list[str]:
        lines = [f"{indent}lock waits: {self.samples} samples of pg_stat_activity every {self.interval:g} s, "
                 f"{len(self.waits)} statements seen waiting; per statement: longest continuous wait, "
                 f"[seen waiting in all / from its first wait to its last], what it waited on, who blocked it"
                 + (f"; sampler errors: {self.errors[:2]}" if self.errors else "")]
        labels = {"task": "task statements",
                  "build": "index builds (application_name '... build': CREATE INDEX CONCURRENTLY waiting for "
                           "older snapshots; blocks nobody)",
                  "other": "other backends (not a harvester task's connection)"}
        for kind in ("task", "build", "other"):
            waits = self.longest(kind)
            if not waits and kind == "other":
                continue
            head = f"longest {waits[0][0]:.1f} s" if waits else "none seen"
            lines.append(f"{indent}  {labels[kind]}: {len(waits)} statements, {head}")
            for took, w in waits[:top]:
                blockers = ", ".join(sorted(w["blocker_apps"])) or "-"
                if len(blockers) > 150:
                    blockers = f"{len(w['blocker_apps'])} backends: {blockers[:140]}..."
                span = w["last"] - w["first"] + self.interval
                lines.append(f"{indent}    {took:5.1f} s [{w['seen'] * self.interval:.1f} / {span:.1f} s]  "
                             f"{w['app'] or w['backend']}  ({', '.join(sorted(w['events']))})  blocked by: {blockers}"
                             f"  | {w['query'][:100]}")
        return lines
