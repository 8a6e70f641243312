"""A local OpenDataSoft portal (test-only): the Explore API v2.1 catalogue,
``GET /api/explore/v2.1/catalog/datasets?limit=&offset=&order_by=&where=``, as ODS answers it:
``{"total_count", "results"}``, ``limit`` at most 100, ``offset + limit`` at most 10,000 (HTTP 400
past it, as the real API), ``order_by=dataset_id`` (asc/desc), and the ``where`` conditions a
harvester sends (``default.modified >= date'...'`` (also ``>``, ``<``, ``<=``, ``modified``),
``dataset_id > "x"``, ``dataset_id = "a" OR dataset_id = "b"``, joined by AND); ``select`` of
``dataset_id`` and ``modified`` (a narrowed answer); ``limit=0`` for a count. Anything else in
``where`` is a 400, like an ODSQL error.

Test controls: ``fail_next(n, status, retry_after=)`` (5xx / 429 with Retry-After),
``truncate_next(n)`` (a 200 whose body is cut short mid-way: the connection closes early),
``ignore_filter`` (the modified condition is ignored, as a portal that does not honour it),
``loop`` (``offset`` ignored: every page is the first), ``ignore_keyset`` (the ``dataset_id >``
condition ignored), ``ignore_select`` (whole datasets sent whatever ``select`` asks),
``ignore_ids`` (the ``dataset_id = ... OR ...`` condition ignored), every request recorded in ``requests``
(path and parsed query), and the catalogue's datasets in ``datasets`` (id -> v2.1 object).

``to_v21`` and ``fixture_datasets`` turn the real fixtures of tests/data/opendatasoft (v2.0 and
v1.0 answers) into v2.1 dataset objects."""
from __future__ import annotations

import copy
import json
import re
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from harvester.testing.local_http import FailureQueue, LocalServer

CATALOG = "/api/explore/v2.1/catalog/datasets"
FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "data" / "opendatasoft"
_MODIFIED = re.compile(r"^\(?\s*(?:default\.)?modified\s*(>=|>|<=|<)\s*date'([^']+)'\s*\)?$")
_ID_EQ = r'dataset_id\s*=\s*"(?:[^"\\]|\\.)*"'
_IDS = re.compile(rf"^\(?\s*{_ID_EQ}(?:\s+OR\s+{_ID_EQ})*\s*\)?$", re.I)
_ID_VALUE = re.compile(r'"((?:[^"\\]|\\.)*)"')
_KEYSET = re.compile(r'^\(?\s*dataset_id\s*(>|>=)\s*"((?:[^"\\]|\\.)*)"\s*\)?$')


def to_v21(item: dict) -> dict:
    """A dataset of a v2.0 (``{"links", "dataset"}``) or v1.0 (``datasetid``, flat ``metas``)
    answer as the Explore v2.1 catalogue lists it."""
    item = copy.deepcopy(item)
    if "dataset" in item and isinstance(item["dataset"], dict):
        return item["dataset"]
    if "datasetid" in item:
        out = {"dataset_id": item.pop("datasetid")}
        metas = item.pop("metas", {})
        interop = item.pop("interop_metas", {})
        out.update(item)
        out["metas"] = {"default": metas, **interop}
        return out
    return item


def fixture_datasets() -> list[dict]:
    """Every dataset of the real fixtures, as v2.1 objects."""
    out = []
    for name in sorted(p.name for p in FIXTURES.glob("*.json")):
        body = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
        out += [to_v21(item) for item in body.get("results", body.get("datasets", []))]
    return out


def _parse_date(value: str) -> datetime:
    value = value.strip().replace("Z", "+00:00")
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


class OdsError(ValueError):
    pass


