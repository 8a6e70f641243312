"""A local OpenDataSoft portal (test-only): the Explore API v2.1 catalogue as its documentation
(help.opendatasoft.com/apis/ods-explore-v2, the OpenAPI document of opendatasoft-explore-sdk) and
../shared/portal-samples/opendatasoft describe it, limits included:

- ``GET /api/explore/v2.1/catalog/datasets?limit=&offset=&order_by=&where=&select=``:
  ``{"total_count", "results"}``; ``limit`` from 0 to 100 (-1: 100), ``offset + limit`` at most
  10,000: past either, HTTP 400 ``{"message", "error_code": "InvalidRESTParameterError"}``;
  ``limit=0`` for a count;
- ``GET /api/explore/v2.1/catalog/exports/json`` (same ``where``, ``select``, ``order_by``;
  ``limit`` -1 by default: everything; ``offset``): the whole catalogue as one JSON array, streamed
  in chunks (``Transfer-Encoding: chunked``), with no 10,000 limit;
- ``where``: conditions joined by AND, as ODSQL compares them: a date field (``modified``,
  ``default.modified``) with ``=``, ``>``, ``<``, ``>=``, ``<=`` and ``date'...'``; a text field
  (``dataset_id``, ``title``, ``publisher``...) with ``=`` only (the documentation's text
  comparison operators), ``dataset_id = "a" OR dataset_id = "b"`` included; ``>`` or ``<`` on a
  text field, or anything else, is HTTP 400 ``{"message", "error_code": "ODSQLError"}`` (the
  documented error body, opendatasoft/explore-v2.1-error-400-odsql-openapi-example.json);
- ``order_by=dataset_id`` (asc/desc); ``select`` of ``dataset_id`` and ``modified``.

Test controls: ``fail_next(n, status, retry_after=)`` (5xx / 429 with Retry-After, either
endpoint), ``truncate_next(n)`` (a 200 whose body is cut short mid-way: the connection closes
early; an export stops after half its datasets without its last chunk), ``cut_export_after``
(every export stops after that many datasets, the connection closed without the last chunk),
``ignore_filter`` (the modified condition is ignored, as a portal that does not honour it),
``loop`` (``offset`` ignored: every page is the first), ``page_cap`` (a page holds at most that
many datasets whatever ``limit`` asks), ``no_total`` (answers without ``total_count``),
``ignore_select`` (whole datasets sent whatever ``select`` asks), ``ignore_ids`` (the
``dataset_id = ... OR ...`` condition ignored), ``offset_cap`` (10,000; a test may scale it
down), every request recorded in ``requests`` (path and parsed query; ``catalog_requests()``,
``export_requests()``), and the catalogue's datasets in ``datasets`` (id -> v2.1 object).

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

from harvester.testing.local_http import FailureQueue, LocalServer, dumps

CATALOG = "/api/explore/v2.1/catalog/datasets"
EXPORT = "/api/explore/v2.1/catalog/exports/json"
FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "data" / "opendatasoft"
_MODIFIED = re.compile(r"^\(?\s*(?:default\.)?modified\s*(>=|>|<=|<)\s*date'([^']+)'\s*\)?$")
_ID_EQ = r'dataset_id\s*=\s*"(?:[^"\\]|\\.)*"'
_IDS = re.compile(rf"^\(?\s*{_ID_EQ}(?:\s+OR\s+{_ID_EQ})*\s*\)?$", re.I)
_ID_VALUE = re.compile(r'"((?:[^"\\]|\\.)*)"')
# any other comparison of a field with a string: ODSQL compares text fields with `=` only
_TEXT_CMP = re.compile(r'^\(?\s*([A-Za-z_][\w.]*)\s*(>=|<=|!=|<>|=|>|<)\s*["\']((?:[^"\'\\]|\\.)*)["\']\s*\)?$')
DATE_FIELDS = frozenset({"modified", "default.modified", "data_processed", "metadata_processed"})
EXPORT_CHUNK = 50   # datasets a chunk of an export


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
    """A request the API refuses: HTTP 400 with ``{"message", "error_code"}``."""

    def __init__(self, message: str, code: str = "ODSQLError"):
        super().__init__(message)
        self.code = code


class OpenDataSoftPortal(LocalServer):
    name = "opendatasoft-portal"
    max_limit = 100
    offset_cap = 10_000

    def __init__(self, datasets: list[dict] | None = None):
        self.datasets: dict[str, dict] = {}
        self.requests: list[tuple[str, dict]] = []
        self.ignore_filter = False
        self.loop = False
        self.page_cap: int | None = None
        self.no_total = False
        self.cut_export_after: int | None = None
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

    def export_requests(self) -> list[dict]:
        return [q for path, q in self.requests if path == EXPORT]

    # -- answering
    def _select(self, query: dict) -> dict:
        """The answer of the catalogue endpoint: a page, within the documented limits."""
        one = _one(query)
        try:
            limit, offset = int(one("limit", 10)), int(one("offset", 0))
        except ValueError as exc:
            raise OdsError(f"Invalid value for limit or offset API parameter: {exc}", "InvalidRESTParameterError") \
                from exc
        limit = self.max_limit if limit == -1 else limit
        if not 0 <= limit <= self.max_limit:
            raise OdsError(f"Invalid value for limit API parameter: {limit} was found but -1 <= limit <= "
                           f"{self.max_limit} is expected.", "InvalidRESTParameterError")
        if offset < 0 or offset + limit > self.offset_cap:
            raise OdsError(f"Invalid value for sum of offset + limit API parameter: {offset + limit} was found "
                           f"but <= {self.offset_cap} is expected.", "InvalidRESTParameterError")
        rows = self._rows(query)
        start = 0 if self.loop else offset
        size = limit if self.page_cap is None else min(limit, self.page_cap)
        with self._lock:
            page = copy.deepcopy(rows[start:start + size])
        results = self._narrowed(query, page)
        return {"results": results} if self.no_total else {"total_count": len(rows), "results": results}

    def _export(self, query: dict) -> list[dict]:
        """The datasets of an export (no limit on their number): ``limit`` -1 (everything) by
        default, ``offset`` from 0."""
        one = _one(query)
        try:
            limit, offset = int(one("limit", -1)), int(one("offset", 0))
        except ValueError as exc:
            raise OdsError(f"Invalid value for limit or offset API parameter: {exc}", "InvalidRESTParameterError") \
                from exc
        if limit < -1 or offset < 0:
            raise OdsError(f"Invalid value for limit ({limit}) or offset ({offset}) API parameter",
                           "InvalidRESTParameterError")
        rows = self._rows(query)[offset:]
        return rows if limit == -1 else rows[:limit]

    def _rows(self, query: dict) -> list[dict]:
        """The datasets ``where`` selects, in the ``order_by`` order (the objects themselves)."""
        one = _one(query)
        conditions = []
        where = (one("where") or "").strip()
        for part in filter(None, (p.strip() for p in re.split(r"\s+AND\s+", where, flags=re.I) if where)):
            if m := _MODIFIED.match(part):
                op, at = m.group(1), _parse_date(m.group(2))
                if not self.ignore_filter:
                    conditions.append(lambda ds, op=op, at=at: _compare(_modified(ds), op, at))
            elif _IDS.match(part):
                wanted = {_unescape(v) for v in _ID_VALUE.findall(part)}
                if not self.ignore_ids:
                    conditions.append(lambda ds, wanted=wanted: ds["dataset_id"] in wanted)
            elif (m := _TEXT_CMP.match(part)) and m.group(1) not in DATE_FIELDS:
                field, op = m.group(1), m.group(2)
                if op != "=":
                    raise OdsError(f"ODSQL query is malformed: {part} Clause(s) containing the error(s): where. "
                                   f"The text field {field!r} can only be compared with '=' (operator {op!r})")
                raise OdsError(f"ODSQL query is malformed: {part} Clause(s) containing the error(s): where. "
                               f"Unknown field {field!r} for this stand-in")
            else:
                raise OdsError(f"ODSQL query is malformed: {part} Clause(s) containing the error(s): where.")
        order = (one("order_by") or "").strip()
        with self._lock:
            rows = list(self.datasets.values())
        if order:
            m = re.fullmatch(r"dataset_id(?:\s+(asc|desc))?", order, flags=re.I)
            if not m:
                raise OdsError(f"ODSQL query is malformed: order_by: unknown field {order!r}")
            rows.sort(key=lambda ds: ds["dataset_id"], reverse=(m.group(1) or "").lower() == "desc")
        return [ds for ds in rows if all(c(ds) for c in conditions)]

    def _narrowed(self, query: dict, page: list[dict]) -> list[dict]:
        """``page`` with only the fields ``select`` asks for (all of them when it asks none)."""
        select = (_one(query)("select") or "").strip()
        if not select or self.ignore_select:
            return page
        fields = [f.strip() for f in select.split(",")]
        unknown = [f for f in fields if f not in ("dataset_id", "modified", "default.modified")]
        if unknown:
            raise OdsError(f"ODSQL query is malformed: select: unknown field(s) {unknown} Clause(s) containing the "
                           f"error(s): select.")
        return [{f: ds["dataset_id"] if f == "dataset_id" else ds["metas"]["default"].get("modified")
                 for f in fields} for ds in page]

    def _handler(self):
        portal = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict, extra: dict | None = None, cut: bool = False):
                data = dumps(body).encode()
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

            def _stream(self, query: dict, rows: list[dict], cut: bool):
                """The export: a JSON array written in chunks as the datasets are serialized, or,
                ``cut``, stopped after half of them (or ``cut_export_after``) with the connection
                closed and no last chunk."""
                stop = portal.cut_export_after
                if cut:
                    stop = len(rows) // 2 if stop is None else min(stop, len(rows) // 2)
                self.send_response(200)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                if stop is not None:
                    self.send_header("Connection", "close")
                self.end_headers()

                def chunk(data: bytes):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

                try:
                    chunk(b"[")
                    for at in range(0, len(rows), EXPORT_CHUNK):
                        with portal._lock:
                            batch = copy.deepcopy(rows[at:at + EXPORT_CHUNK])
                        if stop is not None:
                            batch = batch[:max(0, stop - at)]
                        if batch:
                            chunk((b"," if at else b"") + b",".join(
                                dumps(d).encode() for d in portal._narrowed(query, batch)))
                        if stop is not None and at + len(batch) >= stop:
                            self.wfile.flush()
                            self.close_connection = True  # no closing bracket, no last chunk
                            return
                    chunk(b"]")
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):  # the client went away
                    self.close_connection = True

            def do_GET(self):
                parts = urlsplit(self.path)
                query = parse_qs(parts.query, keep_blank_values=True)
                path = parts.path.rstrip("/")
                with portal._lock:
                    portal.requests.append((path, {k: v[-1] for k, v in query.items()}))
                if path not in (CATALOG, EXPORT):
                    return self._send(404, {"error_code": "NotFound", "message": f"{parts.path} not found"})
                failure = portal._fail.take()
                if failure and failure[0] == "status":
                    _, status, retry_after = failure
                    return self._send(status, {"error_code": "ServiceUnavailable", "message": "try later"},
                                      {"Retry-After": retry_after} if retry_after else None)
                cut = bool(failure and failure[0] == "truncate")
                try:
                    if path == EXPORT:
                        return self._stream(query, portal._export(query), cut)
                    body = portal._select(query)
                except OdsError as exc:
                    return self._send(400, {"message": str(exc), "error_code": exc.code})
                self._send(200, body, cut=cut)

        return Handler


def _one(query: dict):
    """The last value of a query parameter (``default`` when absent)."""
    def one(name, default=None):
        values = query.get(name)
        return values[-1] if values else default
    return one


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
