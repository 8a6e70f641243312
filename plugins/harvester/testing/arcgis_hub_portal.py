"""A local ArcGIS Hub site (test-only): the OGC API Records search of a Hub
(``/api/search/v1/collections/dataset/items``) over a list of features the test sets, with the
Hub's paging (``limit``, ``startindex`` from 1, ``numberMatched``/``numberReturned``, an absolute
``rel: next`` link while there is more) and its CQL filter on ``modified`` (epoch ms:
``modified BETWEEN a AND b``, ``modified >= a``; any other filter is a 400). Every request is
recorded. Faults for the next requests: a status (5xx, 429 with Retry-After), or a body cut short;
``fields`` narrows the properties sent and ``filter=((id IN (a, b)))`` picks items;
``ignore_filter`` answers modified-filtered searches as if unfiltered, ``ignore_fields`` sends
whole features; ``loop_after`` makes the next link of
that page point back to the first page; ``max_page_size`` caps a page below the ``limit`` asked;
``omit_counts`` answers with no ``numberMatched`` and no ``rel: next`` link (both optional in OGC
API Records)."""
from __future__ import annotations

import copy
import re
import threading
from datetime import datetime
from urllib.parse import parse_qs, urlencode, urlsplit

from harvester.testing.local_http import LocalServer, QuietHandler, dumps

ITEMS = "/api/search/v1/collections/dataset/items"
_BETWEEN = re.compile(r"^\(*\s*modified\s+BETWEEN\s+(\d+)\s+AND\s+(\d+)\s*\)*$", re.I)
_GE = re.compile(r"^\(*\s*modified\s*>=\s*(\d+)\s*\)*$", re.I)
_IN = re.compile(r"^\(*\s*id\s+IN\s+\(([^()]*)\)\s*\)*$", re.I)


def _in_values(text: str) -> set[str]:
    """The values of a Hub CQL list: bare tokens or single-quoted strings (quotes doubled)."""
    return {m.group(1).replace("''", "'") if m.group(1) is not None else m.group(2)
            for m in re.finditer(r"'((?:[^']|'')*)'|([^,\s]+)", text)}


def derived_features(template: dict, n: int, *, start_ms: int = 1_700_000_000_000) -> list[dict]:
    """``n`` features made from a real one (``template``): ids ``<id>-<i>``, titles numbered,
    ``created``/``modified`` one minute apart."""
    out = []
    for i in range(n):
        feature = copy.deepcopy(template)
        ident = f"{template['id']}-{i:05d}"
        feature["id"] = ident
        props = feature["properties"]
        props.update(id=ident, title=f"{props['title']} {i}", name=f"{props.get('name') or 'item'}_{i}",
                     created=start_ms + i * 60_000, modified=start_ms + i * 60_000)
        out.append(feature)
    return out


def _ms(iso: str | None) -> int | None:
    if not iso:
        return None
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def hub_id(identifier: str) -> str:
    """The Hub's id of a DCAT feed entry: the item id, ``_<n>`` for a layer of it (as Hub names
    layers: ``<item id>_<layer>``), from ``https://www.arcgis.com/home/item.html?id=X&sublayer=N``."""
    query = parse_qs(urlsplit(identifier).query)
    item = query["id"][0]
    return f"{item}_{query['sublayer'][0]}" if "sublayer" in query else item


def features_from_dcat(feed: dict, template: dict) -> list[dict]:
    """The search features of the datasets of a Hub's own DCAT-US feed (``feed``), shaped like a
    recorded search feature (``template``): id, title, description, tags (keywords), categories
    (themes), source (the publisher), licenseInfo (the licence), created/modified (issued /
    modified in epoch ms) and url (the GeoService distribution); the template's other properties
    kept."""
    out = []
    for entry in feed["dataset"]:
        feature = copy.deepcopy(template)
        ident = hub_id(entry["identifier"])
        service = next((d["accessURL"] for d in entry.get("distribution", [])
                        if d.get("title") == "ArcGIS GeoService"), None)
        themes = entry.get("theme")
        feature["id"] = ident
        feature["properties"].update(
            id=ident, title=entry["title"], name=entry["title"], description=entry.get("description"),
            tags=list(entry.get("keyword") or []), categories=themes if isinstance(themes, list) else [],
            source=entry["publisher"]["name"], licenseInfo=entry.get("license"), created=_ms(entry.get("issued")),
            modified=_ms(entry.get("modified")), url=service,
            type="Feature Layer" if "sublayer=" in entry["identifier"] else "Feature Service")
        feature["links"] = [dict(link, href=link["href"].replace("f4bcc", ident)) for link in feature["links"]]
        out.append(feature)
    return out


