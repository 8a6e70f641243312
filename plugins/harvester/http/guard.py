"""The guarded outbound client: every request Harvester makes of a stranger's server, in harvest runs
(``harvester.http.HttpFetcher``) and in validation (``pipeline/validate.py``), goes through a
``requests`` session made here (``FetchPolicy.session``).

- Only http(s). Each connection resolves its host itself and refuses it unless every address is
  public (not loopback, private, link-local, multicast, reserved, unspecified), then connects to
  the address it checked: redirects, every page of a listing, remote JSON-LD contexts and a DNS
  name that points inward are all checked, and the answer of a second lookup cannot differ from
  the one checked. No proxy and no .netrc from the environment (the check would be of the proxy).
  A harvest's policy reaches its portal's own host (``own_hosts``) whatever its addresses (the
  operator named it); other hosts (next links, contexts, redirects) must be public unless
  HARVESTER_FETCH_ALLOW_PRIVATE. Validation reaches only public addresses unless
  HARVESTER_VALIDATE_ALLOW_PRIVATE.
- A body (decoded) over the size cap stops as it streams (``TooLarge``), and so does an answer
  announcing more in its Content-Length. An answer read whole is capped by ``max_bytes``; one a
  source streams (``streamed()``: a data.json of hundreds of MB) by ``max_stream_bytes``.
- A deadline: one for a whole validation (``deadline``), one for each request of a harvest
  (``request_deadline``). Each request waits at most what is left of it, and a watchdog thread
  shuts the connection's socket down when it passes: a server that sends one byte a second, in
  its headers or its body, cannot hold a request past its deadline (``FetchTimeout``).

- Network failures are worded for people (``failure_text``): "connection refused", "DNS: the host
  name does not resolve (...)", "timed out: nothing received for 60 s", "TLS: the server's
  certificate is not trusted (...)": one cause, no URL (whoever says it names the URL once), no
  urllib3 "Max retries exceeded" and no class names. The session raises requests' own exceptions
  (their classes say what may be retried) with that text.

Credentials are not this module's business: ``HttpFetcher`` sends them only to the portal's own
origin, on every hop of a redirect it follows itself.
"""
from __future__ import annotations

import heapq
import http.client
import ipaddress
import itertools
import os
import re
import socket
import ssl
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Iterator, Mapping
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import (ConnectTimeoutError, IncompleteRead, LocationParseError, NameResolutionError,
                                NewConnectionError, ProtocolError, ReadTimeoutError)
from urllib3.util import connection as urllib3_connection

from harvester.config.secrets import redact_url
from harvester.sources.base import SourceError

MAX_REDIRECTS = 5
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Purpose:
    """Who fetches, as messages say it, and the settings that open each limit."""

    who: str
    allow_private: str
    max_bytes: str
    deadline: str
    beyond: str = ""  # what else is reached whatever its address


VALIDATION = Purpose("validation", "HARVESTER_VALIDATE_ALLOW_PRIVATE", "HARVESTER_VALIDATE_MAX_BYTES",
                     "HARVESTER_VALIDATE_TIMEOUT_SECS")
HARVEST = Purpose("a harvest", "HARVESTER_FETCH_ALLOW_PRIVATE", "HARVESTER_FETCH_MAX_BYTES",
                  "HARVESTER_FETCH_DEADLINE_SECS", " beyond its portal's own host")


# -- errors ------------------------------------------------------------------------------------------
class Refused(SourceError):
    """The guard will not fetch this URL (its scheme, or an address it resolves to)."""


class AddressRefused(Refused):
    """A host resolved to an address that is not public (and private addresses are not allowed)."""

    def __init__(self, message: str, host: str, address: str):
        super().__init__(message)
        self.host, self.address = host, address


class TooLarge(SourceError):
    """A document is larger than the policy lets a request read."""

    def __init__(self, message: str, limit: int):
        super().__init__(message)
        self.limit = limit


