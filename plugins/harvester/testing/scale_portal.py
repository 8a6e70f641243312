"""A CKAN portal of a million datasets that holds none of them: records are made on demand.

``DemoPortal`` (ckan_portal.py) keeps every record and its JSON in memory (about 2 GB per 100,000
records); this one keeps the few thousand real CKAN sample records once and derives record ``i``
from ``base[i % len(base)]`` when it is asked for, exactly as ``bench/harvest_bench.py::synthetic``
does (id ``bench-{i:07d}``, name ``{name}-{i}``, title ``{title} #{i}``) except
``metadata_modified``, which is ``2020-01-01T00:00:00`` plus ``i`` seconds, so that the listing
order (``metadata_modified asc, id asc``) is index order and any page of it is arithmetic.

Changes made while it serves (``edit``, ``remove``, ``add``; a few thousand in all) live in small
sorted lists: the listing is the merge of the untouched records (index order) with the edited and
added ones (by ``metadata_modified``, ``id``), and a page at any ``start`` is found by bisection.

It answers the Action API subset the harvester's CKAN client uses (sources/ckan.py), in
DemoPortal's shapes and errors: ``status_show``; ``package_show?id=``; ``package_search`` with
``q=*:*``, ``sort=metadata_modified asc, id asc``, ``rows`` (at most 1000), ``start``, ``fl``,
and ``fq`` made of a ``metadata_modified`` range (Solr dates, inclusive or exclusive bounds), an
``id:("a" OR "b" ...)`` filter, or both joined by AND. Other queries, filters and sorts answer
CKAN's 409 ``Search Error`` naming what this portal does not do.

    with ScalePortal(1_000_000) as portal:
        client = CkanClient(portal.base_url)
        portal.edit([5, 17]); portal.remove([3]); new = portal.add(10)
"""
from __future__ import annotations

import bisect
import json
import logging
import re
import socket
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any, Iterable
from urllib.parse import parse_qs, urlsplit

from harvester.testing.ckan_portal import (CKAN_VERSION, JSON_TYPE, ROWS_MAX, VALID_SEARCH_PARAMS, ActionError,
                                           SolrError, _All, _And, _fl_fields, _id_terms, _natural, _parse_sort,
                                           _Range, _search_query_error, _Server, _solr_date_text, _SortSpecError,
                                           ServedPortal, parse_query, record_ms, samples_dir)

try:
    import orjson

    def _dumps(value: Any) -> bytes:
        return orjson.dumps(value)
except ImportError:  # pragma: no cover - orjson is in the venv
    def _dumps(value: Any) -> bytes:
        return json.dumps(value).encode("utf-8")

# the samples harvest_bench.synthetic derives its records from, in its order
BASE_FILES = ("catalog-data-gov.jsonl", "dados-gov-br.jsonl", "data-gc-ca-snapshot-2013-06-17T12-30.jsonl")
SORTS = ([("metadata_modified", False), ("id", False)], [("metadata_modified", False)])
_NAIVE_EPOCH = datetime(1970, 1, 1)
T0_MS = (datetime(2020, 1, 1) - _NAIVE_EPOCH) // timedelta(milliseconds=1)  # record 0's metadata_modified
FRESH_MS = (datetime(2030, 1, 1) - _NAIVE_EPOCH) // timedelta(milliseconds=1)  # edits/additions from here on
STEP_MS = 1000  # record i: T0 + i seconds
_ID_RE = re.compile(r"bench-(\d{7,})")
log = logging.getLogger(__name__)


def _read_samples(names, directory=None) -> list[dict]:
    """The records of the CKAN sample files ``names``, in order; a missing file names itself."""
    folder = samples_dir() if directory is None else directory
    base: list[dict] = []
    for name in names:
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"CKAN sample {path} is missing (set HARVESTER_SAMPLES_DIR or put "
                                    "../shared/ckan-samples beside the repository)")
        with path.open(encoding="utf-8") as fh:
            base += [json.loads(line) for line in fh if line.strip()]
    return base


def load_base(directory=None) -> list[dict]:
    """The real CKAN records every synthetic record is derived from (harvest_bench.synthetic's)."""
    return _read_samples(BASE_FILES, directory)


# The "real" shape (issue 40): the records of real size, each with its real resources list: the US
# portal's datasets (its harvest-source records left out: they are small and have none), the UK
# portal's and the Brazilian portal's (large resources lists: median 13 KB, up to 200 KB). A page of
# 1,000 of them is about 13 MB of JSON, as real pages of data.gov are.
REAL_FILES = ("catalog-data-gov.jsonl", "data-gov-uk.jsonl", "dados-gov-br.jsonl")
SHAPES = ("mixed", "real")


