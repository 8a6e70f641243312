"""The one retrying HTTP path: every source's GETs (CKAN's Action API, DCAT catalogues) go through
``HttpFetcher.get``; what an answer means for a kind of portal stays with its source.

- Retried, with jittered exponential backoff (``backoff`` doubling, at most ``max_backoff``): 5xx,
  429 (waiting what its Retry-After asks, at most ``max_backoff``), timeouts, connection errors, and
  any answer the caller's ``parse`` turns down with ``Retryable`` (a proxy's maintenance page where
  a portal's answer should be). When ``max_retries`` retries are spent: ``RetriesExhausted``, a
  ``SourceUnavailable`` (transient), its message one line: ``GET <url> failed after 2 attempts
  (last: connection refused)`` (what went wrong worded by guard.py's ``failure_text``).
- Every other answer (2xx, 304, 4xx) goes back to the caller, as it is or through ``parse``.
- A ``politeness_delay`` between one request's end and the next one's start.
- Counted: ``requests_made`` (every request sent, retries included) and ``bytes_received`` (every
  body byte as it came over the wire: compressed, if the portal compresses).
- Credentials: HTTP Basic auth (``basic_auth``) or one header (``header_auth``, e.g. a CKAN API
  token in ``Authorization``), sent only to the portal's own origin (``origin``: scheme, host and
  port of the portal's URL; an http portal's host on https too): a next link, a JSON-LD context or
  a redirect elsewhere gets none. Redirects are followed here, hop by hop (at most
  ``MAX_REDIRECTS``), so each hop is judged. Neither ever appears in a log line, a message or a
  ``repr``, and URLs and error texts are scrubbed of user:password before they are logged or raised.
- Every request goes through the guarded session of ``http/guard.py``: a harvest's
  ``FetchPolicy.for_harvest`` (addresses, a size cap while bytes arrive, a deadline per request,
  from the HARVESTER_FETCH_* settings) unless the caller hands its own (validation does).
"""
from __future__ import annotations

import email.utils
import logging
import random
import time
from datetime import datetime, timezone
from typing import Any, Callable
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

import requests
import requests.auth

from harvester.config.secrets import redact_text, redact_url
from harvester.http.guard import HARVEST, MAX_REDIRECTS, FetchPolicy, failure_text, refuse_scheme, streamed
from harvester.sources.base import SourceError, SourceUnavailable

log = logging.getLogger(__name__)

USER_AGENT = "harvester (+https://github.com/harvester)"
# The one redactor (config/secrets.py), by the names the sources know it by: URLs and error texts
# lose any user:password and secret query parameters before they are logged or raised.
scrub_url, scrub_text = redact_url, redact_text


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """(the URL without user:password, (user, password) percent-decoded or None): a user:password
    in a URL is sent as Basic auth, never as part of the URL."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), (unquote(user), unquote(password))


_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL, lower-cased, the port filled in."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower().rstrip("."), port or _DEFAULT_PORTS.get(scheme, 0)


def same_origin(url: str, origin: tuple[str, str, int]) -> bool:
    """Whether ``url`` is of ``origin``, or of its host on https where the origin is http on the
    default port (the move to https a portal may redirect to)."""
    here = origin_of(url)
    return here == origin or (origin[0] == "http" and origin[2] == 80 and here == ("https", origin[1], 443))


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header (seconds or an HTTP date) in seconds from now; None when absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def validators_of(headers) -> dict[str, str]:
    """What an answer gives to make the next request conditional: its ``ETag`` and ``Last-Modified``
    (``{"etag", "last_modified"}``, only those it has), as ``Listing.validators`` keeps them."""
    out = {}
    if headers.get("ETag"):
        out["etag"] = str(headers["ETag"])
    if headers.get("Last-Modified"):
        out["last_modified"] = str(headers["Last-Modified"])
    return out


def conditional_headers(validators) -> dict[str, str]:
    """The request headers that ask for ``304 Not Modified`` when nothing changed since the answer
    ``validators`` (``validators_of``) came with: ``If-None-Match`` and ``If-Modified-Since``."""
    validators = validators if isinstance(validators, dict) else {}
    headers = {}
    if validators.get("etag"):
        headers["If-None-Match"] = str(validators["etag"])
    if validators.get("last_modified"):
        headers["If-Modified-Since"] = str(validators["last_modified"])
    return headers


def wire_bytes(resp: requests.Response) -> int:
    """The body's size as received (compressed, if it came compressed)."""
    raw = getattr(resp, "raw", None)
    try:
        told = raw.tell() if raw is not None else 0
    except (AttributeError, OSError, ValueError):
        told = 0
    return told if isinstance(told, int) and told > 0 else len(resp.content or b"")


