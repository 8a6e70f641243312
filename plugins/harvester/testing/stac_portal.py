"""A local STAC catalogue (test-only): a STAC API and a static catalog over the same collections,
served as the real servers recorded in ../shared/portal-samples/stac/ answer.

- ``GET /`` the API landing page (earth-search's recorded one, its links pointing here: ``data`` ->
  ``/collections``, ``conformsTo`` as recorded, a ``child`` link per collection).
- ``GET /collections?limit=N`` pages of collections, ``limit`` capped at ``max_limit`` (100, as
  earth-search answers), ``default_limit`` when absent (10), a 400 for a limit that is not a
  positive integer. Paging is one of the recorded servers' (``paging``):
    - ``"startRecord"`` (ESA FedEO, emc.spacebel.be): ``numberMatched``/``numberReturned``, a
      ``rel: next`` link adding ``startRecord`` (from 1) to the query asked;
    - ``"token"`` (stac-server, as earth-search runs, and the hand-made STAC 1.1 sample): keyset
      paging by collection id, a next link ``?limit=N&token=<last id>`` relative to the page, with
      ``method: GET``; the total as ``context.matched`` (``counts="context"``, earth-search's) or
      none (``counts=None``, Planetary Computer's).
  Collections are ordered by id.
- ``GET /collections/<id>``: one collection; an unknown one answers earth-search's recorded 404
  (``{"code":"NotFound","description":"Not Found"}``).
- ``GET /static/catalog.json``: a static catalog (CBERS' recorded root, its links pointing here),
  ``child`` links relative (``./<id>/collection.json``), each collection at
  ``/static/<id>/collection.json`` with ``root``/``parent`` links ``../catalog.json`` and no
  ``self`` link, as CBERS' are; ``static_group``: sub-catalogs of that many collections each
  (``./group-<k>/catalog.json``, their children ``./<id>/collection.json``).

Each served collection is the stored one with its ``self``, ``root``, ``parent`` and ``items``
links pointing here. Every request is recorded (``requests``: path and query). Misbehaviour on
demand: ``fail_next`` (a status, 429 with Retry-After, or a 200 body cut half-way, for the next
requests), ``loop_after`` (page ``k``'s next link points back to the first page), ``post_next``
(next links carry ``method: POST`` and a ``body``), ``endless`` (the next ``/collections`` page is a
body that never ends), ``child_loop`` (every static collection also links the root as a ``child``),
``missing_children`` (ids whose static documents answer 404).
"""
from __future__ import annotations

import copy
import json
import threading
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlencode, urlsplit

from harvester.testing.local_http import LocalServer, QuietHandler, dumps
from harvester.testing.samples import portal_sample, portal_samples_dir

FEDEO = "collections-q-sentinel-2-pages-emc-spacebel-2025-07-31.vcr.yaml"
FEDEO_BBOX = "collections-search-bbox-emc-spacebel-2025-07-31.vcr.yaml"
EARTH_SEARCH = "landing-and-collections-earth-search-v1-2025-07-31.vcr.yaml"
NOT_FOUND = "collection-not-found-earth-search-2025-12-16.vcr.yaml"
CERES = ("collections-stac-1.0-handmade-ceres.json", "collections-stac-1.1-handmade-ceres.json")
CBERS = ("CBERS4MUX", "CBERS4AWFI", "CBERS4PAN10M", "CBERS4PAN5M")
_OWN_RELS = ("self", "root", "parent", "items")


