"""HTTP for the sources: one GET with retries, counted requests and bytes, secrets kept out of logs.

5xx, 429 (honouring Retry-After), timeouts and connection errors are retried with jittered
exponential backoff; when the retries are spent, ``SourceUnavailable``. Every other answer (2xx,
304, 4xx) goes back to the caller, which knows what it means for its kind of portal.
"""
from __future__ import annotations

import email.utils
import logging
import random
import re
import time
from datetime import datetime, timezone
from urllib.parse import urlsplit, urlunsplit

import requests
import requests.auth

from harvester.sources.base import SourceUnavailable

log = logging.getLogger(__name__)

USER_AGENT = "harvester (+https://github.com/harvester)"
_USERINFO_RE = re.compile(r"(?<=//)[^/@\s]+@")


def scrub_text(text: str) -> str:
    """Any user:password@ in a text replaced by ***@."""
    return _USERINFO_RE.sub("***@", text)


def scrub_url(url: str) -> str:
    """The URL without user:password (for logs and messages)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return scrub_text(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))


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


def wire_bytes(resp: requests.Response) -> int:
    """The body's size as received (compressed, if it came compressed)."""
    raw = getattr(resp, "raw", None)
    try:
        told = raw.tell() if raw is not None else 0
    except (AttributeError, OSError, ValueError):
        told = 0
    return told if isinstance(told, int) and told > 0 else len(resp.content or b"")


class _BasicAuth(requests.auth.HTTPBasicAuth):
    def __repr__(self) -> str:
        return "<BasicAuth ***>"


class HttpFetcher:
    """GETs for one portal (``label`` names it in messages). ``requests_made`` counts every request
    sent, retries included; ``bytes_received`` every body byte as it came over the wire (a
    streamed body's bytes are added by whoever reads it, with ``add_bytes``)."""

    def __init__(self, label: str, *, timeout: float = 60, max_retries: int = 5, backoff: float = 1.0,
                 max_backoff: float = 60.0, politeness_delay: float = 0.0,
                 basic_auth: tuple[str, str] | None = None, session: requests.Session | None = None, sleep=time.sleep):
        self.label = scrub_url(label)
        self.timeout, self.max_retries, self.backoff, self.max_backoff = timeout, max_retries, backoff, max_backoff
        self.politeness_delay = politeness_delay
        self.session = session or requests.Session()
        self.session.headers.setdefault("User-Agent", USER_AGENT)
        self._auth = _BasicAuth(*basic_auth) if basic_auth else None
        self._sleep = sleep
        self._last_request: float | None = None
        self.requests_made = 0
        self.bytes_received = 0

    def __repr__(self) -> str:
        return f"HttpFetcher({self.label!r})"

    def add_bytes(self, n: int) -> None:
        self.bytes_received += int(n)

    def get(self, url: str, *, headers: dict | None = None, stream: bool = False) -> requests.Response:
        attempt = 0
        while True:
            attempt += 1
            self._polite()
            self.requests_made += 1
            retry_after = status = None
            try:
                resp = self.session.get(url, headers=headers, auth=self._auth, timeout=self.timeout, stream=stream)
            except requests.Timeout as exc:
                last = f"timeout after {self.timeout}s ({type(exc).__name__})"
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
                last = f"connection error ({type(exc).__name__}: {scrub_text(str(exc))[:200]})"
            else:
                status = resp.status_code
                if status != 429 and status < 500:
                    if not stream:
                        self.bytes_received += wire_bytes(resp)
                    return resp
                self.bytes_received += wire_bytes(resp)
                last = f"HTTP {status}"
                if status == 429:
                    retry_after = retry_after_seconds(resp.headers.get("Retry-After"))
                resp.close()
            finally:
                self._last_request = time.monotonic()
            if attempt > self.max_retries:
                raise SourceUnavailable(f"{self.label}: GET {scrub_url(url)} failed after {attempt} attempts "
                                        f"(last: {last})")
            delay = min(self.max_backoff, retry_after) if retry_after is not None else self._delay(attempt)
            log.warning("%s: GET %s: %s; retry %d of %d in %.2fs", self.label, scrub_url(url), last, attempt,
                        self.max_retries, delay)
            self._sleep(delay)

    def _polite(self) -> None:
        if self.politeness_delay and self._last_request is not None:
            wait = self.politeness_delay - (time.monotonic() - self._last_request)
            if wait > 0:
                self._sleep(wait)

    def _delay(self, attempt: int) -> float:
        base = min(self.max_backoff, self.backoff * (2 ** (attempt - 1)))
        return base * (0.5 + random.random() / 2)  # "equal jitter"