def streamed_bytes(raw) -> int:
    """What a streamed body's ``raw`` (urllib3) has read of it as it came over the wire (compressed,
    if it came compressed); 0 when it cannot tell. Its reader adds it with ``HttpFetcher.add_bytes``."""
    try:
        told = raw.tell()
    except (AttributeError, OSError, ValueError):
        return 0
    return told if isinstance(told, int) and told > 0 else 0


def read_whole(resp: requests.Response) -> None:
    """Read a streamed answer's body in as few reads as the socket allows; ``resp.content``,
    ``.text`` and ``.json()`` then return it as usual. Read by requests itself (stream=False), it
    comes in 10 KB chunks, each of which gives the GIL up and must take it back: with another
    thread busy (the listing is read ahead while the previous page is staged, see
    pipeline/readahead.py) each chunk waited for the switch interval, and a page of 1000 CKAN
    records (~8 MB) took seconds instead of milliseconds. Errors are those requests raises for the
    body (ChunkedEncodingError, ConnectionError for a read timeout, ContentDecodingError)."""
    resp._content = b"".join(resp.iter_content(chunk_size=None)) or b""


class Retryable(Exception):
    """Raised by a ``parse`` callback of ``HttpFetcher.get``: the answer is not one the portal
    writes when it works (an HTML maintenance page, a captive portal's page, a truncated body), so
    it is retried like a 5xx. The message says what came; it is the ``last`` of a
    ``RetriesExhausted``."""


class RetriesExhausted(SourceUnavailable):
    """A GET failed transiently (5xx, 429, timeout, connection error, ``Retryable``) on every
    attempt. ``attempts`` made, ``last``: what went wrong the last time (``HTTP 503``, ``timed out:
    nothing received for 60 s``, ``connection refused``...), ``status``: the last answer's HTTP
    status (None when none came); a source may word its own message from them."""

    def __init__(self, message: str, *, attempts: int, last: str, status: int | None):
        super().__init__(message)
        self.attempts, self.last, self.status = attempts, last, status


class _BasicAuth(requests.auth.HTTPBasicAuth):
    def __repr__(self) -> str:
        return "<BasicAuth ***>"


class _HeaderAuth(requests.auth.AuthBase):
    """One header carrying a secret (``Authorization: <a CKAN API token>``). Passed as ``auth`` so
    that requests neither replaces it with Basic auth from the URL's user:password nor with ~/.netrc."""

    def __init__(self, name: str, value: str):
        self._name, self._value = name, value

    def __call__(self, r):
        r.headers[self._name] = self._value
        return r

    def __repr__(self) -> str:
        return f"<HeaderAuth {self._name} ***>"