def cassette(name: str) -> list[dict]:
    """The interactions of a recorded VCR cassette: ``uri``, ``status`` and the body read as JSON."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with portal_sample("stac", name).open(encoding="utf-8") as handle:
        doc = yaml.load(handle, Loader=loader)  # noqa: S506 (a safe loader)
    return [{"uri": it["request"]["uri"], "status": it["response"]["status"]["code"],
             "body": json.loads(it["response"]["body"]["string"])} for it in doc["interactions"]]


def cbers_catalog() -> tuple[dict, list[dict]]:
    """The recorded static CBERS catalog: its root and its four collections."""
    root = portal_samples_dir("stac") / "cbers-static-catalog"
    catalog = json.loads(portal_sample("stac", "cbers-static-catalog/catalog.json").read_text(encoding="utf-8"))
    return catalog, [json.loads((root / c / "collection.json").read_text(encoding="utf-8")) for c in CBERS]


def real_collections() -> list[dict]:
    """Every distinct recorded collection: FedEO's (three pages), earth-search's nine, the two
    hand-made STAC 1.0/1.1 ones and CBERS' four, in that order."""
    out: dict[str, dict] = {}
    pages = [i["body"] for name in (FEDEO, FEDEO_BBOX) for i in cassette(name)]
    pages += [i["body"] for i in cassette(EARTH_SEARCH) if "collections" in i["body"]]
    pages += [json.loads(portal_sample("stac", name).read_text(encoding="utf-8")) for name in CERES]
    for page in pages:
        for doc in page["collections"]:
            out.setdefault(doc["id"], doc)
    for doc in cbers_catalog()[1]:
        out.setdefault(doc["id"], doc)
    return list(out.values())


