"""The guarded outbound client: every request Harvester makes of a stranger's server goes through a
``requests`` session made here (``FetchPolicy.session``).

- only http(s); each connection resolves its host itself and refuses it unless every address is
  public (not loopback, private, link-local, multicast, reserved, unspecified), then connects to
  the address it checked: redirects, every page of a listing, remote JSON-LD contexts and a DNS
  name that points inward are all checked, and the answer of a second lookup cannot differ from
  the one checked. No proxy from the environment (the check would be of the proxy);
- a body (decoded) over ``max_bytes`` stops as it streams (``TooLarge``), and so does an answer
  announcing more in its Content-Length;
- one deadline (``deadline``): each request waits at most what is left, and a body still
  streaming when it passes stops.
"""
from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass, field
from typing import Iterator, Mapping
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util import connection as urllib3_connection

from harvester.sources.base import SourceError

MAX_REDIRECTS = 5

# -- errors ------------------------------------------------------------------------------------------
class Refused(SourceError):
    """Validation will not fetch this URL (its scheme, or an address it resolves to)."""


class AddressRefused(Refused):
    """A host resolved to an address that is not public (and private addresses are not allowed)."""

    def __init__(self, message: str, host: str, address: str):
        super().__init__(message)
        self.host, self.address = host, address


class TooLarge(SourceError):
    """A document is larger than the validation may read."""

    def __init__(self, message: str, limit: int):
        super().__init__(message)
        self.limit = limit


class FetchTimeout(SourceError):
    """The validation's deadline passed while fetching."""


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
                      allowed: frozenset[tuple[str, int]] = frozenset()) -> list[str]:
    """The addresses ``host`` resolves to, every one of them checked: AddressRefused naming the
    host and the address when one is not public (unless ``allow_private``, or that (address,
    port) is in ``allowed``). socket.gaierror when it does not resolve."""
    found: list[str] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        if sockaddr[0] not in found:
            found.append(sockaddr[0])
    if not allow_private:
        for address in found:
            why = address_refusal(address)
            if why is not None and (address, port) not in allowed:
                named = host if host == address else f"{host} resolves to {address}, which"
                raise AddressRefused(f"{named} is a {why} address: validation fetches only public addresses "
                                     "(HARVESTER_VALIDATE_ALLOW_PRIVATE is off)", host, address)
    return found


class _GuardedConnection:
    """Mixed into urllib3's connections: the socket goes to an address checked here, never to a
    second resolution of the name."""

    allow_private = False
    allowed: frozenset[tuple[str, int]] = frozenset()

    def _new_conn(self) -> socket.socket:
        host = self._dns_host  # type: ignore[attr-defined]
        try:
            addresses = checked_addresses(host, self.port, allow_private=self.allow_private,  # type: ignore
                                          allowed=self.allowed)
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