class FetchTimeout(SourceError):
    """The deadline passed while fetching. ``transient``: a harvest's request may do better later
    (the task's retry); a validation's is over."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


def refuse_scheme(url: str, purpose: Purpose = VALIDATION) -> None:
    """Refused for a URL that is not http(s), naming it and its scheme."""
    scheme = urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        raise Refused(f"{redact_url(url)}: {purpose.who} fetches only http(s) URLs, not {scheme or 'a relative URL'}:")


# -- what went wrong, in words -------------------------------------------------------------------
_TIMEOUT_SECONDS = re.compile(r"(connect|read) timeout=([0-9.]+)")
_URLLIB3_PREFIX = re.compile(r"^\w+\(host='[^']*', port=\d+\): ")


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps: requests' and urllib3's wrappers (an exception as an argument,
    ``reason``), causes and contexts; outermost first."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 30:
        current = todo.pop(0)
        if any(current is s for s in seen):
            continue
        seen.append(current)
        todo += [a for a in getattr(current, "args", ()) if isinstance(a, BaseException)]
        reason = getattr(current, "reason", None)
        todo += [x for x in (reason, current.__cause__, current.__context__) if isinstance(x, BaseException)]
    return seen


def _seconds(chain: list[BaseException], kind: str) -> str:
    for e in chain:
        found = _TIMEOUT_SECONDS.search(str(e))
        if found and found.group(1) == kind:
            return f"{float(found.group(2)):g} s"
    return ""


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def failure_text(exc: BaseException) -> str:
    """What went wrong with a request, in a few words and without its URL (the caller names it
    once): ``connection refused``, ``DNS: the host name does not resolve (Name or service not
    known)``, ``timed out: no connection within 10 s``, ``timed out: nothing received for 60 s``,
    ``TLS: the server's certificate is not trusted (self-signed certificate)``, ``the server
    closed the connection without answering``... Never urllib3's "Max retries exceeded", its pool
    and connection reprs or an exception's class name."""
    if getattr(exc, "worded", False):
        return str(exc)
    chain = _chain(exc)

    def first(*types):
        return next((e for e in chain if isinstance(e, types)), None)

    if isinstance(exc, requests.TooManyRedirects):
        return f"more than {MAX_REDIRECTS} redirects"
    if isinstance(exc, (requests.exceptions.InvalidURL, requests.exceptions.InvalidSchema,
                        requests.exceptions.MissingSchema)) or first(LocationParseError):
        return "not a valid URL"
    if isinstance(exc, requests.exceptions.ContentDecodingError):
        return "the answer's compression is broken (it does not decode)"
    verify = first(ssl.SSLCertVerificationError)
    if verify is not None:
        why = getattr(verify, "verify_message", None) or getattr(verify, "reason", None) or "not verified"
        return f"TLS: the server's certificate is not trusted ({_lower(str(why))})"
    tls = first(ssl.SSLError)
    if tls is not None or isinstance(exc, requests.exceptions.SSLError):
        why = getattr(tls, "reason", None) or (tls.strerror if tls is not None else None) or "no detail"
        return f"TLS: the handshake failed ({str(why).lower().replace('_', ' ')})"
    unresolved = first(socket.gaierror)
    if unresolved is not None or first(NameResolutionError):
        why = unresolved.strerror if unresolved is not None and unresolved.strerror else "no such host"
        return f"DNS: the host name does not resolve ({why})"
    if first(ConnectionRefusedError):
        return "connection refused"
    if first(http.client.RemoteDisconnected):  # (a ConnectionResetError too)
        return "the server closed the connection without answering"
    if first(ConnectionResetError):
        return "the connection was reset by the server"
    # (urllib3's NewConnectionError is a ConnectTimeoutError too: any failure to connect)
    if any(isinstance(e, ConnectTimeoutError) and not isinstance(e, NewConnectionError) for e in chain) \
            or first(requests.ConnectTimeout):
        within = _seconds(chain, "connect")
        return f"timed out: no connection within {within}" if within else "timed out: no connection in time"
    if first(ReadTimeoutError, requests.ReadTimeout, socket.timeout):
        within = _seconds(chain, "read")
        return f"timed out: nothing received for {within}" if within else "timed out: nothing received in time"
    if first(IncompleteRead, http.client.IncompleteRead) or isinstance(exc, requests.exceptions.ChunkedEncodingError):
        return "the answer broke off before its end"
    broken = first(OSError)
    if broken is not None and broken.strerror and not isinstance(broken, requests.RequestException):
        prefix = "cannot connect: " if first(NewConnectionError) else ""
        return prefix + _lower(broken.strerror)
    if first(ProtocolError):
        return "the connection broke"
    innermost = chain[-1]
    said = " ".join(str(innermost).split()) or type(innermost).__name__
    said = _URLLIB3_PREFIX.sub("", said)
    return said if len(said) <= 200 else said[:200] + "..."