class OpenDataSoftPortal(LocalServer):
    name = "opendatasoft-portal"
    max_limit = 100
    offset_cap = 10_000

    def __init__(self, datasets: list[dict] | None = None):
        self.datasets: dict[str, dict] = {}
        self.requests: list[tuple[str, dict]] = []
        self.ignore_filter = False
        self.loop = False
        self.ignore_keyset = False
        self.ignore_select = False
        self.ignore_ids = False
        self._fail = FailureQueue()
        self._lock = threading.Lock()
        for ds in datasets or []:
            self.put(ds)
        super().__init__()

    # -- the catalogue, as tests change it
    def put(self, ds: dict) -> None:
        with self._lock:
            self.datasets[ds["dataset_id"]] = copy.deepcopy(ds)

    def edit(self, ident: str, modified: str, **default) -> None:
        """Change ``metas.default`` of a dataset (and its ``modified``)."""
        with self._lock:
            self.datasets[ident]["metas"]["default"].update(default, modified=modified)

    def remove(self, ident: str) -> None:
        with self._lock:
            del self.datasets[ident]

    def fail_next(self, n: int = 1, status: int = 503, retry_after: str | None = None) -> None:
        self._fail.add(n, "status", status, retry_after)

    def truncate_next(self, n: int = 1) -> None:
        self._fail.add(n, "truncate", None, None)

    def catalog_requests(self) -> list[dict]:
        return [q for path, q in self.requests if path == CATALOG]

    # -- answering
    def _select(self, query: dict) -> dict:
        def one(name, default=None):
            values = query.get(name)
            return values[-1] if values else default

        try:
            limit, offset = int(one("limit", 10)), int(one("offset", 0))
        except ValueError as exc:
            raise OdsError(f"limit and offset must be integers ({exc})") from exc
        if not 0 <= limit <= self.max_limit:
            raise OdsError(f"Invalid value for limit: must be between 0 and {self.max_limit}")
        if offset < 0 or offset + limit > self.offset_cap:
            raise OdsError(f"Invalid value for offset + limit: must not exceed {self.offset_cap}")
        conditions = []
        where = (one("where") or "").strip()
        for part in filter(None, (p.strip() for p in re.split(r"\s+AND\s+", where, flags=re.I) if where)):
            if m := _MODIFIED.match(part):
                op, at = m.group(1), _parse_date(m.group(2))
                if not self.ignore_filter:
                    conditions.append(lambda ds, op=op, at=at: _compare(_modified(ds), op, at))
            elif m := _KEYSET.match(part):
                op, after = m.group(1), _unescape(m.group(2))
                if not self.ignore_keyset:
                    conditions.append(lambda ds, op=op, after=after: ds["dataset_id"] > after if op == ">"
                                      else ds["dataset_id"] >= after)
            elif _IDS.match(part):
                wanted = {_unescape(v) for v in _ID_VALUE.findall(part)}
                if not self.ignore_ids:
                    conditions.append(lambda ds, wanted=wanted: ds["dataset_id"] in wanted)
            else:
                raise OdsError(f"ODSQL query is malformed: {part!r}")
        order = (one("order_by") or "").strip()
        with self._lock:
            rows = list(self.datasets.values())
        if order:
            m = re.fullmatch(r"dataset_id(?:\s+(asc|desc))?", order, flags=re.I)
            if not m:
                raise OdsError(f"order_by: unknown field {order!r}")
            rows.sort(key=lambda ds: ds["dataset_id"], reverse=(m.group(1) or "").lower() == "desc")
        rows = [ds for ds in rows if all(c(ds) for c in conditions)]
        start = 0 if self.loop else offset
        with self._lock:
            page = copy.deepcopy(rows[start:start + limit])
        select = (one("select") or "").strip()
        if select and not self.ignore_select:
            fields = [f.strip() for f in select.split(",")]
            unknown = [f for f in fields if f not in ("dataset_id", "modified", "default.modified")]
            if unknown:
                raise OdsError(f"select: unknown field(s) {unknown}")
            page = [{f: ds["dataset_id"] if f == "dataset_id" else ds["metas"]["default"].get("modified")
                     for f in fields} for ds in page]
        return {"total_count": len(rows), "results": page}

    def _handler(self):
        portal = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict, extra: dict | None = None, cut: bool = False):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                if cut:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data[:len(data) // 2] if cut else data)
                if cut:
                    self.close_connection = True

            def do_GET(self):
                parts = urlsplit(self.path)
                query = parse_qs(parts.query, keep_blank_values=True)
                with portal._lock:
                    portal.requests.append((parts.path, {k: v[-1] for k, v in query.items()}))
                if parts.path.rstrip("/") != CATALOG:
                    return self._send(404, {"error_code": "NotFound", "message": f"{parts.path} not found"})
                failure = portal._fail.take()
                if failure and failure[0] == "status":
                    _, status, retry_after = failure
                    return self._send(status, {"error_code": "ServiceUnavailable", "message": "try later"},
                                      {"Retry-After": retry_after} if retry_after else None)
                try:
                    body = portal._select(query)
                except OdsError as exc:
                    return self._send(400, {"error_code": "ODSQLError", "message": str(exc)})
                self._send(200, body, cut=bool(failure and failure[0] == "truncate"))

        return Handler


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def _modified(ds: dict) -> datetime | None:
    value = ((ds.get("metas") or {}).get("default") or {}).get("modified")
    try:
        return _parse_date(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _compare(value: datetime | None, op: str, at: datetime) -> bool:
    if value is None:
        return False
    return {">=": value >= at, ">": value > at, "<=": value <= at, "<": value < at}[op]