def size_text(n: int) -> str:
    """A byte count as a size setting writes it (100MB), else in bytes."""
    for unit, size in (("GB", 1024 ** 3), ("MB", 1024 ** 2), ("kB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n} bytes"


class _CappedBody:
    """A response's ``raw`` (urllib3) that counts what is read of it (decoded) and stops past the
    limit or the deadline. Everything else is the wrapped response's."""

    def __init__(self, raw, limit: int | None, where: str, deadline: float):
        self.__dict__.update(_raw=raw, _limit=limit, _where=where, _deadline=deadline, _seen=0)

    def __getattr__(self, name):
        return getattr(self._raw, name)

    def __setattr__(self, name, value):
        setattr(self._raw, name, value)

    def _count(self, n: int) -> None:
        self.__dict__["_seen"] += n
        if self._limit is not None and self._seen > self._limit:
            self._raw.close()
            raise TooLarge(f"{self._where}: the document is larger than {size_text(self._limit)} "
                           "(HARVESTER_VALIDATE_MAX_BYTES)", self._limit)
        if time.monotonic() > self._deadline:
            self._raw.close()
            raise FetchTimeout(f"{self._where}: still reading after the validation's time "
                               "(HARVESTER_VALIDATE_TIMEOUT_SECS) ran out")

    def read(self, amt=None, *args, **kwargs) -> bytes:
        if amt is None or amt < 0:  # never the whole body at once: the limit is checked as it comes
            parts = []
            while True:
                chunk = self._raw.read(64 * 1024, *args, **kwargs)
                if not chunk:
                    return b"".join(parts)
                self._count(len(chunk))
                parts.append(chunk)
        data = self._raw.read(amt, *args, **kwargs)
        self._count(len(data))
        return data

    def stream(self, amt=2 ** 16, decode_content=None) -> Iterator[bytes]:
        # (amt None would read the whole body before it could be counted)
        for chunk in self._raw.stream(amt or 64 * 1024, decode_content=decode_content):
            self._count(len(chunk))
            yield chunk


class _GuardedAdapter(HTTPAdapter):
    """http(s) through guarded connections, bodies capped, one deadline."""

    def __init__(self, policy: "FetchPolicy", deadline: float):
        self._policy, self._deadline = policy, deadline
        attrs = {"allow_private": policy.allow_private, "allowed": policy.allowed}
        http_conn = type("GuardedHTTPConnection", (_GuardedConnection, HTTPConnection), attrs)
        https_conn = type("GuardedHTTPSConnection", (_GuardedConnection, HTTPSConnection), attrs)
        self._pools = {"http": type("GuardedHTTPPool", (HTTPConnectionPool,), {"ConnectionCls": http_conn}),
                       "https": type("GuardedHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": https_conn})}
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(self._pools)

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        scheme = urlsplit(request.url).scheme.lower()
        if scheme not in ("http", "https"):
            raise Refused(f"{request.url}: validation fetches only http(s) URLs, not {scheme}:")
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise FetchTimeout(f"GET {request.url}: the validation's time (HARVESTER_VALIDATE_TIMEOUT_SECS) ran out")
        if left != float("inf"):
            if isinstance(timeout, tuple):
                timeout = tuple(left if t is None else min(t, left) for t in timeout)
            else:
                timeout = left if timeout is None else min(timeout, left)
        return super().send(request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies={})

    def build_response(self, req, resp):
        response = super().build_response(req, resp)
        limit = self._policy.max_bytes
        length = response.headers.get("Content-Length", "")
        if limit is not None and length.strip().isdigit() and int(length) > limit:
            response.close()
            raise TooLarge(f"{req.url}: the document is {int(length)} bytes, larger than {size_text(limit)} "
                           "(HARVESTER_VALIDATE_MAX_BYTES)", limit)
        response.raw = _CappedBody(response.raw, limit, req.url, self._deadline)
        return response


@dataclass(frozen=True)
class FetchPolicy:
    """How a validation may fetch: ``allow_private`` addresses (else only public ones, but for the
    (address, port) pairs in ``allowed``), at most ``max_bytes`` a body (None: no limit), each
    request within ``timeout`` seconds and all of them within ``deadline`` (None: none), each
    retried ``max_retries`` times when it fails transiently."""

    allow_private: bool = True
    max_bytes: int | None = None
    timeout: float = 60.0
    deadline: float | None = None
    max_retries: int = 1
    allowed: frozenset = field(default_factory=frozenset)

    @classmethod
    def from_settings(cls, environ: Mapping[str, str] | None = None) -> "FetchPolicy":
        """The API's: HARVESTER_VALIDATE_ALLOW_PRIVATE, _MAX_BYTES and _TIMEOUT_SECS."""
        from harvester.config.settings import env_values
        from harvester.domain.sizes import parse_size

        got = env_values(("HARVESTER_VALIDATE_ALLOW_PRIVATE", "HARVESTER_VALIDATE_MAX_BYTES",
                          "HARVESTER_VALIDATE_TIMEOUT_SECS"), environ)
        size = got["HARVESTER_VALIDATE_MAX_BYTES"]
        seconds = float(got["HARVESTER_VALIDATE_TIMEOUT_SECS"])
        return cls(allow_private=bool(got["HARVESTER_VALIDATE_ALLOW_PRIVATE"]),
                   max_bytes=parse_size(size) if isinstance(size, str) else int(size), timeout=seconds,
                   deadline=seconds)

    def ends_at(self) -> float:
        """The deadline of a validation starting now (time.monotonic; infinity for none)."""
        return float("inf") if self.deadline is None else time.monotonic() + self.deadline

    def session(self) -> requests.Session:
        """A new session for one validation (its deadline starts now: ``ends_at``)."""
        session = requests.Session()
        session.trust_env = False  # no proxy, no .netrc: the connection checked is the one made
        session.max_redirects = MAX_REDIRECTS
        adapter = _GuardedAdapter(self, self.ends_at())
        session.ends_at = adapter._deadline  # type: ignore[attr-defined]  (what the document adapter keeps too)
        session.adapters.clear()
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session