def _worded(exc: requests.RequestException) -> requests.RequestException:
    """``exc`` again, of its own class (what may be retried stays as it was), with ``failure_text``
    for its message."""
    try:
        again = type(exc)(failure_text(exc), request=exc.request, response=exc.response)
    except TypeError:  # (a class with arguments of its own)
        return exc
    again.worded = True  # type: ignore[attr-defined]
    return again


# -- addresses ---------------------------------------------------------------------------------------
_NOT_PUBLIC = (("is_unspecified", "unspecified"), ("is_loopback", "loopback"), ("is_link_local", "link-local"),
               ("is_multicast", "multicast"), ("is_reserved", "reserved"), ("is_private", "private"))


def address_refusal(address: str) -> str | None:
    """Why ``address`` (an IP address) is not public (``loopback``, ``private``, ``link-local``...),
    None when it is. An IPv4 address written as IPv6 (``::ffff:127.0.0.1``) is judged as IPv4."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for attribute, label in _NOT_PUBLIC:
        if getattr(ip, attribute):
            if label == "link-local" and str(ip) == "169.254.169.254":
                return "link-local (cloud metadata)"
            return label
    return None if ip.is_global else "not globally routable"


def checked_addresses(host: str, port: int, *, allow_private: bool,
                      allowed: frozenset[tuple[str, int]] = frozenset(), own_hosts: frozenset[str] = frozenset(),
                      purpose: Purpose = VALIDATION) -> list[str]:
    """The addresses ``host`` resolves to, every one of them checked: AddressRefused naming the
    host and the address when one is not public (unless ``allow_private``, the host is one of
    ``own_hosts``, or that (address, port) is in ``allowed``). socket.gaierror when it does not
    resolve."""
    found: list[str] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        if sockaddr[0] not in found:
            found.append(sockaddr[0])
    if not allow_private and host.lower().rstrip(".") not in own_hosts:
        for address in found:
            why = address_refusal(address)
            if why is not None and (address, port) not in allowed:
                named = host if host == address else f"{host} resolves to {address}, which"
                raise AddressRefused(f"{named} is a {why} address: {purpose.who} fetches only public addresses"
                                     f"{purpose.beyond} ({purpose.allow_private} is off)", host, address)
    return found


# -- the deadline ------------------------------------------------------------------------------------
# The deadline (time.monotonic) of the request being sent in this context: the adapter sets it, the
# connection arms the watchdog with it.
_DEADLINE: ContextVar[float] = ContextVar("harvester_fetch_deadline", default=float("inf"))
# Whether the request being sent is one whose body its caller streams (``streamed()``).
_STREAMED: ContextVar[bool] = ContextVar("harvester_fetch_streamed", default=False)


@contextmanager
def streamed(on: bool = True) -> Iterator[None]:
    """Requests sent inside are ones whose body the caller streams: capped by ``max_stream_bytes``."""
    token = _STREAMED.set(on)
    try:
        yield
    finally:
        _STREAMED.reset(token)


class _Watchdog:
    """Shuts a connection's socket down when its request's deadline passes: a read blocked on it
    returns at once, whatever the socket timeout (which a server sending a byte at a time never
    trips). One daemon thread for the process, started when first needed (again after a fork)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, object]] = []
        self._armed: dict[int, int] = {}  # id(connection) -> the sequence number of its live entry
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, conn: object, deadline: float) -> None:
        with self._cond:
            seq = next(self._seq)
            self._armed[id(conn)] = seq
            heapq.heappush(self._heap, (deadline, seq, conn))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="harvester-fetch-deadline", daemon=True)
                self._thread.start()
            self._cond.notify()

    def disarm(self, conn: object) -> None:
        with self._cond:
            self._armed.pop(id(conn), None)
            if len(self._heap) > 2 * len(self._armed) + 64:  # drop the entries of disarmed connections
                self._heap = [e for e in self._heap if self._armed.get(id(e[2])) == e[1]]
                heapq.heapify(self._heap)

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._armed.get(id(self._heap[0][2])) != self._heap[0][1]:
                    heapq.heappop(self._heap)  # disarmed, or armed again since
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, _, conn = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                self._armed.pop(id(conn), None)
                sock = getattr(conn, "sock", None)
                if sock is not None:
                    try:  # (socket.socket's own shutdown: an SSLSocket's would drop its TLS state under the reader)
                        socket.socket.shutdown(sock, socket.SHUT_RDWR)
                    except (OSError, TypeError):
                        pass


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _WATCHDOG.__init__())


