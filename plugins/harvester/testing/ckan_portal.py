"""A small CKAN Action API server over real CKAN package dicts, for the demo and for tests.

It speaks CKAN's wire format (``/api/3/action/<action>``, the ``help``/``success``/``result``
envelope, CKAN's error bodies and status codes) and emulates the parts of Solr that a harvester
relies on: ``fq`` with date ranges (``[`` / ``{`` bounds, ``NOW`` and date math, millisecond
precision like Solr's date fields), ``field:value`` terms, ``AND``/``OR``/``NOT``; ``sort`` on
several keys; ``rows`` (default 10, capped at 1000) and ``start``; ``fl`` (only the fields asked
for, dates written as Solr writes them).

Error answers follow CKAN's ``ckan/views/api.py``:

* a filter Solr cannot parse (or an invalid date) is a ``SearchError``: HTTP 409,
  ``{"__type": "Search Error", "message": "Search error: ..."}``;
* an invalid ``sort`` or unknown search parameter is a ``SearchQueryError``: HTTP 400,
  ``{"__type": "Search Query Error", "message": "Search Query is invalid: ..."}``;
* bad ``rows``/``start`` are a ``ValidationError``: HTTP 409 with the field errors;
* unknown ids: HTTP 404 ``Not Found Error``; unknown actions and undecodable JSON: HTTP 400 with a
  bare JSON string body (no envelope), exactly like CKAN.

Python API (tests)::

    with DemoPortal(files=[path]) as portal:
        client = CkanClient(portal.base_url)
        portal.fail_next(2, status=503)
        portal.upsert_record({...})

CLI (demo)::

    python -m harvester.testing.ckan_portal --data FILE [--data FILE ...] [--host 127.0.0.1] [--port 8765]
"""
from __future__ import annotations

import argparse
import bisect
import calendar
import fnmatch
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs, urlsplit

from harvester.domain.dataset import parse_timestamp
from harvester.testing.local_http import dumps

log = logging.getLogger(__name__)

CKAN_VERSION = "2.10.4"
ROWS_MAX = 1000  # ckan.search.rows_max default
DEFAULT_SORT = "score desc, metadata_modified desc"
DATE_FIELDS = frozenset({"metadata_modified", "metadata_created"})
NUMERIC_FIELDS = frozenset({"num_resources", "num_tags"})
TEXT_FIELDS = frozenset({"text", "title", "notes", "res_name", "res_description", "author", "maintainer"})
# ckan.lib.search.query.VALID_SOLR_PARAMETERS plus what package_search itself consumes
VALID_SEARCH_PARAMS = frozenset({
    "q", "fl", "fq", "rows", "sort", "start", "wt", "qf", "bf", "boost", "facet", "facet.mincount",
    "facet.limit", "facet.field", "extras", "fq_list", "tie", "defType", "mm", "df",
    "include_private", "include_drafts", "include_deleted", "use_default_schema", "callback",
})
JSON_TYPE = "application/json;charset=utf-8"
HTML_TYPE = "text/html;charset=utf-8"
_UNSET: Any = object()
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)

_NGINX_429 = (
    "<html>\r\n<head><title>429 Too Many Requests</title></head>\r\n<body>\r\n"
    "<center><h1>429 Too Many Requests</h1></center>\r\n<hr><center>nginx</center>\r\n"
    "</body>\r\n</html>\r\n"
)