def derived_collections(n: int, *, start: datetime = datetime(2024, 1, 1, tzinfo=timezone.utc),
                        templates: list[dict] | None = None) -> list[dict]:
    """``n`` collections made from the real ones: ids ``<id>-<i>`` (``:`` kept out, as in a path),
    titles numbered (a template without a title keeps none), ``updated`` one minute apart from
    ``start``; the templates' own links that point at their hosts (self, root, parent, items) are
    the server's to write."""
    bases = templates or real_collections()
    out = []
    for i in range(n):
        doc = copy.deepcopy(bases[i % len(bases)])
        ident = f"{doc['id'].replace(':', '-')}-{i:05d}"
        doc["id"] = ident
        if doc.get("title"):
            doc["title"] = f"{doc['title']} {i}"
        doc["updated"] = (start + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%SZ")
        doc["links"] = [link for link in doc.get("links") or [] if link.get("rel") not in _OWN_RELS]
        out.append(doc)
    return out


class StacServer(LocalServer):
    name = "stac-server"

    def __init__(self, collections: list[dict] | None = None, *, paging: str = "startRecord",
                 counts: str | None = "numberMatched", max_limit: int = 100, default_limit: int = 10,
                 static_group: int | None = None):
        if paging not in ("startRecord", "token"):
            raise ValueError(f"paging {paging!r}: startRecord or token")
        self.collections: dict[str, dict] = {}
        self.set_collections(collections or [])
        self.paging, self.counts = paging, counts
        self.max_limit, self.default_limit = max_limit, default_limit
        self.static_group = static_group
        self.requests: list[str] = []
        self.loop_after: int | None = None
        self.post_next = False
        self.endless = False
        self.child_loop = False
        self.missing_children: set[str] = set()
        self._faults: list[dict] = []
        self._lock = threading.Lock()
        landing = next(i["body"] for i in cassette(EARTH_SEARCH) if "conformsTo" in i["body"])
        self._landing = landing
        self._catalog = cbers_catalog()[0]
        super().__init__()

    @property
    def url(self) -> str:
        """The API's landing page."""
        return self.base_url + "/"

    @property
    def static_url(self) -> str:
        return self.base_url + "/static/catalog.json"

    def collection_requests(self) -> list[str]:
        return [p for p in self.requests if urlsplit(p).path == "/collections"]

    # -- what the test changes ----------------------------------------------------------------------
    def set_collections(self, collections: list[dict]) -> None:
        self.collections = {c["id"]: copy.deepcopy(c) for c in collections}

    def edit(self, ident: str, updated: str | None = None, **fields) -> None:
        with self._lock:
            doc = self.collections[ident]
            doc.update(fields)
            if updated:
                doc["updated"] = updated

    def remove(self, ident: str) -> None:
        with self._lock:
            del self.collections[ident]

    def fail_next(self, n: int = 1, *, status: int = 503, retry_after: str | None = None,
                  truncate: bool = False) -> None:
        with self._lock:
            self._faults.extend({"status": status, "retry_after": retry_after, "truncate": truncate}
                                for _ in range(n))

    # -- answering ----------------------------------------------------------------------------------
    def _ordered(self) -> list[dict]:
        return [self.collections[k] for k in sorted(self.collections)]

    def served(self, doc: dict, *, static: bool = False) -> dict:
        """A stored collection as it is served: its own links pointing here."""
        out = copy.deepcopy(doc)
        links = [link for link in out.get("links") or [] if link.get("rel") not in _OWN_RELS]
        if static:
            links += [{"rel": "root", "href": "../catalog.json", "type": "application/json"},
                      {"rel": "parent", "href": "../catalog.json", "type": "application/json"}]
            if self.child_loop:
                links.append({"rel": "child", "href": "../catalog.json"})
        else:
            base = self.base_url
            links += [{"rel": "self", "href": f"{base}/collections/{doc['id']}", "type": "application/json"},
                      {"rel": "root", "href": f"{base}/", "type": "application/json"},
                      {"rel": "parent", "href": f"{base}/", "type": "application/json"},
                      {"rel": "items", "href": f"{base}/collections/{doc['id']}/items",
                       "type": "application/geo+json"}]
        out["links"] = links
        return out

    def landing(self) -> dict:
        doc = copy.deepcopy(self._landing)
        real = "https://earth-search.aws.element84.com/v1"
        doc["links"] = [dict(link, href=link["href"].replace(real, self.base_url))
                        for link in doc["links"] if link.get("rel") != "child"]
        # as earth-search's: a child link per collection (a client that lists /collections needs none)
        doc["links"] += [{"rel": "child", "type": "application/json", "href": f"{self.base_url}/collections/{ident}"}
                         for ident in sorted(self.collections)]
        return doc

    def _page(self, query: dict) -> tuple[int, dict]:
        def one(key, default=None):
            return query.get(key, [default])[-1]

        try:
            limit = int(one("limit", self.default_limit))
            start = int(one("startRecord", 1))
            if limit < 1 or start < 1:
                raise ValueError
        except ValueError:
            return 400, {"code": "InvalidParameterValue",
                         "description": "limit and startRecord must be positive integers"}
        limit = min(limit, self.max_limit)
        ordered = self._ordered()
        if self.paging == "token":
            token = one("token")
            rest = [c for c in ordered if token is None or c["id"] > token]
            page = rest[:limit]
            more = len(rest) > limit
            number = (len(ordered) - len(rest)) // limit + 1
        else:
            page = ordered[start - 1:start - 1 + limit]
            more = start - 1 + len(page) < len(ordered)
            number = (start - 1) // limit + 1
        looping = self.loop_after is not None and number == self.loop_after
        params = {k: v[-1] for k, v in query.items()}
        links = [{"rel": "self", "type": "application/json",
                  "href": f"{self.base_url}/collections?{urlencode(params)}"},
                 {"rel": "root", "type": "application/json", "href": f"{self.base_url}/"}]
        if more and page:
            if self.paging == "token":
                after = {} if looping else {"token": page[-1]["id"]}  # looping: back to the first page
                nxt = {"rel": "next", "type": "application/json", "method": "GET",
                       "href": "?" + urlencode({"limit": limit, **after})}
            else:
                again = 1 if looping else start + len(page)
                nxt = {"rel": "next", "type": "application/json",
                       "href": f"{self.base_url}/collections?{urlencode({**params, 'startRecord': again})}"}
            if self.post_next:
                nxt.update(method="POST", body={"limit": limit, "token": page[-1]["id"]})
            links.append(nxt)
        body = {"collections": [self.served(c) for c in page], "links": links}
        if self.counts == "numberMatched":
            body.update(numberMatched=len(ordered), numberReturned=len(page))
        elif self.counts == "context":
            body["context"] = {"page": number, "limit": limit, "matched": len(ordered), "returned": len(page)}
        return 200, body

    def _static(self, path: str) -> tuple[int, dict]:
        """The static catalog's documents: the root, group catalogs, collections."""
        ordered = self._ordered()
        parts = path[len("/static/"):].split("/")
        if parts == ["catalog.json"]:
            root = copy.deepcopy(self._catalog)
            links = [{"rel": "root", "href": self.static_url, "type": "application/json"}]
            if self.static_group:
                groups = (len(ordered) + self.static_group - 1) // self.static_group
                links += [{"rel": "child", "href": f"./group-{k}/catalog.json"} for k in range(groups)]
            else:
                links += [{"rel": "child", "href": f"./{c['id']}/collection.json"} for c in ordered]
            root["links"] = links
            return 200, root
        if len(parts) == 2 and parts[0].startswith("group-") and parts[1] == "catalog.json" and self.static_group:
            k = int(parts[0][len("group-"):])
            members = ordered[k * self.static_group:(k + 1) * self.static_group]
            if not members:
                return 404, {"code": "NotFound", "description": "Not Found"}
            return 200, {"type": "Catalog", "stac_version": "1.0.0", "id": parts[0],
                         "description": f"collections {k * self.static_group + 1} to "
                                        f"{k * self.static_group + len(members)}",
                         "links": [{"rel": "root", "href": "../catalog.json"},
                                   {"rel": "parent", "href": "../catalog.json"}]
                         + [{"rel": "child", "href": f"./{c['id']}/collection.json"} for c in members]}
        if parts[-1] == "collection.json" and len(parts) >= 2:
            ident = parts[-2]
            if ident in self.collections and ident not in self.missing_children:
                return 200, self.served(self.collections[ident], static=True)
        return 404, {"code": "NotFound", "description": "Not Found"}

    def answer(self, path: str, query: dict) -> tuple[int, dict]:
        if path in ("", "/"):
            return 200, self.landing()
        if path == "/collections":
            return self._page(query)
        if path.startswith("/collections/") and path.count("/") == 2:
            doc = self.collections.get(path.rsplit("/", 1)[1])
            if doc is not None:
                return 200, self.served(doc)
        if path.startswith("/static/"):
            return self._static(path)
        return 404, {"code": "NotFound", "description": "Not Found"}

    def _handler(self):
        server = self

        class Handler(QuietHandler):
            disable_nagle_algorithm = True  # headers and body written apart: no 40 ms delayed-ACK stall

            def do_GET(self):
                parts = urlsplit(self.path)
                with server._lock:
                    server.requests.append(self.path)
                    fault = server._faults.pop(0) if server._faults else None
                    endless = server.endless and parts.path == "/collections"
                    if endless:
                        server.endless = False
                    status, doc = server.answer(parts.path, parse_qs(parts.query))
                try:
                    if endless:
                        self._endless()
                        return
                    body = dumps(doc).encode()
                    if fault and fault["truncate"]:
                        self._send(200, body[:len(body) // 2])
                    elif fault:
                        headers = {"Retry-After": fault["retry_after"]} if fault["retry_after"] else {}
                        self._send(fault["status"], b'{"code": "ServiceUnavailable"}', headers)
                    else:
                        self._send(status, body)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def _endless(self, cap: int = 1 << 30):
                """A page that never ends: ``{"collections": [`` then spaces, chunked, until the
                client goes (or ``cap`` bytes)."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b" " * 65536
                self.wfile.write(b'13\r\n{"collections": [  \r\n')
                sent = 0
                while sent < cap:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    sent += len(chunk)
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

        return Handler


def bench_catalogue(n: int):
    """A STAC API of ``n`` collections derived from the recorded ones (new ids, numbered titles,
    ``updated`` one minute apart in 2024), FedEO's paging (numberMatched, startRecord, pages of at
    most 100); the URL to harvest is its landing page."""
    server = StacServer(derived_collections(n))
    return server, lambda: server.url