class _GuardedConnection:
    """Mixed into urllib3's connections: the socket goes to an address checked here, never to a
    second resolution of the name; each request arms the watchdog with its deadline."""

    allow_private = False
    allowed: frozenset[tuple[str, int]] = frozenset()
    own_hosts: frozenset[str] = frozenset()
    purpose: Purpose = VALIDATION

    def _new_conn(self) -> socket.socket:
        host = self._dns_host  # type: ignore[attr-defined]
        try:
            addresses = checked_addresses(host, self.port, allow_private=self.allow_private,  # type: ignore
                                          allowed=self.allowed, own_hosts=self.own_hosts, purpose=self.purpose)
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc  # type: ignore[attr-defined, arg-type]
        last: Exception | None = None
        for address in addresses:
            try:
                return urllib3_connection.create_connection(
                    (address, self.port), self.timeout, source_address=self.source_address,  # type: ignore
                    socket_options=self.socket_options)  # type: ignore[attr-defined]
            except TimeoutError as exc:
                last = ConnectTimeoutError(self, f"Connection to {host} ({address}) timed out. "
                                                 f"(connect timeout={self.timeout})")  # type: ignore
                last.__cause__ = exc
            except OSError as exc:
                last = NewConnectionError(self, f"Failed to establish a new connection to {host} ({address}): "
                                                f"{exc}")  # type: ignore[arg-type]
                last.__cause__ = exc
        raise last or NewConnectionError(self, f"{host} resolves to no address")  # type: ignore[arg-type]

    def request(self, *args, **kwargs):
        deadline = _DEADLINE.get()
        if deadline != float("inf"):
            _WATCHDOG.arm(self, deadline)  # (a new connection's socket is made inside: the watchdog finds it then)
        else:
            _WATCHDOG.disarm(self)
        return super().request(*args, **kwargs)  # type: ignore[misc]