class ArcGisHubServer(LocalServer):
    name = "arcgis-hub-server"

    def __init__(self, features: list[dict] | None = None):
        self.features: list[dict] = list(features or [])
        self.requests: list[str] = []
        self.ignore_filter = False
        self.ignore_fields = False
        self.loop_after: int | None = None  # startindex of the page whose next link goes back to 1
        self.max_page_size: int | None = None
        self.omit_counts = False
        self._faults: list[dict] = []
        self._lock = threading.Lock()
        super().__init__()

    @property
    def url(self) -> str:
        return self.base_url

    def items_requests(self) -> list[str]:
        return [p for p in self.requests if urlsplit(p).path == ITEMS]

    # -- what the test changes ----------------------------------------------------------------------
    def set_features(self, features: list[dict]) -> None:
        with self._lock:
            self.features = copy.deepcopy(features)

    def edit(self, ident: str, modified_ms: int, **props) -> None:
        with self._lock:
            feature = next(f for f in self.features if f["id"] == ident)
            feature["properties"].update(props, modified=modified_ms)

    def remove(self, ident: str) -> None:
        with self._lock:
            self.features = [f for f in self.features if f["id"] != ident]

    def fail_next(self, n: int = 1, *, status: int = 503, retry_after: str | None = None,
                  truncate: bool = False) -> None:
        """The next ``n`` search requests fail: answered ``status`` (with ``Retry-After``), or,
        with ``truncate``, a 200 whose JSON body stops half-way."""
        with self._lock:
            self._faults.extend({"status": status, "retry_after": retry_after, "truncate": truncate}
                                for _ in range(n))

    # -- answering ----------------------------------------------------------------------------------
    def _search(self, query: dict) -> tuple[int, dict]:
        def one(key, default=None):
            return query.get(key, [default])[-1]

        try:
            limit = max(0, min(int(one("limit", 10)), 100))
            start = max(1, int(one("startindex", 1)))
        except ValueError:
            return 400, {"code": 400, "description": "limit and startindex must be integers"}
        selected = sorted(self.features, key=lambda f: (f["properties"].get("created") or 0, f["id"]))
        cql = one("filter")
        if cql:
            between, ge, listed = _BETWEEN.match(cql.strip()), _GE.match(cql.strip()), _IN.match(cql.strip())
            if listed:
                wanted = _in_values(listed.group(1))
                selected = [f for f in selected if f["id"] in wanted]
            else:
                if between:
                    low, high = int(between.group(1)), int(between.group(2))
                elif ge:
                    low, high = int(ge.group(1)), None
                else:
                    return 400, {"code": 400, "description": f"Invalid filter: {cql}"}
                if not self.ignore_filter:
                    selected = [f for f in selected if (f["properties"].get("modified") or 0) >= low
                                and (high is None or f["properties"]["modified"] <= high)]
        served = limit if self.max_page_size is None else min(limit, self.max_page_size)
        page = copy.deepcopy(selected[start - 1:start - 1 + served])
        fields = one("fields")
        if fields and not self.ignore_fields:
            keep = {f.strip() for f in fields.split(",")}
            for feature in page:
                feature["properties"] = {k: v for k, v in feature["properties"].items() if k in keep}
                feature.pop("geometry", None)
        base = self.base_url + ITEMS
        params = {"limit": limit, "startindex": start, **({"filter": cql} if cql else {}),
                  **({"fields": fields} if fields else {})}
        links = [{"rel": "self", "type": "application/geo+json", "title": "This document as GeoJSON",
                  "href": f"{base}?{urlencode(params)}"},
                 {"rel": "collection", "type": "application/json", "title": "Dataset",
                  "href": self.base_url + "/api/search/v1/collections/dataset"}]
        if self.omit_counts:
            return 200, {"type": "FeatureCollection", "features": page, "timestamp": "2023-01-23T18:53:40.715Z",
                         "numberReturned": len(page), "links": links}
        if start - 1 + len(page) < len(selected) and page:
            nxt = 1 if self.loop_after == start else start + len(page)
            links.append({"rel": "next", "type": "application/geo+json", "title": "items (next)",
                          "href": f"{base}?{urlencode({**params, 'startindex': nxt})}"})
        return 200, {"type": "FeatureCollection", "features": page, "timestamp": "2023-01-23T18:53:40.715Z",
                     "numberMatched": len(selected), "numberReturned": len(page), "links": links}

    def _handler(self):
        server = self

        class Handler(QuietHandler):
            content_type = "application/geo+json; charset=utf-8"

            def do_GET(self):
                parts = urlsplit(self.path)
                with server._lock:
                    server.requests.append(self.path)
                    fault = server._faults.pop(0) if server._faults and parts.path == ITEMS else None
                    answer = server._search(parse_qs(parts.query)) if parts.path == ITEMS else (
                        404, {"code": 404, "description": f"Route {parts.path} not found"})
                status, doc = answer
                body = dumps(doc).encode()
                if fault and fault["truncate"]:
                    self._send(200, body[:len(body) // 2])  # a whole response of half a document
                    return
                if fault:
                    headers = {"Retry-After": fault["retry_after"]} if fault["retry_after"] else {}
                    self._send(fault["status"], b'{"error": "unavailable"}', headers)
                    return
                self._send(status, body)

        return Handler
