"""A local Socrata Discovery API (test-only): ``GET /api/catalog/v1`` over records given by the test
(real results from tests/data/socrata/, and synthetic ones derived from them), with the real
semantics the harvester relies on:

- ``domains`` (comma-separated or repeated) filters by ``metadata.domain``; the server's own host
  (127.0.0.1) stands for every domain it holds; ``only`` filters by ``resource.type``; ``ids``
  picks records by id;
- ``order``: ``updatedAt`` / ``createdAt`` / ``name`` with ``ASC`` or ``DESC`` (default: relevance,
  here the order records were added in); ties broken by id, as a stable sort;
- ``limit`` (default 100) and ``offset``; ``offset + limit`` beyond 10,000 is refused with 400,
  as the API does;
- ``scroll_id`` (deep paging; an empty one starts the scroll): the results ordered by id, those
  strictly after the given id, ``limit`` of them; no offset and no window; ``order`` with
  ``scroll_id`` is refused with 400, as the API's OpenAPI document says;
- the answer: ``{"results": [...], "resultSetSize": N, "timings": {...}}``, ``resultSetSize``
  capped at 10,000 as the 2025 recordings show (exactly 10000 for a query matching more);
- ``max_page_size``: when set, a page holds at most that many results whatever ``limit`` asked (a
  server capping its pages below the request).

The 400 bodies are ``{"error": "..."}`` naming the parameter: the recordings hold no 400 of the
Discovery API, so their exact text is ours.

Faults: ``fail_next(n, status, retry_after=..., truncated=...)`` answers the next n catalogue
requests with that status (or a body cut short); ``ignore_order`` answers in relevance order
whatever ``order`` says; ``ignore_offset`` answers the first page whatever the offset (a loop);
``ignore_scroll`` answers the first scrolled page whatever the ``scroll_id`` (a stuck scroll).
Every request is recorded (path and query) in ``requests``."""
from __future__ import annotations

import copy
import json
import threading
from urllib.parse import parse_qs, urlsplit

from harvester.testing.local_http import FailureQueue, LocalServer, QuietHandler, dumps

CATALOG_PATH = "/api/catalog/v1"
MAX_WINDOW = 10_000
RESULT_SET_CAP = 10_000   # resultSetSize never says more (../shared/portal-samples/socrata/README)


def _values(query: dict, key: str) -> list[str]:
    out = []
    for value in query.get(key, []):
        out += [v.strip() for v in value.split(",") if v.strip()]
    return out


