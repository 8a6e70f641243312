"""A second connection to a caller's database, for a statement to run on in a worker thread while the
caller's connection runs another: hybrid search's vector side beside its text side (store/search.py).

``take(conn)`` claims one for a search (None: run one after the other: ``conn`` is inside a
transaction, whose uncommitted rows and snapshot a second connection would not share, or
``MAX_IN_USE`` are in use for that database); ``submit(claim, function)`` runs ``function(connection)``
on it in the process's worker threads; ``result(future)`` waits for the answer at most ``WAIT_S``.
``NotBeside`` from ``result``: no second connection could be opened, or it broke (a server restart,
pg_terminate_backend): the caller runs ``function`` on its own connection.

A second connection is opened in the worker by the first search of a process against a database (the
caller's conninfo, password included; autocommit; the store's session settings, no migration;
connect_timeout ``CONNECT_S`` unless the conninfo sets one, statement_timeout ``STATEMENT_S``) and
kept by the process, idle between searches, so that the next searches (an API request's as well, a
connection each) do not connect for it: it costs a backend per thread searching at once (a few MB
of server memory, a slot of max_connections). The idle ones of the ``DATABASES_KEPT`` databases
used last are kept, closed at exit, and forgotten (not closed: the parent's sockets) in a forked
child."""
from __future__ import annotations

import atexit
import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

MAX_IN_USE = 4  # second connections in use at once, per database
CONNECT_S = 10  # the connect_timeout of a second connection
STATEMENT_S = 300  # the statement_timeout on a second connection
WAIT_S = CONNECT_S + STATEMENT_S + 30  # the longest a search waits for its answer
DATABASES_KEPT = 8  # databases whose idle second connections are kept (tests make one per test)


class NotBeside(Exception):
    """The function did not run on a second connection (none could be opened, or it broke): the
    caller runs it on its own."""


class _Beside:
    """One second connection to a database."""

    def __init__(self, conninfo: str):
        import psycopg

        from harvester.store import db

        # bounded: the connect (unless the caller's conninfo sets its own connect_timeout) and every
        # statement on it (a search waits for it at most WAIT_S: result())
        conn = psycopg.connect(conninfo, **({} if "connect_timeout" in conninfo else {"connect_timeout": CONNECT_S}))
        self.conn = db.prepare(conn, migrate=False, application_name="harvester search (vector side)")
        self.conn.execute("SELECT set_config('statement_timeout', %s, false)", (f"{STATEMENT_S * 1000}",))

    def usable(self) -> bool:
        from psycopg import pq

        return not self.conn.closed and self.conn.info.transaction_status == pq.TransactionStatus.IDLE


@dataclass(frozen=True)
class Claim:
    """One search's claim on a second connection (take() gives it, submit() gives it back):
    ``database`` names it without its secrets (host:port/dbname user, and a digest of the whole
    conninfo: two conninfos of one database that differ, in a password or an option, are two), the
    key the idle ones are kept under; ``conninfo`` (the caller's, password included) opens one and is
    never shown (not in its repr, so not in a traceback's locals)."""
    database: str
    conninfo: str = field(repr=False)
    beside: _Beside | None = field(default=None, repr=False)


def _database(info, conninfo: str) -> str:
    digest = hashlib.sha256(conninfo.encode()).hexdigest()[:12]
    return f"{info.host}:{info.port}/{info.dbname} {info.user} #{digest}"


_idle: dict[str, list[_Beside]] = {}  # database (Claim.database) -> its idle second connections
_busy: dict[str, int] = {}  # database -> its second connections in use
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def idle() -> list:
    """The idle second connections the process keeps (their psycopg connections), every database's."""
    with _lock:
        return [beside.conn for besides in _idle.values() for beside in besides]


def take(conn) -> Claim | None:
    """A second connection to ``conn``'s database claimed for one search (submit() gives it back
    once its function ran), with an idle one or none (opened in the worker), when it may be used:
    ``conn`` holds no open transaction and fewer than MAX_IN_USE are in use for that database.
    None: the caller runs both statements itself, one after the other."""
    from psycopg import pq
    from psycopg.conninfo import make_conninfo

    if conn.closed or conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return None
    info = conn.info
    conninfo = make_conninfo(info.dsn, password=info.password) if info.password else info.dsn
    key = _database(info, conninfo)
    with _lock:
        idle = _idle.setdefault(key, [])
        beside = None
        while idle and beside is None:
            beside = idle.pop()
            if not beside.usable():
                beside.conn.close()
                beside = None
        if beside is None and _busy.get(key, 0) >= MAX_IN_USE:
            return None
        _busy[key] = _busy.get(key, 0) + 1
        for other in [k for k in _idle if k != key][:max(0, len(_idle) - DATABASES_KEPT)]:
            for old in _idle.pop(other):  # the oldest databases' idle ones (a test's, dropped since)
                old.conn.close()
    return Claim(key, conninfo, beside)


def _run(claim: Claim, function):
    """In the worker: ``function`` on the claim's second connection (opened here when it has none),
    which is then idle again for the next search, or closed when broken. Raises NotBeside when it
    could not be opened or broke."""
    import psycopg

    key = claim.database
    try:
        beside = claim.beside or _Beside(claim.conninfo)
    except Exception as exc:  # noqa: BLE001 - no second connection (max_connections, pg_hba)
        with _lock:
            _busy[key] -= 1
        raise NotBeside(str(exc)) from exc
    try:
        return function(beside.conn)
    except psycopg.OperationalError as exc:
        if beside.conn.closed:
            raise NotBeside(str(exc)) from exc
        raise
    finally:
        with _lock:
            _busy[key] -= 1
            if beside.usable():
                _idle.setdefault(key, []).append(beside)
                beside = None
        if beside is not None:
            beside.conn.close()


def _close_idle() -> None:
    """At exit: the idle second connections closed (not left to the garbage collector)."""
    with _lock:
        idle = [beside for besides in _idle.values() for beside in besides]
        _idle.clear()
    for beside in idle:
        beside.conn.close()


def _forget() -> None:
    """In a forked child (a web server's worker): the parent's second connections and worker threads
    are not the child's (their sockets are the parent's: never closed from here)."""
    global _pool, _lock
    _idle.clear()
    _busy.clear()
    _lock = threading.Lock()
    _pool = None


os.register_at_fork(after_in_child=_forget)


def submit(claim: Claim, function) -> Future:
    """``function(connection)`` run on the claimed second connection in a worker thread."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="harvester-search")
            atexit.register(_close_idle)
    return _pool.submit(_run, claim, function)


def result(future: Future, wait_s: float | None = None):
    """The function's answer, waited for at most ``wait_s`` (by default WAIT_S: past the second
    connection's connect and statement timeouts, so only a hung worker reaches it)."""
    from concurrent.futures import TimeoutError as FutureTimeout

    wait_s = WAIT_S if wait_s is None else wait_s
    try:
        return future.result(timeout=wait_s)
    except FutureTimeout:
        raise TimeoutError(f"search: the vector side on its second connection gave no answer within {wait_s:g}s "
                           "(its connect_timeout and statement_timeout passed)") from None