def load_real_base(directory=None) -> list[dict]:
    """The records of the "real" shape (REAL_FILES), in their files' order."""
    return [rec for rec in _read_samples(REAL_FILES, directory) if rec.get("type") != "harvest"]


def ms_text(ms: int) -> str:
    """Epoch milliseconds as CKAN writes metadata_modified: ``2020-01-01T00:00:07.000000`` (UTC, no zone)."""
    dt = _NAIVE_EPOCH + timedelta(milliseconds=ms)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond:06d}"


def bench_id(i: int) -> str:
    return f"bench-{i:07d}"


@dataclass
class _State:
    """One immutable version of the changes (a mutation builds the next one): requests read the
    version they started with, so a page is never half old, half new."""

    added: int = 0  # records appended after the initial ones
    removed: frozenset = frozenset()
    over: dict = field(default_factory=dict)  # index -> (ms, metadata_modified text, title suffix)
    excluded: list = field(default_factory=list)  # sorted initial indices not in the main sequence
    ov_keys: list = field(default_factory=list)  # sorted (ms, id) of the overlay records
    ov_ms: list = field(default_factory=list)
    ov_idx: list = field(default_factory=list)


class ScalePortal(ServedPortal):
    """A CKAN portal on ``host``:``port`` (0: a free one) serving ``datasets`` derived records.

    ``requests_made`` counts the API requests received (nothing else about them is kept).
    ``edit``, ``remove`` and ``add`` may be called while it serves (thread-safe)."""

    def __init__(self, datasets: int, *, seed: int = 1, host: str = "127.0.0.1", port: int = 0,
                 base: list[dict] | None = None, shape: str = "mixed"):
        """``shape``: "mixed" (harvest_bench.synthetic's records) or "real" (REAL_FILES: records of
        real size with their real resources lists, their text varied by ``i``)."""
        if shape not in SHAPES:
            raise ValueError(f"shape must be one of {SHAPES}, not {shape!r}")
        self.shape = shape
        if datasets < 0:
            raise ValueError(f"datasets must be >= 0, not {datasets}")
        self.datasets = datasets
        self.seed = seed  # (harvest_bench's seed only varies the seconds ScalePortal replaces)
        self.host, self.port = host, port
        self._base = base if base is not None else load_real_base() if shape == "real" else load_base()
        if not self._base:
            raise ValueError("no base records to derive datasets from")
        self._lock = threading.Lock()
        self._state = _State()
        self._fresh = 0  # counter of fresh timestamps
        self._latest_ms = T0_MS + STEP_MS * max(0, datasets - 1)
        self.requests_made = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # records ------------------------------------------------------------------------------------
    def _derived(self, i: int) -> dict:
        """Record ``i`` as harvest_bench.synthetic makes it (a shallow copy: the base is never changed)."""
        rec = dict(self._base[i % len(self._base)])
        rec["id"] = bench_id(i)
        rec["name"] = f"{rec.get('name') or 'dataset'}-{i}"
        rec["title"] = f"{rec.get('title') or rec['name']} #{i}"
        if self.shape == "real":  # varied text, so that no two records embed or hash alike
            rec["notes"] = f"{rec.get('notes') or ''} (copy {i} of {rec['title']})"
        return rec

    def _build(self, st: _State, i: int) -> dict:
        rec = self._derived(i)
        over = st.over.get(i)
        if over is None:
            rec["metadata_modified"] = ms_text(T0_MS + STEP_MS * i)
        else:
            rec["metadata_modified"] = over[1]
            rec["title"] += over[2]
        return rec

    def _live(self, st: _State, i: int) -> bool:
        return 0 <= i < self.datasets + st.added and i not in st.removed

    def record(self, i: int) -> dict | None:
        """Record ``i`` as it is served now; None if it was removed or never existed."""
        st = self._state
        return self._build(st, i) if self._live(st, i) else None

    @property
    def count(self) -> int:
        st = self._state
        return self.datasets + st.added - len(st.removed)

    def _key(self, st: _State, i: int) -> tuple[int, str]:
        over = st.over.get(i)
        return (T0_MS + STEP_MS * i if over is None else over[0]), bench_id(i)

    # mutations ------------------------------------------------------------------------------------
    def _next_ms(self, modified: str | None) -> tuple[int, str]:
        if modified is not None:
            ms = record_ms(modified)
            if ms is None:
                raise ValueError(f"modified {modified!r} is not a timestamp")
            self._latest_ms = max(self._latest_ms, ms)
            return ms, modified
        self._fresh += 1
        ms = max(FRESH_MS + self._fresh, self._latest_ms + 1)
        self._latest_ms = ms
        return ms, ms_text(ms)

    def _commit(self, added: int, removed: set, over: dict) -> None:
        """Install the next state (under the lock)."""
        excluded = sorted(i for i in removed | over.keys() if i < self.datasets)
        entries = sorted(((over[i][0], bench_id(i)), i) for i in over if i not in removed)
        self._state = _State(added, frozenset(removed), over, excluded, [k for k, _ in entries],
                             [k[0] for k, _ in entries], [i for _, i in entries])

    def _indices(self, st: _State, indices: Iterable[int]) -> list[int]:
        out = []
        for i in indices:
            i = int(i)
            if not self._live(st, i):
                raise KeyError(f"record {i} is not served (removed, or not in 0..{self.datasets + st.added - 1})")
            out.append(i)
        return out

    def edit(self, indices: Iterable[int], *, modified: str | None = None, suffix: str = " (revised)") -> None:
        """Append ``suffix`` to these records' titles and give them ``modified`` (default: a fresh
        timestamp later than any served so far, distinct for each)."""
        with self._lock:
            st = self._state
            over = dict(st.over)
            for i in self._indices(st, indices):
                ms, text = self._next_ms(modified)
                over[i] = (ms, text, (over[i][2] if i in over else "") + suffix)
            self._commit(st.added, set(st.removed), over)

    def remove(self, indices: Iterable[int]) -> None:
        """These records disappear (listings, counts; package_show answers 404)."""
        with self._lock:
            st = self._state
            removed = set(st.removed)
            removed.update(self._indices(st, indices))
            over = {i: v for i, v in st.over.items() if i not in removed}
            self._commit(st.added, removed, over)

    def add(self, count: int, *, modified: str | None = None) -> list[int]:
        """Append ``count`` records after the last index (ids go on), modified ``modified`` (default:
        fresh timestamps later than any served so far); returns their indices."""
        with self._lock:
            st = self._state
            first = self.datasets + st.added
            new = list(range(first, first + count))
            over = dict(st.over)
            for i in new:
                ms, text = self._next_ms(modified)
                over[i] = (ms, text, "")
            self._commit(st.added + count, set(st.removed), over)
            return new

    # the listing -----------------------------------------------------------------------------------
    @staticmethod
    def _pos(st: _State, i: int) -> int:
        """How many main-sequence records have an index below ``i``."""
        return i - bisect.bisect_left(st.excluded, i)

    def _main_index(self, st: _State, p: int) -> int:
        """The index of the main sequence's ``p``-th record (0-based)."""
        lo, hi = p, p + len(st.excluded)
        while lo < hi:  # smallest i with (main records <= i) > p
            mid = (lo + hi) // 2
            if mid + 1 - bisect.bisect_right(st.excluded, mid) > p:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _index_cut(self, key: tuple[int, str]) -> int:
        """How many initial indices sort before ``key`` (their keys grow with the index)."""
        ms, id_ = key
        d = ms - T0_MS
        cut = max(0, -(-d // STEP_MS))
        if d >= 0 and d % STEP_MS == 0 and d // STEP_MS < self.datasets and bench_id(d // STEP_MS) < id_:
            cut += 1
        return min(cut, self.datasets)

    def _ms_cut(self, ms: int, inclusive_before: bool) -> int:
        """How many initial indices have a timestamp < ``ms`` (``<=`` with ``inclusive_before``)."""
        d = ms - T0_MS + (1 if inclusive_before else 0)
        return min(self.datasets, max(0, -(-d // STEP_MS)))

    def _page(self, st: _State, rng: _Range | None, start: int, rows: int) -> tuple[int, list[int]]:
        """(count, the indices of the listing's records start..start+rows) under the date range."""
        lo_i, hi_i, a, b = 0, self.datasets, 0, len(st.ov_ms)
        if rng is not None:
            if rng.lo is not None:
                lo_i = self._ms_cut(rng.lo, not rng.lo_incl)
                a = (bisect.bisect_left if rng.lo_incl else bisect.bisect_right)(st.ov_ms, rng.lo)
            if rng.hi is not None:
                hi_i = self._ms_cut(rng.hi, rng.hi_incl)
                b = (bisect.bisect_right if rng.hi_incl else bisect.bisect_left)(st.ov_ms, rng.hi)
            hi_i, b = max(lo_i, hi_i), max(a, b)
        lo_pos, hi_pos = self._pos(st, lo_i), self._pos(st, hi_i)
        main_n, ov_n = hi_pos - lo_pos, b - a
        total = main_n + ov_n

        def merged_at(j: int) -> int:  # where the overlay's j-th (of a..b) record stands in the listing
            before = min(max(self._pos(st, self._index_cut(st.ov_keys[a + j])), lo_pos), hi_pos) - lo_pos
            return j + before

        lo, hi = 0, ov_n  # j0: how many overlay records stand before `start`
        while lo < hi:
            mid = (lo + hi) // 2
            if merged_at(mid) < start:
                lo = mid + 1
            else:
                hi = mid
        j = lo
        p = lo_pos + max(0, start - j)
        out: list[int] = []
        want = max(0, min(rows, total - start))
        i = self._main_index(st, p) if p < hi_pos else -1
        e = bisect.bisect_left(st.excluded, i) if i >= 0 else 0
        while len(out) < want:
            main_key = None
            if p < hi_pos:
                while e < len(st.excluded) and st.excluded[e] == i:
                    i, e = i + 1, e + 1
                main_key = (T0_MS + STEP_MS * i, bench_id(i))
            if a + j < b and (main_key is None or st.ov_keys[a + j] < main_key):
                out.append(st.ov_idx[a + j])
                j += 1
            else:
                out.append(i)
                p, i = p + 1, i + 1
        return total, out

    # actions ---------------------------------------------------------------------------------------
    def _search_error(self, solr_message: str) -> ActionError:
        msg = "SOLR returned an error running query: %r" % (solr_message,)
        return ActionError(409, {"__type": "Search Error", "message": "Search error: %r" % (msg,)})

    def _filters(self, fq: str) -> tuple[_Range | None, list[str] | None]:
        try:
            node = parse_query(fq)
        except SolrError as exc:
            raise self._search_error(f"Solr responded with an error (HTTP 400): [Reason: {exc}]") from None
        parts = node.parts if isinstance(node, _And) else [node]
        rng, ids = None, None
        for part in parts:
            if isinstance(part, _All):
                continue
            if isinstance(part, _Range) and part.field == "metadata_modified" and rng is None:
                rng = part
                continue
            got = _id_terms(part)
            if got is not None and ids is None:
                ids = got
                continue
            raise self._search_error(f"ScalePortal filters only on one metadata_modified range and/or "
                                     f"id:(...), not {fq!r}")
        return rng, ids

    def package_search(self, params: dict) -> dict:
        bad = sorted(k for k in params if k not in VALID_SEARCH_PARAMS and not k.startswith("ext_"))
        if bad:
            raise _search_query_error(f"Invalid search parameters: {bad}")
        rows = min(_natural(params, "rows", 10), ROWS_MAX)
        start = _natural(params, "start", 0)
        q = str(params.get("q") or "").strip()
        if q not in ("", "*:*", '""', "''"):
            raise self._search_error(f"ScalePortal answers only q=*:*, not {q!r}")
        sort = params.get("sort")
        try:
            keys = _parse_sort(str(sort)) if sort is not None else None
        except _SortSpecError:
            raise _search_query_error('Invalid "sort" parameter') from None
        if keys not in SORTS:
            raise self._search_error(f"ScalePortal sorts only by 'metadata_modified asc, id asc', not {sort!r}")
        fq = params.get("fq")
        if isinstance(fq, list):
            fq = " AND ".join(f"({f})" for f in fq if str(f).strip())
        rng, ids = self._filters(str(fq or ""))
        st = self._state
        if ids is None:
            total, page = self._page(st, rng, start, rows)
        else:
            found = []
            for x in dict.fromkeys(ids):
                m = _ID_RE.fullmatch(x)
                if m and bench_id(int(m.group(1))) == x and self._live(st, int(m.group(1))):
                    i = int(m.group(1))
                    ms = self._key(st, i)[0]
                    if rng is None or rng.bounds_ok(ms):
                        found.append((self._key(st, i), i))
            found.sort()
            total, page = len(found), [i for _, i in found[start:start + rows]]
        fields = _fl_fields(params.get("fl"))
        if fields:
            results = [self._doc(st, i, fields) for i in page]
        else:
            results = [self._build(st, i) for i in page]
        return {"count": total, "sort": sort, "facets": {}, "results": results, "search_facets": {}}

    def _doc(self, st: _State, i: int, fields: list[str]) -> Any:
        """Like DemoPortal's ``_solr_doc``: only those fields, dates as Solr writes them."""
        ms, id_ = self._key(st, i)
        if set(fields) <= {"id", "metadata_modified"}:
            doc = {f: (id_ if f == "id" else _solr_date_text(ms)) for f in fields}
        else:
            rec = self._build(st, i)
            doc = {}
            for f in fields:
                if f == "metadata_modified":
                    doc[f] = _solr_date_text(ms)
                elif f == "metadata_created":
                    created = record_ms(rec.get(f))
                    if created is not None:
                        doc[f] = _solr_date_text(created)
                elif f in rec and not isinstance(rec[f], (dict, list)):
                    doc[f] = rec[f]
        if fields in (["id"], ["name"]):
            return doc.get(fields[0])
        return doc

    def package_show(self, params: dict) -> dict:
        id_or_name = params.get("id") or params.get("name_or_id")
        if not id_or_name:
            raise ActionError(409, {"name_or_id": ["Missing value"], "__type": "Validation Error"})
        st = self._state
        text = str(id_or_name)
        m = _ID_RE.fullmatch(text)
        i = int(m.group(1)) if m and bench_id(int(m.group(1))) == text else None
        if i is None and "-" in text:  # by name: {name}-{i}
            tail = text.rsplit("-", 1)[1]
            if tail.isdigit() and self._live(st, int(tail)) and self._build(st, int(tail))["name"] == text:
                i = int(tail)
        if i is None or not self._live(st, i):
            raise ActionError(404, {"__type": "Not Found Error", "message": "Not found"})
        return self._build(st, i)

    def status_show(self, params: dict) -> dict:
        return {"site_title": "Harvester scale portal", "site_description": "Derived CKAN records served locally",
                "site_url": self.base_url, "ckan_version": CKAN_VERSION, "error_emails_to": None,
                "locale_default": "en", "extensions": ["scale_portal"]}

    ACTIONS = ("package_search", "package_show", "status_show")

    # server --------------------------------------------------------------------------------------------
    thread_name = "scale portal"

    def _handler_base(self) -> type:
        return _Handler


class _Handler(BaseHTTPRequestHandler):
    portal: ScalePortal
    protocol_version = "HTTP/1.1"
    timeout = 60  # idle keep-alive connections
    server_version = "ScaleCKAN/" + CKAN_VERSION

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):  # quiet
        pass

    def do_GET(self):
        self._handle(None)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self._handle(self.rfile.read(length) if length else b"")

    def _send(self, status: int, data: bytes, content_type: str = JSON_TYPE):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, body: bytes | None):
        portal = self.portal
        parts = urlsplit(self.path)
        m = re.fullmatch(r"/api(?:/3)?/action/([^/]+)/?", parts.path)
        if not m:
            if parts.path.rstrip("/") in ("/api/3", "/api"):
                return self._send(200, b'{"version": 3}')
            return self._send(404, b"<html><body><h1>404 Not Found</h1></body></html>", "text/html;charset=utf-8")
        action = m.group(1)
        with portal._lock:
            portal.requests_made += 1
        params: Any = {k: v[0] if len(v) == 1 else v
                       for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        if body:
            try:
                params = json.loads(body)
            except ValueError:
                params = None
            if not isinstance(params, dict):
                return self._send(400, _dumps("Bad request - JSON Error: the request data must be a JSON object"))
        if action not in ScalePortal.ACTIONS:
            return self._send(400, _dumps(f"Bad request - Action name not known: {action}"))
        help_url = f"{portal.base_url}/api/3/action/help_show?name={action}"
        try:
            result = getattr(portal, action)(params)
        except ActionError as exc:
            if exc.bare is not None:
                return self._send(exc.status, _dumps(exc.bare))
            return self._send(exc.status, _dumps({"help": help_url, "success": False, "error": exc.error}))
        except Exception:  # noqa: BLE001 - CKAN's catch-all
            log.exception("scale portal action %s failed", action)
            return self._send(500, _dumps({"help": help_url, "success": False, "error": {
                "__type": "Internal Server Error", "message": "Internal Server Error"}}))
        self._send(200, _dumps({"help": help_url, "success": True, "result": result}))