def size_text(n: int) -> str:
    """A byte count as a size setting writes it (100MB), else in bytes."""
    for unit, size in (("GB", 1024 ** 3), ("MB", 1024 ** 2), ("kB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n} bytes"


def _time_text(policy: "FetchPolicy") -> str:
    if policy.purpose is VALIDATION:
        return f"the validation's time ({policy.purpose.deadline})"
    return f"the {policy.request_deadline:g} s a request may take ({policy.purpose.deadline})"


class _CappedBody:
    """A response's ``raw`` (urllib3) that counts what is read of it (decoded) and stops past the
    limit or the deadline (the watchdog cuts a read still waiting then). Everything else is the
    wrapped response's."""

    def __init__(self, raw, limit: int | None, where: str, deadline: float, policy: "FetchPolicy", conn=None):
        self.__dict__.update(_raw=raw, _limit=limit, _where=where, _deadline=deadline, _policy=policy,
                             _conn=conn, _seen=0)

    def __getattr__(self, name):
        return getattr(self._raw, name)

    def __setattr__(self, name, value):
        setattr(self._raw, name, value)

    def _late(self) -> FetchTimeout:
        self._raw.close()
        self._done()
        return FetchTimeout(f"{self._where}: still reading after {_time_text(self._policy)} ran out",
                            transient=self._policy.purpose is not VALIDATION)

    def _done(self) -> None:
        if self._conn is not None:
            _WATCHDOG.disarm(self._conn)
            self.__dict__["_conn"] = None

    def _count(self, n: int) -> None:
        self.__dict__["_seen"] += n
        if self._limit is not None and self._seen > self._limit:
            self._raw.close()
            self._done()
            raise TooLarge(f"{self._where}: the document is larger than {size_text(self._limit)} "
                           f"({self._policy.purpose.max_bytes})", self._limit)
        if time.monotonic() > self._deadline:
            raise self._late()

    def _read(self, amt, *args, **kwargs) -> bytes:
        if time.monotonic() > self._deadline:
            raise self._late()
        try:
            data = self._raw.read(amt, *args, **kwargs)
        except Exception:
            if time.monotonic() >= self._deadline:  # the watchdog shut the socket
                raise self._late() from None
            raise
        if not data:
            self._done()
        return data

    def read(self, amt=None, *args, **kwargs) -> bytes:
        if amt is None or amt < 0:  # never the whole body at once: the limit is checked as it comes
            parts = []
            while True:
                chunk = self._read(_CHUNK, *args, **kwargs)
                if not chunk:
                    return b"".join(parts)
                self._count(len(chunk))
                parts.append(chunk)
        data = self._read(amt, *args, **kwargs)
        self._count(len(data))
        return data

    def stream(self, amt=2 ** 16, decode_content=None) -> Iterator[bytes]:
        # (amt None would read the whole body before it could be counted)
        chunks = self._raw.stream(amt or _CHUNK, decode_content=decode_content)
        while True:
            if time.monotonic() > self._deadline:
                raise self._late()
            try:
                chunk = next(chunks)
            except StopIteration:
                self._done()
                return
            except Exception:
                if time.monotonic() >= self._deadline:
                    raise self._late() from None
                raise
            self._count(len(chunk))
            yield chunk

    def close(self) -> None:
        self._done()
        self._raw.close()

    def release_conn(self) -> None:
        self._done()
        self._raw.release_conn()


class _GuardedAdapter(HTTPAdapter):
    """http(s) through guarded connections, bodies capped, deadlines kept."""

    def __init__(self, policy: "FetchPolicy", deadline: float):
        self._policy, self._deadline = policy, deadline
        attrs = {"allow_private": policy.allow_private, "allowed": policy.allowed, "own_hosts": policy.own_hosts,
                 "purpose": policy.purpose}
        http_conn = type("GuardedHTTPConnection", (_GuardedConnection, HTTPConnection), attrs)
        https_conn = type("GuardedHTTPSConnection", (_GuardedConnection, HTTPSConnection), attrs)
        self._pools = {"http": type("GuardedHTTPPool", (HTTPConnectionPool,), {"ConnectionCls": http_conn}),
                       "https": type("GuardedHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": https_conn})}
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(self._pools)

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        refuse_scheme(request.url, self._policy.purpose)
        now = time.monotonic()
        ends = self._deadline
        if self._policy.request_deadline is not None:
            ends = min(ends, now + self._policy.request_deadline)
        left = ends - now
        if left <= 0:
            raise FetchTimeout(f"GET {redact_url(request.url)}: {_time_text(self._policy)} ran out",
                               transient=self._policy.purpose is not VALIDATION)
        if left != float("inf"):
            if isinstance(timeout, tuple):
                timeout = tuple(left if t is None else min(t, left) for t in timeout)
            else:
                timeout = left if timeout is None else min(timeout, left)
        token = _DEADLINE.set(ends)
        try:
            return super().send(request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies={})
        except requests.RequestException as exc:
            if time.monotonic() >= ends:  # the watchdog cut a server still sending its headers
                raise FetchTimeout(f"GET {redact_url(request.url)}: no complete answer before "
                                   f"{_time_text(self._policy)} ran out",
                                   transient=self._policy.purpose is not VALIDATION) from None
            raise _worded(exc) from exc
        finally:
            _DEADLINE.reset(token)

    def build_response(self, req, resp):
        ends = _DEADLINE.get()
        conn = getattr(resp, "connection", None)
        response = super().build_response(req, resp)
        limit = self._policy.max_bytes
        if _STREAMED.get() and self._policy.max_stream_bytes is not None:
            limit = self._policy.max_stream_bytes
        length = response.headers.get("Content-Length", "")
        if limit is not None and length.strip().isdigit() and int(length) > limit:
            response.close()
            if conn is not None:
                _WATCHDOG.disarm(conn)
            raise TooLarge(f"{redact_url(req.url)}: the document is {int(length)} bytes, larger than "
                           f"{size_text(limit)} ({self._policy.purpose.max_bytes})", limit)
        response.raw = _CappedBody(response.raw, limit, redact_url(req.url), ends, self._policy, conn)
        return response


@dataclass(frozen=True)
class FetchPolicy:
    """How a session may fetch: ``allow_private`` addresses (else only public ones, but for the
    hosts in ``own_hosts`` and the (address, port) pairs in ``allowed``), at most ``max_bytes`` a
    body read whole and ``max_stream_bytes`` one streamed (None: ``max_bytes``; None both: no
    limit), each request within ``timeout`` seconds a read, within ``request_deadline`` seconds in
    all (None: none) and all of them within ``deadline`` of the session's start (None: none), each
    retried ``max_retries`` times when it fails transiently. ``purpose`` words the messages."""

    allow_private: bool = True
    max_bytes: int | None = None
    timeout: float = 60.0
    deadline: float | None = None
    max_retries: int = 1
    allowed: frozenset = field(default_factory=frozenset)
    own_hosts: frozenset = field(default_factory=frozenset)
    request_deadline: float | None = None
    max_stream_bytes: int | None = None
    purpose: Purpose = VALIDATION

    @classmethod
    def from_settings(cls, environ: Mapping[str, str] | None = None) -> "FetchPolicy":
        """The validation API's: HARVESTER_VALIDATE_ALLOW_PRIVATE, _MAX_BYTES and _TIMEOUT_SECS."""
        from harvester.config.settings import env_values
        from harvester.domain.sizes import parse_size

        got = env_values(("HARVESTER_VALIDATE_ALLOW_PRIVATE", "HARVESTER_VALIDATE_MAX_BYTES",
                          "HARVESTER_VALIDATE_TIMEOUT_SECS"), environ)
        size = got["HARVESTER_VALIDATE_MAX_BYTES"]
        seconds = float(got["HARVESTER_VALIDATE_TIMEOUT_SECS"])
        return cls(allow_private=bool(got["HARVESTER_VALIDATE_ALLOW_PRIVATE"]),
                   max_bytes=parse_size(size) if isinstance(size, str) else int(size), timeout=seconds,
                   deadline=seconds)

    @classmethod
    def for_harvest(cls, portal_url: str, *, timeout: float = 60.0,
                    environ: Mapping[str, str] | None = None) -> "FetchPolicy":
        """A harvest's, for the portal at ``portal_url`` (its host reached whatever its addresses):
        HARVESTER_FETCH_ALLOW_PRIVATE, _MAX_BYTES, _MAX_STREAM_BYTES and _DEADLINE_SECS."""
        from harvester.config.settings import env_values
        from harvester.domain.sizes import parse_size

        got = env_values(("HARVESTER_FETCH_ALLOW_PRIVATE", "HARVESTER_FETCH_MAX_BYTES",
                          "HARVESTER_FETCH_MAX_STREAM_BYTES", "HARVESTER_FETCH_DEADLINE_SECS"), environ)

        def size(name: str) -> int:
            value = got[name]
            return parse_size(value) if isinstance(value, str) else int(value)

        host = (urlsplit(portal_url).hostname or "").lower().rstrip(".")
        return cls(allow_private=bool(got["HARVESTER_FETCH_ALLOW_PRIVATE"]),
                   max_bytes=size("HARVESTER_FETCH_MAX_BYTES"),
                   max_stream_bytes=size("HARVESTER_FETCH_MAX_STREAM_BYTES"), timeout=timeout,
                   request_deadline=float(got["HARVESTER_FETCH_DEADLINE_SECS"]),
                   own_hosts=frozenset({host}) if host else frozenset(), purpose=HARVEST)

    def ends_at(self) -> float:
        """The deadline of a session starting now (time.monotonic; infinity for none)."""
        return float("inf") if self.deadline is None else time.monotonic() + self.deadline

    def session(self) -> requests.Session:
        """A new session (its deadline starts now: ``ends_at``)."""
        session = requests.Session()
        session.trust_env = False  # no proxy, no .netrc: the connection checked is the one made
        session.max_redirects = MAX_REDIRECTS
        adapter = _GuardedAdapter(self, self.ends_at())
        session.ends_at = adapter._deadline  # type: ignore[attr-defined]  (what the document adapter keeps too)
        session.purpose = self.purpose  # type: ignore[attr-defined]  (how HttpFetcher words a refused scheme)
        session.adapters.clear()
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session