class HttpFetcher:
    """GETs for one portal (``label``, its URL, names it in messages; ``origin`` defaults to
    label's). ``requests_made`` counts every request sent, retries and redirect hops included;
    ``bytes_received`` every body byte as it came over the wire (a streamed body's bytes are added
    by whoever reads it, with ``add_bytes``). ``headers`` go with every request (after
    ``User-Agent: <user_agent>``); ``basic_auth`` (user, password) or ``header_auth`` (header name,
    secret value) authenticate those to the portal's own origin, not both. ``session``: a guarded
    one of the caller's (``http/guard.py``); default: ``policy``'s (default: the harvest's, from
    the settings). ``sleep`` waits (the backoff, Retry-After and the politeness delay)."""

    def __init__(self, label: str, *, timeout: float = 60, max_retries: int = 5, backoff: float = 1.0,
                 max_backoff: float = 60.0, politeness_delay: float = 0.0,
                 basic_auth: tuple[str, str] | None = None, header_auth: tuple[str, str] | None = None,
                 headers: dict[str, str] | None = None, user_agent: str = USER_AGENT,
                 session: requests.Session | None = None, sleep: Callable[[float], Any] = time.sleep,
                 policy: FetchPolicy | None = None, origin: str | None = None):
        if basic_auth and header_auth:
            raise ValueError(f"{scrub_url(label)}: give basic_auth or header_auth ({header_auth[0]}), not both")
        self.label = scrub_url(label)
        self.timeout, self.backoff, self.max_backoff = timeout, backoff, max_backoff
        self.max_retries = max(0, int(max_retries))
        self.politeness_delay = max(0.0, politeness_delay)
        self.origin = origin_of(origin or label)
        self.session = session or (policy or FetchPolicy.for_harvest(label, timeout=timeout)).session()
        self.headers = {"User-Agent": user_agent, **(headers or {})}
        self._auth: requests.auth.AuthBase | None = (
            _HeaderAuth(*header_auth) if header_auth else _BasicAuth(*basic_auth) if basic_auth else None)
        self._sleep = sleep
        self._last_request: float | None = None
        self.requests_made = 0
        self.bytes_received = 0

    def __repr__(self) -> str:
        return f"HttpFetcher({self.label!r})"

    def add_bytes(self, n: int) -> None:
        self.bytes_received += int(n)

    def get(self, url: str, *, params: dict | None = None, headers: dict | None = None, stream: bool = False,
            parse: Callable[[requests.Response], Any] | None = None, what: str | None = None,
            capped_whole: bool = False) -> Any:
        """GET ``url`` (with query ``params``), retrying transient failures. Returns the answer, or
        what ``parse(answer)`` returns when ``parse`` is given (it may raise ``Retryable`` to have
        the answer retried like a 5xx; any other exception goes to the caller, unretried).
        ``stream``: the body is left unread (the caller reads it and adds its bytes), capped by the
        policy's ``max_stream_bytes``, or by ``max_bytes`` like a body read whole with ``capped_whole``
        (a page of a paged API that the caller parses as it streams, record by record). ``what``
        names the request in log lines and in the ``RetriesExhausted`` message (default ``GET
        <url>``, after ``<label>: `` when the URL is not under the label's: each URL once)."""
        shown = scrub_url(url)
        what = what or (f"GET {shown}" if shown.startswith(self.label) else f"{self.label}: GET {shown}")
        headers = {**self.headers, **(headers or {})}
        attempt = 0
        while True:
            attempt += 1
            self._polite()
            self.requests_made += 1
            retry_after = status = None
            try:
                resp = self._send(url, params, headers, stream and not capped_whole)
                if not stream:
                    try:
                        read_whole(resp)
                    except SourceError:  # (the guard's size cap or deadline: not retried here)
                        resp.close()
                        raise
            except (requests.Timeout, requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
                last = scrub_text(failure_text(exc))  # (guard.py: "connection refused", "timed out: ...")
            else:
                status = resp.status_code
                if status != 429 and status < 500:
                    if not stream:
                        self.bytes_received += wire_bytes(resp)
                    if parse is None:
                        return resp
                    try:
                        return parse(resp)
                    except Retryable as exc:  # a proxy's page, most likely: try again
                        last = str(exc)
                else:
                    self.bytes_received += wire_bytes(resp)
                    last = f"HTTP {status}"
                    if status == 429:
                        retry_after = retry_after_seconds(resp.headers.get("Retry-After"))
                resp.close()
            finally:
                self._last_request = time.monotonic()
            if attempt > self.max_retries:
                raise RetriesExhausted(f"{what} failed after {attempt} attempts (last: {last})", attempts=attempt,
                                       last=last, status=status)
            delay = min(self.max_backoff, retry_after) if retry_after is not None else self._delay(attempt)
            log.warning("%s: %s; retry %d of %d in %.2fs", what, last, attempt, self.max_retries, delay)
            self._sleep(delay)

    def _send(self, url: str, params: dict | None, headers: dict, stream: bool) -> requests.Response:
        """One GET and the redirects it leads to, each hop a request of its own: credentials go
        only to a hop of the portal's own origin, and the guarded session checks each hop's address.
        Every request after the first is counted in ``requests_made``."""
        hops = 0
        while True:
            auth = self._auth if self._auth is not None and same_origin(url, self.origin) else None
            with streamed(stream):
                resp = self.session.get(url, params=params, headers=headers, auth=auth, timeout=self.timeout,
                                        stream=True, allow_redirects=False)
            location = resp.headers.get("Location")
            if resp.status_code not in _REDIRECTS or not location:
                return resp
            resp.close()
            hops += 1
            if hops > MAX_REDIRECTS:
                raise SourceError(f"{self.label}: GET {scrub_url(url)}: more than {MAX_REDIRECTS} redirects")
            url, params = urljoin(resp.url, location.strip()), None
            refuse_scheme(url, getattr(self.session, "purpose", HARVEST))
            self.requests_made += 1

    def _polite(self) -> None:
        if self.politeness_delay and self._last_request is not None:
            wait = self.politeness_delay - (time.monotonic() - self._last_request)
            if wait > 0:
                self._sleep(wait)

    def _delay(self, attempt: int) -> float:
        base = min(self.max_backoff, self.backoff * (2 ** (attempt - 1)))
        return base * (0.5 + random.random() / 2)  # "equal jitter"