class SocrataServer(LocalServer):
    name = "socrata-server"

    def __init__(self, results: list[dict] | None = None):
        self.records: dict[str, dict] = {}
        self.requests: list[tuple[str, dict]] = []
        self.ignore_order = False
        self.ignore_offset = False
        self.ignore_scroll = False
        self.max_page_size: int | None = None
        self._fail = FailureQueue()
        self._lock = threading.Lock()
        super().__init__()
        for result in results or []:
            self.put(result)

    @property
    def catalog_url(self) -> str:
        return self.base_url + CATALOG_PATH

    # -- the records -----------------------------------------------------------------------------
    def put(self, result: dict) -> None:
        """Add (or replace, keeping its place) a Discovery API result."""
        with self._lock:
            self.records[result["resource"]["id"]] = copy.deepcopy(result)

    def remove(self, ident: str) -> None:
        with self._lock:
            del self.records[ident]

    def edit(self, ident: str, updated_at: str, **resource_fields) -> None:
        """Change a record's resource fields (name, description...) and its ``updatedAt``, as an
        edit on the portal does."""
        with self._lock:
            resource = self.records[ident]["resource"]
            resource.update(resource_fields)
            resource["updatedAt"] = resource["metadata_updated_at"] = updated_at

    def fail_next(self, n: int = 1, status: int = 503, *, retry_after: str | None = None,
                  truncated: bool = False) -> None:
        """The next ``n`` catalogue requests answer ``status`` (with ``Retry-After``), or, with
        ``truncated``, a 200 whose body stops halfway (the connection closed early)."""
        self._fail.add(n, status, retry_after, truncated)

    def catalog_requests(self) -> list[dict]:
        with self._lock:
            return [q for path, q in self.requests if path == CATALOG_PATH]

    # -- answering -------------------------------------------------------------------------------
    def _answer(self, query: dict) -> tuple[int, dict]:
        with self._lock:
            records = list(self.records.values())
        host = urlsplit(self.base_url).hostname
        domains = set(_values(query, "domains"))
        if domains and host not in domains:
            records = [r for r in records if r.get("metadata", {}).get("domain") in domains]
        only = set(_values(query, "only"))
        if only:
            records = [r for r in records if r["resource"].get("type") in only]
        ids = _values(query, "ids")
        if ids:
            records = [r for r in records if r["resource"]["id"] in set(ids)]
        if "scroll_id" in query:
            if "order" in query:
                return 400, {"error": "'order' cannot be combined with 'scroll_id'"}
            after = query["scroll_id"][0].strip()
            try:
                limit = int((query.get("limit") or ["100"])[0])
            except ValueError:
                return 400, {"error": "limit must be an integer"}
            records.sort(key=lambda r: r["resource"]["id"])
            total = len(records)
            if after and not self.ignore_scroll:
                records = [r for r in records if r["resource"]["id"] > after]
            return 200, {"results": records[:self._page_size(limit)], "resultSetSize": min(total, RESULT_SET_CAP),
                         "timings": {"serviceMillis": 1, "searchMillis": [0, 1]}}
        order = (query.get("order") or ["relevance"])[0].split()
        if order and order[0] != "relevance" and not self.ignore_order:
            key = order[0]
            if key not in ("updatedAt", "createdAt", "name"):
                return 400, {"error": f"Invalid 'order' parameter: {key}"}
            descending = len(order) > 1 and order[1].upper() == "DESC"
            records.sort(key=lambda r: r["resource"]["id"])
            records.sort(key=lambda r: r["resource"].get(key) or "", reverse=descending)
        try:
            limit = int((query.get("limit") or ["100"])[0])
            offset = int((query.get("offset") or ["0"])[0])
        except ValueError:
            return 400, {"error": "limit and offset must be integers"}
        if offset + limit > MAX_WINDOW:
            return 400, {"error": f"offset + limit must be at most {MAX_WINDOW}; use scroll_id to page deeper"}
        if self.ignore_offset:
            offset = 0
        page = records[offset:offset + self._page_size(limit)]
        return 200, {"results": page, "resultSetSize": min(len(records), RESULT_SET_CAP),
                     "timings": {"serviceMillis": 1, "searchMillis": [0, 1]}}

    def _page_size(self, limit: int) -> int:
        return limit if self.max_page_size is None else min(limit, self.max_page_size)

    def _handler(self):
        server = self

        class Handler(QuietHandler):
            content_type = "application/json;charset=utf-8"

            def do_GET(self):
                parts = urlsplit(self.path)
                query = parse_qs(parts.query, keep_blank_values=True)
                with server._lock:
                    server.requests.append((parts.path, query))
                if parts.path.rstrip("/") != CATALOG_PATH:
                    self._send(404, json.dumps({"error": f"{parts.path} not found"}).encode())
                    return
                failure = server._fail.take()
                if failure is not None:
                    status, retry_after, truncated = failure
                    if truncated:
                        body = dumps(server._answer(query)[1]).encode()
                        self._send(200, body[:len(body) // 2], length=len(body))
                        self.close_connection = True
                        return
                    self._send(status, json.dumps({"error": "failure asked by the test"}).encode(),
                               {"Retry-After": retry_after} if retry_after else None)
                    return
                status, body = server._answer(query)
                self._send(status, dumps(body).encode())

        return Handler