def samples_dir() -> Path:
    """$HARVESTER_SAMPLES_DIR, else ``<repo>/../shared/ckan-samples``."""
    env = os.environ.get("HARVESTER_SAMPLES_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3].parent / "shared" / "ckan-samples"


def load_jsonl(path: str | os.PathLike) -> list[dict]:
    """One CKAN package dict per line (blank lines skipped)."""
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                records.append(json.loads(line))
    return records


# -- timestamps ---------------------------------------------------------------------------------
def record_ms(value: Any) -> int | None:
    """A record's timestamp (CKAN: UTC without zone; DKAN: '2019-09-30 22:00:00') as epoch
    milliseconds, truncated like Solr's date fields. None when missing or unparseable. (Parsed as
    the harvester parses it: domain.dataset.parse_timestamp.)"""
    dt = parse_timestamp(value)
    return None if dt is None else (dt - _EPOCH) // _MS


_SOLR_DATE_RE = re.compile(r"(\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z")
_DATE_MATH_RE = re.compile(r"([+-])(\d+)([A-Z]+)|/([A-Z]+)")
_UNITS = {
    "YEAR": "year", "YEARS": "year", "MONTH": "month", "MONTHS": "month", "DAY": "day", "DAYS": "day",
    "DATE": "day", "HOUR": "hour", "HOURS": "hour", "MINUTE": "minute", "MINUTES": "minute",
    "SECOND": "second", "SECONDS": "second", "MILLI": "ms", "MILLIS": "ms", "MILLISECOND": "ms",
    "MILLISECONDS": "ms",
}


class SolrError(Exception):
    """What Solr answers with HTTP 400 (pysolr.SolrError in CKAN)."""


def _add_months(dt: datetime, months: int) -> datetime:
    month0 = dt.month - 1 + months
    year, month = dt.year + month0 // 12, month0 % 12 + 1
    return dt.replace(year=year, month=month, day=min(dt.day, calendar.monthrange(year, month)[1]))


def parse_solr_date(text: str, now: datetime | None = None) -> int:
    """Solr date syntax (``2013-06-17T11:50:00Z``, ``.123Z`` fractions, ``NOW``, date math such as
    ``NOW-1DAY`` or ``NOW/DAY``) to epoch milliseconds (fractions truncated to ms, like Solr)."""
    if text.startswith("NOW"):
        dt = now or datetime.now(timezone.utc)
        rest = text[3:]
    else:
        m = _SOLR_DATE_RE.match(text)
        if not m:
            raise SolrError(f"Invalid Date String:'{text}'")
        y, mo, d, h, mi, s, frac = m.groups()
        try:
            dt = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=timezone.utc)
        except ValueError:
            raise SolrError(f"Invalid Date String:'{text}'") from None
        if frac:
            dt += timedelta(microseconds=int((frac + "000000")[:6]))
        rest = text[m.end():]
    pos = 0
    while pos < len(rest):
        m = _DATE_MATH_RE.match(rest, pos)
        unit = m and _UNITS.get(m.group(3) or m.group(4))
        if not unit:
            raise SolrError(f"Invalid Date Math String:'{text}'")
        if m.group(4):  # rounding: /DAY etc.
            fields = ["year", "month", "day", "hour", "minute", "second", "ms"]
            keep = fields.index(unit)
            parts = {"month": 1, "day": 1, "hour": 0, "minute": 0, "second": 0}
            for f in fields[keep + 1:]:
                if f == "ms":
                    dt = dt.replace(microsecond=0)
                else:
                    dt = dt.replace(**{f: parts[f]})
            if unit == "ms":
                dt = dt.replace(microsecond=dt.microsecond // 1000 * 1000)
        else:
            n = int(m.group(2)) * (1 if m.group(1) == "+" else -1)
            if unit in ("year", "month"):
                dt = _add_months(dt, n * (12 if unit == "year" else 1))
            else:
                dt += {"day": timedelta(days=n), "hour": timedelta(hours=n), "minute": timedelta(minutes=n),
                       "second": timedelta(seconds=n), "ms": timedelta(milliseconds=n)}[unit]
        pos = m.end()
    return (dt - _EPOCH) // _MS


# -- records ------------------------------------------------------------------------------------
@dataclass
class _Entry:
    record: dict
    json: str
    mm: int | None
    mc: int | None
    seq: int


def _field_values(rec: dict, field: str) -> list[Any]:
    """The values Solr would index for ``field`` of a CKAN package dict."""
    if field == "tags":
        return [t.get("name") if isinstance(t, dict) else t for t in rec.get("tags") or []]
    if field == "groups":
        return [g.get("name") if isinstance(g, dict) else g for g in rec.get("groups") or []]
    if field == "organization":
        org = rec.get("organization")
        return [org.get("name")] if isinstance(org, dict) else ([org] if org else [])
    if field == "capacity":
        return ["private" if rec.get("private") else "public"]
    if field.startswith("res_"):
        key = {"res_format": "format", "res_name": "name", "res_url": "url",
               "res_description": "description", "res_type": "resource_type"}.get(field, field[4:])
        return [r.get(key) for r in rec.get("resources") or [] if isinstance(r, dict) and r.get(key) is not None]
    if field.startswith("extras_"):
        key = field[len("extras_"):]
        extras = rec.get("extras") or []
        if isinstance(extras, dict):
            return [extras[key]] if key in extras else []
        return [e.get("value") for e in extras if isinstance(e, dict) and e.get("key") == key]
    if field == "text":
        return [_text_of(rec)]
    value = rec.get(field)
    if value is None:
        return []
    if isinstance(value, list):
        return [v for v in value if v is not None and not isinstance(v, (dict, list))]
    if isinstance(value, dict):
        return []
    return [value]


def _text_of(rec: dict) -> str:
    parts = [rec.get("name"), rec.get("title"), rec.get("notes")]
    parts += _field_values(rec, "tags") + _field_values(rec, "groups")
    org = rec.get("organization")
    if isinstance(org, dict):
        parts += [org.get("name"), org.get("title")]
    for r in rec.get("resources") or []:
        if isinstance(r, dict):
            parts += [r.get("name"), r.get("description")]
    return " ".join(str(p) for p in parts if p).lower()


def _solr_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# -- the Solr query subset ----------------------------------------------------------------------
class _Node:
    def match(self, e: _Entry) -> bool:  # pragma: no cover - interface
        raise NotImplementedError


class _All(_Node):
    def match(self, e):
        return True


class _Not(_Node):
    def __init__(self, inner):
        self.inner = inner

    def match(self, e):
        return not self.inner.match(e)


class _And(_Node):
    def __init__(self, parts):
        self.parts = parts

    def match(self, e):
        return all(p.match(e) for p in self.parts)


class _Or(_Node):
    def __init__(self, parts):
        self.parts = parts

    def match(self, e):
        return any(p.match(e) for p in self.parts)


class _Term(_Node):
    def __init__(self, field: str, value: str, phrase: bool):
        self.field, self.value, self.phrase = field, value, phrase
        self.wild = not phrase and ("*" in value or "?" in value)
        self.ms = None
        if field in DATE_FIELDS and not (self.wild and value == "*"):
            self.ms = parse_solr_date(value)

    def match(self, e):
        if self.field in DATE_FIELDS:
            got = e.mm if self.field == "metadata_modified" else e.mc
            return got is not None if self.value == "*" and not self.phrase else got == self.ms
        values = _field_values(e.record, self.field)
        if self.field in TEXT_FIELDS:
            needle = self.value.lower()
            if self.wild:
                return any(fnmatch.fnmatchcase(w, needle) for v in values for w in str(v).lower().split())
            return any(needle in str(v).lower() for v in values)
        if self.wild:
            if self.value == "*":
                return bool(values)
            return any(fnmatch.fnmatchcase(_solr_str(v), self.value) for v in values)
        return any(_solr_str(v) == self.value for v in values)


class _Range(_Node):
    def __init__(self, field, lo, hi, lo_incl, hi_incl):
        self.field, self.lo_incl, self.hi_incl = field, lo_incl, hi_incl
        if field in DATE_FIELDS:
            conv: Callable[[str], Any] = parse_solr_date
        elif field in NUMERIC_FIELDS:
            def conv(v):
                try:
                    return float(v)
                except ValueError:
                    raise SolrError(f"Invalid Number: {v}") from None
        else:
            conv = str
        self.lo = None if lo is None else conv(lo)
        self.hi = None if hi is None else conv(hi)

    def bounds_ok(self, v) -> bool:
        if self.lo is not None and (v < self.lo or (v == self.lo and not self.lo_incl)):
            return False
        if self.hi is not None and (v > self.hi or (v == self.hi and not self.hi_incl)):
            return False
        return True

    def match(self, e):
        if self.field in DATE_FIELDS:
            v = e.mm if self.field == "metadata_modified" else e.mc
            return v is not None and self.bounds_ok(v)
        for v in _field_values(e.record, self.field):
            try:
                v = float(v) if self.field in NUMERIC_FIELDS else _solr_str(v)
            except (TypeError, ValueError):
                continue
            if self.bounds_ok(v):
                return True
        return False


_SPECIAL = set(' \t\r\n\u3000+-!():^[]"{}~\\/')


class _Parser:
    """Recursive descent over Solr's standard query syntax (the subset CKAN clients use)."""

    def __init__(self, text: str, default_field: str = "text"):
        self.s, self.i, self.default_field = text, 0, default_field

    def fail(self, what: str):
        raise SolrError(f"org.apache.solr.search.SyntaxError: Cannot parse '{self.s}': {what}")

    def ws(self):
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def peek_word(self, *words) -> str | None:
        self.ws()
        for w in words:
            end = self.i + len(w)
            if self.s.startswith(w, self.i) and (w in ("&&", "||", "!") or end == len(self.s)
                                                 or self.s[end].isspace() or self.s[end] == "("):
                return w
        return None

    def parse(self) -> _Node:
        self.ws()
        if self.i == len(self.s):
            return _All()
        node = self.or_expr(self.default_field)
        self.ws()
        if self.i < len(self.s):
            self.fail(f'Encountered "{self.s[self.i]}" at column {self.i}.')
        return node

    def or_expr(self, field):
        parts = [self.and_expr(field)]
        while (w := self.peek_word("OR", "||")):
            self.i += len(w)
            parts.append(self.and_expr(field))
        return parts[0] if len(parts) == 1 else _Or(parts)

    def and_expr(self, field):
        parts = [self.unary(field)]
        while True:
            w = self.peek_word("AND", "&&")
            if w:
                self.i += len(w)
                parts.append(self.unary(field))
                continue
            self.ws()
            if self.i >= len(self.s) or self.s[self.i] == ")" or self.peek_word("OR", "||"):
                break
            parts.append(self.unary(field))  # implicit AND (CKAN sends q.op=AND)
        return parts[0] if len(parts) == 1 else _And(parts)

    def unary(self, field):
        self.ws()
        w = self.peek_word("NOT", "!")
        if w:
            self.i += len(w)
            return _Not(self.unary(field))
        if self.i < len(self.s) and self.s[self.i] in "+-":
            op = self.s[self.i]
            self.i += 1
            inner = self.primary(field)
            return _Not(inner) if op == "-" else inner
        return self.primary(field)

    def primary(self, field):
        """A clause: ``*:*``, ``field:value``, or a value of the default field."""
        c = self._peek()
        if c not in '([{"' and self.s.startswith("*:*", self.i):
            self.i += 3
            return _All()
        if c in '([{"':
            return self._structured(field, c)
        term = self.term()
        if self.i < len(self.s) and self.s[self.i] == ":":
            self.i += 1
            return self.value(term)
        return _Term(field, term, False)

    def value(self, field):
        """What follows ``field:``: a group, a phrase, a range or a term."""
        c = self._peek()
        if c in '([{"':
            return self._structured(field, c)
        return _Term(field, self.term(), False)

    def _peek(self) -> str:
        self.ws()
        if self.i >= len(self.s):
            self.fail('Encountered "<EOF>".')
        return self.s[self.i]

    def _structured(self, field, c):
        """A parenthesised group, a quoted phrase or a range, for ``field``."""
        if c == "(":
            self.i += 1
            node = self.or_expr(field)
            self.ws()
            if self.i >= len(self.s) or self.s[self.i] != ")":
                self.fail('Encountered "<EOF>", was expecting ")".')
            self.i += 1
            return node
        if c == '"':
            return _Term(field, self.phrase(), True)
        return self.range(field)

    def term(self) -> str:
        out = []
        start = self.i
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\" and self.i + 1 < len(self.s):
                out.append(self.s[self.i + 1])
                self.i += 2
                continue
            if c == ":" or c.isspace() or (c in _SPECIAL and not (c in "+-" and self.i > start)):
                break
            out.append(c)
            self.i += 1
        if not out:
            shown = "<EOF>" if self.i >= len(self.s) else self.s[self.i]
            self.fail(f'Encountered "{shown}" at column {self.i}.')
        return "".join(out)

    def phrase(self) -> str:
        self.i += 1
        out = []
        while self.i < len(self.s) and self.s[self.i] != '"':
            if self.s[self.i] == "\\" and self.i + 1 < len(self.s):
                self.i += 1
            out.append(self.s[self.i])
            self.i += 1
        if self.i >= len(self.s):
            self.fail("Lexical error: unterminated quoted string.")
        self.i += 1
        return "".join(out)

    def range_end(self) -> str | None:
        self.ws()
        if self.i < len(self.s) and self.s[self.i] == '"':
            return self.phrase()
        start = self.i
        while self.i < len(self.s) and not self.s[self.i].isspace() and self.s[self.i] not in "]}":
            self.i += 1
        goop = self.s[start:self.i]
        if not goop:
            self.fail(f"Encountered an empty range bound at column {start}.")
        return None if goop == "*" else goop

    def range(self, field):
        lo_incl = self.s[self.i] == "["
        self.i += 1
        lo = self.range_end()
        self.ws()
        if not self.s.startswith("TO", self.i):
            self.fail(f'Encountered "{self.s[self.i:self.i + 1] or "<EOF>"}", was expecting "TO".')
        self.i += 2
        hi = self.range_end()
        self.ws()
        if self.i >= len(self.s) or self.s[self.i] not in "]}":
            self.fail('Encountered "<EOF>", was expecting "]" or "}".')
        hi_incl = self.s[self.i] == "]"
        self.i += 1
        return _Range(field, lo, hi, lo_incl, hi_incl)


def parse_query(text: str, default_field: str = "text") -> _Node:
    return _Parser(text, default_field).parse()


def _free_text(q: str) -> _Node:
    words = [w.lower() for w in q.split() if w.strip()]
    return _And([_Term("text", w, True) for w in words]) if words else _All()


# -- sorting -------------------------------------------------------------------------------------
class _SortSpecError(Exception):
    pass


def _parse_sort(sort: str) -> list[tuple[str, bool]]:
    """'metadata_modified asc, id asc' -> [(field, descending)]; Solr's own errors otherwise."""
    keys = []
    for part in sort.split(","):
        part = part.strip()
        if not part:
            continue
        bits = part.split()
        if len(bits) != 2 or bits[1].lower() not in ("asc", "desc"):
            raise _SortSpecError(f"Can't determine a Sort Order (asc or desc) in sort spec '{part}'")
        keys.append((bits[0], bits[1].lower() == "desc"))
    return keys


def _sort_value(e: _Entry, field: str):
    if field == "metadata_modified":
        return e.mm
    if field == "metadata_created":
        return e.mc
    if field == "score":
        return 0
    if field == "title_string":
        field = "title"
    value = e.record.get(field)
    if isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return int(value)
    if field in NUMERIC_FIELDS and value is not None:
        try:
            return float(value)
        except (TypeError, ValueError):
            return None
    return value if isinstance(value, (int, float)) else (None if value is None else str(value))


def _sorted(entries: list[_Entry], keys: list[tuple[str, bool]]) -> list[_Entry]:
    out = sorted(entries, key=lambda e: e.seq)  # Solr's final tie-break: index order
    for field, desc in reversed(keys):
        present = [e for e in out if _sort_value(e, field) is not None]
        missing = [e for e in out if _sort_value(e, field) is None]  # sortMissingLast
        try:
            present.sort(key=lambda e: _sort_value(e, field), reverse=desc)
        except TypeError:  # mixed types: compare as strings
            present.sort(key=lambda e: str(_sort_value(e, field)), reverse=desc)
        out = present + missing
    return out


# -- the portal ----------------------------------------------------------------------------------
class ActionError(Exception):
    """An action's failure: the HTTP status and body (a dict for the envelope's ``error``, or a
    bare string body for CKAN's "Bad request" answers)."""

    def __init__(self, status: int, error: dict | None = None, bare: str | None = None):
        super().__init__(status, error, bare)
        self.status, self.error, self.bare = status, error, bare


def _truthy(v: Any) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


class ServedPortal:
    """What the local CKAN portals share (DemoPortal, scale_portal.ScalePortal): a threaded server on
    ``host``:``port`` (0: a free one) answering with a subclass of ``_handler_base()`` that knows this
    portal, in a daemon thread between ``start()`` and ``stop()``, or as a context manager."""

    thread_name = "ckan-portal"
    _server: "_Server | None" = None
    _thread: threading.Thread | None = None

    def _handler_base(self) -> type:  # pragma: no cover - subclasses give theirs
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        if not self._server:
            raise RuntimeError(f"the {self.thread_name} is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> str:
        if self._server:
            return self.base_url
        handler = type("Handler", (self._handler_base(),), {"portal": self})
        self._server = _Server((self.host, self.port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=self.thread_name, daemon=True)
        self._thread.start()
        return self.base_url

    def stop(self) -> None:
        server, self._server = self._server, None
        if server:
            server.shutdown()
            server.server_close()
        if self._thread:
            self._thread.join(5)
            self._thread = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class DemoPortal(ServedPortal):
    """A CKAN portal on 127.0.0.1 serving the given package dicts.

    Records may be given as dicts and/or JSONL files; later ids replace earlier ones. Everything
    below may be changed while the server runs (thread-safe):

    * ``set_records`` / ``upsert_record`` / ``remove_record``: the catalogue;
    * ``fail_next(n, status=500, retry_after=..., action=None, body=None)``: the next ``n`` API
      requests fail (500/503: the real catalog.data.gov HTML error page; 429: nginx's page and a
      ``Retry-After`` header, 1 s unless given; any other status, 200 included, a small HTML page,
      as proxies answer; ``body`` (a str, or a dict sent as JSON) instead of the page);
      ``clear_faults()`` undoes all of these;
    * ``reject_fq = True``: every ``package_search`` with an ``fq`` answers like CKAN when Solr
      refuses the filter (HTTP 409 ``Search Error``);
    * ``ignore_fl = True``: ``package_search`` answers with whole records even when ``fl`` asks for
      some fields (as portals whose search extension drops ``fl`` do);
    * ``ignore_fq = True``: ``package_search`` answers as if no ``fq`` was given;
    * ``fail_actions = {"package_search"}`` (or ``{"package_search": 503}``, or ``{"*"}``): a
      total outage of those actions (status 500 unless given);
    * ``response_delay``: seconds to wait before answering (for client timeouts);
    * ``on_request``: a callable(action, params) run before each API request is answered.

    ``requests`` lists ``(action, params)`` of every API request received (failed ones too);
    ``request_headers`` the matching request headers.

    ``hide_inactive=False`` serves every record as given (the samples include ``deleted`` and
    ``draft`` ones, as recorded). With ``True`` it emulates CKAN's default visibility: searches
    and ``package_list`` only see ``state=active``, non-private datasets unless
    ``include_deleted``/``include_drafts`` is passed, and ``package_show`` of anything else
    answers 403 like it does for an anonymous user.

    ``api_tokens``: the CKAN API tokens of an account that may read the private records
    (``"private": true``). Once any are set (or with ``hide_inactive``), private records are
    hidden like CKAN hides them: ``package_search`` lists them only with ``include_private=true``
    and one of these tokens as the ``Authorization`` header, ``package_show`` answers 403 for
    them without such a token, and ``package_list`` never lists them.
    """

    def __init__(self, records: Iterable[dict] | None = None, files: Iterable[str | os.PathLike] = (),
                 *, host: str = "127.0.0.1", port: int = 0, hide_inactive: bool = False,
                 ckan_version: str = CKAN_VERSION, error_page: str | os.PathLike | None = None,
                 site_title: str = "Harvester demo portal"):
        self.host, self.port = host, port
        self.hide_inactive = hide_inactive
        self.ckan_version = ckan_version
        self.site_title = site_title
        self._error_page_path = Path(error_page) if error_page else samples_dir() / "errors" / "http-500-html.html"
        self._error_page: str | None = None
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}
        self._seq = 0
        self._version = 0
        self._sort_cache: dict[tuple, tuple[int, list[_Entry], list[int] | None]] = {}
        self._fail_queue: list[list] = []  # [remaining, {"status", "retry_after", "action"}]
        self.reject_fq = False
        self.ignore_fl = False
        self.ignore_fq = False
        self.rows_max = ROWS_MAX   # ckan.search.rows_max: a portal may set it lower than the client asks
        self.omit_count = False    # package_search answers without "count" (not CKAN's own answer)
        self.fail_actions: set[str] | dict[str, int] = set()
        self.response_delay = 0.0
        self.api_tokens: set[str] = set()
        self.on_request: Callable[[str, dict], None] | None = None
        self.requests: list[tuple[str, dict]] = []
        self.request_headers: list[dict[str, str]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        all_records: list[dict] = list(records or [])
        for f in files:
            all_records.extend(load_jsonl(f))
        self.set_records(all_records)

    # catalogue ---------------------------------------------------------------------------------
    def _entry(self, rec: dict) -> _Entry:
        if not isinstance(rec, dict):
            raise TypeError(f"a CKAN package dict, not {type(rec).__name__}")
        self._seq += 1
        return _Entry(rec, dumps(rec), record_ms(rec.get("metadata_modified")),
                      record_ms(rec.get("metadata_created")), self._seq)

    def _put(self, rec: dict) -> None:
        entry = self._entry(rec)
        # a record without an id (a broken portal) is kept under a key of its own
        key = rec.get("id") or f"\0no-id-{entry.seq}"
        self._entries.pop(key, None)
        self._entries[key] = entry

    def set_records(self, records: Iterable[dict]) -> None:
        with self._lock:
            self._entries = {}
            for rec in records:
                self._put(rec)
            self._version += 1
            self._sort_cache.clear()

    def upsert_record(self, record: dict) -> None:
        """Add or replace a package (re-indexed, like Solr after an update)."""
        with self._lock:
            self._put(record)
            self._version += 1
            self._sort_cache.clear()

    def remove_record(self, id_: str) -> bool:
        with self._lock:
            gone = self._entries.pop(id_, None) is not None
            self._version += 1
            self._sort_cache.clear()
            return gone

    @property
    def records(self) -> list[dict]:
        with self._lock:
            return [e.record for e in sorted(self._entries.values(), key=lambda e: e.seq)]

    # faults ------------------------------------------------------------------------------------
    def fail_next(self, n: int = 1, status: int = 500, *, retry_after: int | str | None = _UNSET,
                  action: str | None = None, body: str | dict | None = None) -> None:
        """The next ``n`` API requests (to ``action`` only, if given) answer ``status``, with an
        HTML page unless ``body`` is given (a str is sent as it is, as text/html if it starts with
        ``<``, else as JSON, broken or not; a dict as JSON).

        429 answers carry ``Retry-After: <retry_after>`` (default 1; None for no header); other
        statuses only when ``retry_after`` is given (e.g. a 503 with Retry-After)."""
        if retry_after is _UNSET:
            retry_after = 1 if status == 429 else None
        with self._lock:
            self._fail_queue.append([n, {"status": status, "retry_after": retry_after, "action": action,
                                         "body": body}])

    def clear_faults(self) -> None:
        with self._lock:
            self._fail_queue = []
            self.reject_fq = False
            self.ignore_fl = False
            self.ignore_fq = False
            self.rows_max, self.omit_count = ROWS_MAX, False
            self.fail_actions = set()
            self.response_delay = 0.0

    def _take_failure(self, action: str) -> dict | None:
        with self._lock:
            for item in self._fail_queue:
                if item[0] > 0 and item[1]["action"] in (None, action):
                    item[0] -= 1
                    spec = item[1]
                    self._fail_queue = [i for i in self._fail_queue if i[0] > 0]
                    return spec
            fa = self.fail_actions
            if fa and (action in fa or "*" in fa):
                status = fa.get(action, fa.get("*", 500)) if isinstance(fa, dict) else 500
                return {"status": status, "retry_after": 1 if status == 429 else None, "action": action}
        return None

    def error_page(self) -> str:
        if self._error_page is None:
            try:
                self._error_page = self._error_page_path.read_text(encoding="utf-8")
            except OSError:
                log.warning("error page %s not found; serving a minimal one", self._error_page_path)
                self._error_page = ("<!DOCTYPE html>\n<html><head><title>Error</title></head>"
                                    "<body><h1>Internal Server Error</h1></body></html>\n")
        return self._error_page

    # server ------------------------------------------------------------------------------------
    thread_name = "demo portal"

    def _handler_base(self) -> type:
        return _Handler

    def start(self) -> str:
        running = self._server is not None
        url = super().start()
        if not running:
            log.info("demo portal serving %d records at %s", len(self._entries), url)
        return url

    def serve_forever(self) -> None:
        """Run in the calling thread (the CLI)."""
        self.start()
        assert self._thread
        try:
            while self._thread.is_alive():
                self._thread.join(0.5)
        finally:
            self.stop()

    # actions -----------------------------------------------------------------------------------
    def authorized(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header is the token of the account that reads private records."""
        with self._lock:
            return bool(authorization) and authorization in self.api_tokens

    def _filters(self) -> bool:
        """Whether searches must check each record's visibility."""
        return self.hide_inactive or bool(self.api_tokens)

    def _visible(self, e: _Entry, params: dict, authorized: bool = False, *, show: bool = False) -> bool:
        rec = e.record
        if rec.get("private") and self._filters():
            # CKAN: private datasets only for an authorised user, and in searches only when asked
            if not authorized or not (show or _truthy(params.get("include_private", False))):
                return False
        if not self.hide_inactive:
            return True
        state = str(rec.get("state") or "active").lower()
        if state == "active":
            return True
        if state.startswith("draft"):
            return _truthy(params.get("include_drafts", False))
        if state == "deleted":
            return _truthy(params.get("include_deleted", False))
        return False

    def _sorted_view(self, keys: list[tuple[str, bool]]) -> tuple[list[_Entry], list[int] | None]:
        """The catalogue in sort order (cached per sort spec and catalogue version), plus the
        ms keys of its dated prefix when the primary key is ``metadata_modified asc`` (records
        without one sort last), for bisecting date ranges."""
        ck = tuple(keys)
        with self._lock:
            cached = self._sort_cache.get(ck)
            if cached and cached[0] == self._version:
                return cached[1], cached[2]
            version, entries = self._version, list(self._entries.values())
        view = _sorted(entries, keys)
        dated = None
        if keys and keys[0] == ("metadata_modified", False):
            dated = [e.mm for e in view if e.mm is not None]
        with self._lock:
            if version == self._version:
                self._sort_cache[ck] = (version, view, dated)
        return view, dated

    def package_search(self, params: dict, authorized: bool = False) -> str:
        bad = sorted(k for k in params if k not in VALID_SEARCH_PARAMS and not k.startswith("ext_"))
        if bad:
            raise _search_query_error(f"Invalid search parameters: {bad}")
        rows = _natural(params, "rows", 10)
        start = _natural(params, "start", 0)
        rows = min(rows, self.rows_max)
        q = str(params.get("q") or "").strip()
        fq = params.get("fq")
        fq = "" if fq is None or self.ignore_fq else str(fq)
        sort = params.get("sort")
        sort = DEFAULT_SORT if sort in (None, "rank") else str(sort)
        solr_query = {
            "q": q if q and q not in ('""', "''") else "*:*", "fq": [fq, '+site_id:"default"', "+state:active"],
            "rows": rows + 1, "sort": sort, "start": start, "facet": "true", "facet.limit": "50",
            "facet.mincount": 1, "fl": "id validated_data_dict", "wt": "json", "df": "text", "q.op": "AND",
        }
        try:
            keys = _parse_sort(sort)
        except _SortSpecError:
            raise _search_query_error('Invalid "sort" parameter') from None
        try:
            if self.reject_fq and fq.strip():
                raise SolrError("undefined field metadata_modified")
            fq_node = parse_query(fq)
            if not q or q in ("*:*", '""', "''"):
                q_node: _Node = _All()
            elif ":" in q:
                q_node = parse_query(q)
            else:
                q_node = _free_text(q)
        except SolrError as exc:
            # ckan.lib.search.query: SearchError('SOLR returned an error running query: %r Error: %r')
            solr_exc = SolrError(f"Solr responded with an error (HTTP 400): [Reason: {exc}]")
            msg = "SOLR returned an error running query: %r Error: %r" % (solr_query, solr_exc)
            raise ActionError(409, {"__type": "Search Error", "message": "Search error: %r" % (msg,)}) from None

        view, dated = self._sorted_view(keys)
        candidates: list[_Entry] = view
        node = fq_node if isinstance(q_node, _All) else _And([q_node, fq_node])
        ids = _id_terms(node)
        if ids is not None:
            # fast path for fetching records by id: look them up instead of scanning the catalogue
            with self._lock:
                found = {id(e) for e in (self._entries.get(x) for x in ids) if e is not None}
            candidates = [e for e in view if id(e) in found]
            node = _All()
        if isinstance(node, _Range) and node.field == "metadata_modified" and dated is not None:
            # fast path for keyset paging: bisect the ascending metadata_modified order
            lo = 0 if node.lo is None else (bisect.bisect_left(dated, node.lo) if node.lo_incl
                                            else bisect.bisect_right(dated, node.lo))
            hi = len(dated) if node.hi is None else (bisect.bisect_right(dated, node.hi) if node.hi_incl
                                                     else bisect.bisect_left(dated, node.hi))
            candidates = view[lo:max(lo, hi)]
            node = _All()
        if isinstance(node, _All) and not self._filters():
            matched = candidates
        else:
            matched = [e for e in candidates if self._visible(e, params, authorized) and node.match(e)]
        page = matched[start:start + rows]
        fields = _fl_fields(params.get("fl"))
        if fields and not self.ignore_fl:
            results = ", ".join(json.dumps(_solr_doc(e, fields)) for e in page)
        else:
            results = ", ".join(e.json for e in page)
        if self.omit_count:
            return '{"sort": %s, "facets": {}, "results": [%s], "search_facets": {}}' % (json.dumps(sort), results)
        return ('{"count": %d, "sort": %s, "facets": {}, "results": [%s], "search_facets": {}}'
                % (len(matched), json.dumps(sort), results))

    def _find(self, id_or_name: str) -> _Entry | None:
        with self._lock:
            e = self._entries.get(id_or_name)
            if e is None:
                named = [x for x in self._entries.values() if x.record.get("name") == id_or_name]
                if named:
                    e = max(named, key=lambda x: (x.mm or 0, x.seq))
            return e

    def package_show(self, params: dict, authorized: bool = False) -> str:
        id_or_name = params.get("id") or params.get("name_or_id")
        if not id_or_name:
            raise ActionError(409, {"name_or_id": ["Missing value"], "__type": "Validation Error"})
        e = self._find(str(id_or_name))
        if e is None:
            raise ActionError(404, {"__type": "Not Found Error", "message": "Not found"})
        if self._filters() and not self._visible(e, {}, authorized, show=True):
            raise ActionError(403, {"__type": "Authorization Error",
                                    "message": f"Access denied: User  not authorized to read package {e.record.get('id')}"})
        return e.json

    def package_list(self, params: dict, authorized: bool = False) -> str:
        limit = params.get("limit")
        offset = _natural(params, "offset", 0)
        with self._lock:
            names = sorted(str(e.record.get("name") or e.record.get("id")) for e in self._entries.values()
                           if self._visible(e, {}))
        if limit not in (None, ""):
            names = names[offset:offset + _natural(params, "limit", 0)]
        elif offset:
            names = names[offset:]
        return json.dumps(names)

    # Set by whoever started this portal (the demo) to tell it from another server on the same port.
    nonce: str | None = None

    def status_show(self, params: dict, authorized: bool = False) -> str:
        return json.dumps({
            "site_title": self.site_title, "site_description": "Real CKAN records served locally",
            "site_url": self.base_url, "ckan_version": self.ckan_version, "error_emails_to": None,
            "locale_default": "en", "extensions": ["demo_portal"],
            **({"demo_portal_nonce": self.nonce} if self.nonce else {}),
        })

    ACTIONS = ("package_search", "package_show", "package_list", "status_show")


def _fl_fields(fl: Any) -> list[str] | None:
    """``fl`` as Solr reads it (comma- or space-separated); None for none or ``*`` (whole records)."""
    if fl is None:
        return None
    text = " ".join(fl) if isinstance(fl, list) else str(fl)
    fields = [f for f in re.split(r"[\s,]+", text) if f]
    return None if not fields or "*" in fields else fields


def _solr_date_text(ms: int) -> str:
    """Epoch milliseconds as Solr writes a date (Java's Instant: ``...:05Z``, ``...:05.300Z``)."""
    dt = _EPOCH + timedelta(milliseconds=ms)
    frac = f".{dt.microsecond // 1000:03d}" if dt.microsecond else ""
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"


def _solr_doc(e: _Entry, fields: list[str]) -> Any:
    """A record as Solr returns it for ``fl``: only those stored fields, dates in Solr's format.
    Like CKAN, ``fl=id`` (or ``name``) alone gives a bare value instead of a dict."""
    doc: dict[str, Any] = {}
    for field in fields:
        if field in DATE_FIELDS:
            ms = e.mm if field == "metadata_modified" else e.mc
            if ms is not None:
                doc[field] = _solr_date_text(ms)
        elif field in e.record and not isinstance(e.record[field], (dict, list)):
            doc[field] = e.record[field]
    if fields in (["id"], ["name"]):
        return doc.get(fields[0])
    return doc


def _id_terms(node: _Node) -> list[str] | None:
    """The ids of an ``id:(...)`` filter made only of exact id terms, else None."""
    terms = node.parts if isinstance(node, _Or) else [node]
    if all(isinstance(t, _Term) and t.field == "id" and not t.wild for t in terms):
        return [t.value for t in terms]
    return None


def _natural(params: dict, key: str, default: int) -> int:
    raw = params.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ActionError(409, {key: ["Invalid integer"], "__type": "Validation Error"}) from None
    if value < 0:
        raise ActionError(409, {key: ["Must be a natural number"], "__type": "Validation Error"})
    return value


def _search_query_error(message: str) -> ActionError:
    # ckan/views/api.py: u'Search Query is invalid: %r' % e.args
    return ActionError(400, {"__type": "Search Query Error", "message": "Search Query is invalid: %r" % (message,)})


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # a client that timed out and hung up: not worth a traceback on stderr
        log.debug("demo portal: connection from %s ended badly", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    portal: DemoPortal
    protocol_version = "HTTP/1.1"
    timeout = 60  # idle keep-alive connections
    server_version = "DemoCKAN/" + CKAN_VERSION

    def setup(self):
        super().setup()
        # headers and body go out in two writes: without this, Nagle + delayed ACK add ~40 ms
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):  # quiet: through logging, not stderr
        log.debug("%s " + fmt, self.address_string(), *args)

    def do_GET(self):
        self._handle(None)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self._handle(self.rfile.read(length) if length else b"")

    def _send(self, status: int, body: str, content_type: str = JSON_TYPE, headers: dict | None = None):
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, body: bytes | None):
        portal = self.portal
        parts = urlsplit(self.path)
        m = re.fullmatch(r"/api(?:/3)?/action/([^/]+)/?", parts.path)
        if not m:
            if parts.path.rstrip("/") in ("/api/3", "/api"):
                return self._send(200, json.dumps({"version": 3}))
            return self._send(404, "<html><body><h1>404 Not Found</h1></body></html>", HTML_TYPE)
        action = m.group(1)
        query = {k: v[0] if len(v) == 1 else v for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        params: Any = query
        bad_json = None
        if body:
            try:
                params = json.loads(body)
            except ValueError:
                bad_json = ("Error decoding JSON data. Error: <BadRequest '400: Bad Request'> "
                            "JSON data extracted from the request: {}")
            else:
                if not isinstance(params, dict):
                    bad_json = f"Request data JSON decoded to {params!r} but it needs to be a dictionary."
        with portal._lock:
            portal.requests.append((action, dict(params) if isinstance(params, dict) else {}))
            portal.request_headers.append(dict(self.headers.items()))
            if len(portal.requests) > 200_000:  # a long-running demo: keep the recent half
                del portal.requests[:100_000]
                del portal.request_headers[:100_000]
        if portal.on_request:
            portal.on_request(action, params if isinstance(params, dict) else {})
        if portal.response_delay:
            time.sleep(portal.response_delay)
        failure = portal._take_failure(action)
        if failure:
            return self._fail(failure)
        help_url = f"{portal.base_url}/api/3/action/help_show?name={action}"
        if action not in DemoPortal.ACTIONS:
            return self._send(400, json.dumps(f"Bad request - Action name not known: {action}"))
        if bad_json:
            return self._send(400, json.dumps(f"Bad request - JSON Error: {bad_json}"))
        try:
            result = getattr(portal, action)(params, portal.authorized(self.headers.get("Authorization")))
        except ActionError as exc:
            if exc.bare is not None:
                return self._send(exc.status, json.dumps(exc.bare))
            return self._send(exc.status, json.dumps({"help": help_url, "success": False, "error": exc.error}))
        except Exception:  # noqa: BLE001 - CKAN's catch-all
            log.exception("demo portal action %s failed", action)
            return self._send(500, json.dumps({"help": help_url, "success": False, "error": {
                "__type": "Internal Server Error", "message": "Internal Server Error"}}))
        self._send(200, '{"help": %s, "success": true, "result": %s}' % (json.dumps(help_url), result))

    def _fail(self, spec: dict):
        status = spec["status"]
        headers = {} if spec.get("retry_after") is None else {"Retry-After": spec["retry_after"]}
        body = spec.get("body")
        if body is not None:
            if not isinstance(body, str):
                return self._send(status, json.dumps(body), JSON_TYPE, headers)
            return self._send(status, body, HTML_TYPE if body.lstrip().startswith("<") else JSON_TYPE, headers)
        if status == 429:
            return self._send(429, _NGINX_429, HTML_TYPE, headers)
        if status in (500, 503):
            return self._send(status, self.portal.error_page(), HTML_TYPE, headers)
        return self._send(status, f"<html><body><h1>HTTP {status}</h1></body></html>", HTML_TYPE, headers)


# -- CLI -----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harvester.testing.ckan_portal",
                                     description="Serve CKAN package dicts from JSONL files as a CKAN Action API.")
    parser.add_argument("--data", action="append", required=True, help="JSONL file of CKAN packages (repeatable)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--hide-inactive", action="store_true",
                        help="list only active, public datasets (CKAN's default visibility)")
    parser.add_argument("--nonce", help="a value status_show answers with (demo_portal_nonce), so whoever started "
                        "this portal can tell it answers, not another server on the port")
    args = parser.parse_args(argv)
    portal = DemoPortal(files=args.data, host=args.host, port=args.port, hide_inactive=args.hide_inactive)
    portal.nonce = args.nonce
    try:
        portal.start()
    except OSError as exc:  # EADDRINUSE above all: one line, not a traceback
        print(f"demo portal: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr,
              flush=True)
        return 3
    print(portal.base_url, flush=True)

    stop = threading.Event()

    def _on_signal(signum, frame):
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, _on_signal)
        except ValueError:  # not the main thread
            pass
    try:
        while not stop.wait(0.5):
            pass
    finally:
        portal.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
