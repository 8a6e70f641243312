"""A local udata portal (test-only): the REST API v1's dataset listing and lookups over datasets the
test sets, with udata's own semantics (opendatateam/udata ``udata/core/dataset/api.py``,
``udata/api/__init__.py``, ``udata/api/fields.py``, ``udata/flask_mongoengine/pagination.py``):

- ``GET /api/1/datasets/``: the Page envelope ``{data, page, page_size, total, next_page,
  previous_page}``, ``next_page``/``previous_page`` absolute URLs keeping the request's arguments
  (null at the ends); ``page``/``page_size`` positive integers (else 400), no upper bound on
  ``page_size`` (``max_page_size`` caps it, a misbehaviour); ``sort`` one of ``title``, ``created``,
  ``last_update``, ``reuses``, ``followers``, ``views`` with an optional ``-`` (else 400, as
  flask-restx words it); ``organization`` an ObjectId (else 400 "Organization arg must be an
  identifier"); deleted, private and archived datasets not listed; a page past the last one (not
  the first) is a 404; no sort: ``-created_at_internal``;
- the ``X-Fields`` mask of flask-restx (``data{id,last_modified},total,...``, ``*``);
- ``GET /api/1/datasets/<id or slug>/``: the dataset, 404 ``{"message"}`` when unknown or private,
  410 "Dataset has been deleted" when deleted;
- ``GET /api/1/organizations/<id or slug>/``: the organisation.

Every request is recorded (``requests``, with its headers in ``headers_seen``). Misbehaviour:
``fail_next`` (a status with Retry-After, or a body cut short), ``ignore_sort`` (pages in the
stored order), ``ignore_mask``, ``loop_after`` (that page's next_page points back to page 1),
``endless_page`` (that page's body never ends), ``next_host`` (next_page on another host),
``sort_field`` (what ``last_update`` sorts by: udata before 2025-07 sorted it by the internal
modification date), ``sorts`` (the sorts accepted), ``show_hidden`` (deleted, private and archived
datasets listed too, as a sysadmin's API key sees them), ``max_page_size``.

``catalogue(n)`` builds ``n`` datasets from the real recorded answers of
../shared/portal-samples/udata (18 datasets of Angers Loire Métropole, 2017; a harvested GTFS
dataset, 2019; INSEE's deaths file with 129 resources, 2023): new ObjectIds, numbered titles and
slugs, distinct dates in 2024. ``bench_catalogue(n)`` serves it for bench/sources_bench.py."""
from __future__ import annotations

import copy
import json
import math
import re
import threading
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlencode, urlsplit

from harvester.testing.local_http import LocalServer, QuietHandler, dumps
from harvester.testing.samples import portal_sample

SORTS = {"title": "title", "created": "created_at_internal", "last_update": "last_update",
         "reuses": "metrics.reuses", "followers": "metrics.followers", "views": "metrics.views"}
_OBJECT_ID = re.compile(r"^[0-9a-fA-F]{24}$")
NOT_FOUND = ("The requested URL was not found on the server. If you entered the URL manually please check your "
             "spelling and try again.")
START = datetime(2024, 1, 1, tzinfo=timezone.utc)


# -- the real samples ------------------------------------------------------------------------------
def _cassette_body(name: str, index: int = 0):
    return json.loads(json.loads(portal_sample("udata", name).read_text(encoding="utf-8"))[index]["response"]["body"])


def sample_datasets() -> list[dict]:
    """The real datasets of the samples: 18 of the 2017 organisation list, the harvested GTFS
    dataset of 2019 (www), INSEE's deaths file of 2023 (129 resources)."""
    out = list(_cassette_body("organization-datasets-list-next-2017-10-12.exvcr.json"))
    out.append(_cassette_body("dataset-impulsyon-harvested-next-and-www-2019-01-22.exvcr.json", 1))
    out.append(json.loads(portal_sample("udata", "dataset-fichier-des-personnes-decedees-www-2023-10.json")
                          .read_text(encoding="utf-8")))
    return out


def iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat()


def object_id(i: int, prefix: str = "b0") -> str:
    return f"{prefix}{i:022x}"[:24]


def catalogue(n: int, *, start: datetime = START, max_resources: int = 10) -> list[dict]:
    """``n`` datasets derived from the real ones (``sample_datasets``): ids ``object_id(i)``, titles
    and slugs numbered, ``created_at``/``last_modified``/``last_update`` one minute apart in 2024
    (dataset ``i`` at ``start + i`` minutes), at most ``max_resources`` resources each."""
    bases = sample_datasets()
    out = []
    for i in range(n):
        ds = copy.deepcopy(bases[i % len(bases)])
        ident = object_id(i)
        when = iso(start + timedelta(minutes=i))
        ds["resources"] = ds.get("resources", [])[:max_resources]
        ds.update(id=ident, title=f"{ds['title']} #{i}", slug=f"{ds['slug']}-{i}", created_at=when,
                  last_modified=when, last_update=when, deleted=None, private=False, archived=None,
                  page=f"https://www.data.gouv.fr/fr/datasets/{ds['slug']}-{i}/",
                  uri=f"https://www.data.gouv.fr/api/1/datasets/{ds['slug']}-{i}/",
                  internal={"created_at_internal": when, "last_modified_internal": when})
        out.append(ds)
    return out


# -- X-Fields masks --------------------------------------------------------------------------------
def parse_mask(text: str) -> dict:
    """A flask-restx mask (``a,b{c,d},*``) as {field: submask or None}."""
    text = text.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    out: dict = {}
    i, name = 0, ""
    while i < len(text):
        ch = text[i]
        if ch == "{":
            depth, j = 1, i + 1
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            out[name.strip()] = parse_mask(text[i + 1:j - 1])
            name, i = "", j
            continue
        if ch == ",":
            if name.strip():
                out[name.strip()] = None
            name = ""
        else:
            name += ch
        i += 1
    if name.strip():
        out[name.strip()] = None
    return out


def apply_mask(value, mask: dict):
    if isinstance(value, list):
        return [apply_mask(v, mask) for v in value]
    if not isinstance(value, dict) or "*" in mask:
        return value
    return {k: (apply_mask(value.get(k), sub) if sub is not None else value.get(k)) for k, sub in mask.items()}


def _path_value(ds: dict, dotted: str):
    value = ds
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


class UdataPortal(LocalServer):
    name = "udata-portal"

    def __init__(self, datasets: list[dict] | None = None, organizations: list[dict] | None = None):
        self.datasets: dict[str, dict] = {}
        self.organizations: dict[str, dict] = {o["id"]: o for o in organizations or []}
        self.requests: list[str] = []
        self.headers_seen: list[dict] = []
        self.ignore_sort = False
        self.ignore_mask = False
        self.loop_after: int | None = None
        self.endless_page: int | None = None
        self.next_host: str | None = None
        self.max_page_size: int | None = None
        self.sort_field = "last_update"
        self.sorts = dict(SORTS)       # the sorts it accepts (an older udata knew fewer)
        self.show_hidden = False       # list deleted/private/archived too (what a sysadmin's API key sees)
        self._faults: list[dict] = []
        self._lock = threading.Lock()
        for ds in datasets or []:
            self.put(ds)
        super().__init__()

    @property
    def url(self) -> str:
        return self.base_url

    def list_requests(self) -> list[str]:
        return [p for p in self.requests if urlsplit(p).path == "/api/1/datasets/"]

    # -- what the test changes ------------------------------------------------------------------------
    def put(self, ds: dict) -> None:
        ds = copy.deepcopy(ds)
        internal = ds.setdefault("internal", {})
        internal.setdefault("created_at_internal", ds.get("created_at"))
        internal.setdefault("last_modified_internal", ds.get("last_modified"))
        with self._lock:
            self.datasets[ds["id"]] = ds

    def edit(self, ident: str, when: datetime, *, data: bool = False, **fields) -> None:
        """A metadata edit at ``when`` (``last_modified``; with ``data``, a resource's new file too:
        ``last_update``), ``fields`` changed."""
        with self._lock:
            ds = self.datasets[ident]
            ds.update(fields)
            ds["last_modified"] = iso(when)
            ds["internal"]["last_modified_internal"] = iso(when)
            if data:
                ds["last_update"] = iso(when)
                if ds.get("resources"):
                    ds["resources"][0]["last_modified"] = iso(when)

    def delete(self, ident: str, when: datetime | None = None) -> None:
        with self._lock:
            self.datasets[ident]["deleted"] = iso(when or datetime.now(timezone.utc))

    def fail_next(self, n: int = 1, *, status: int = 503, retry_after: str | None = None,
                  truncate: bool = False) -> None:
        with self._lock:
            self._faults.extend({"status": status, "retry_after": retry_after, "truncate": truncate}
                                for _ in range(n))

    # -- answering -----------------------------------------------------------------------------------
    def _visible(self) -> list[dict]:
        if self.show_hidden:
            return list(self.datasets.values())
        return [d for d in self.datasets.values()
                if not d.get("deleted") and not d.get("private") and not d.get("archived")]

    def _list(self, query: dict, headers: dict) -> tuple[int, dict]:
        args = {k: v[-1] for k, v in query.items()}
        errors = {}
        sort = args.get("sort")
        choices = list(self.sorts) + ["-" + k for k in self.sorts]
        if sort is not None and sort not in choices:
            errors["sort"] = (f"The field (and direction) on which sorting apply The value '{sort}' is not a valid "
                              f"choice for 'sort'.")
        numbers = {}
        for key, default in (("page", 1), ("page_size", 20)):
            try:
                numbers[key] = int(args.get(key, default))
                if numbers[key] < 1:
                    raise ValueError
            except ValueError:
                errors[key] = f"Invalid argument: {args.get(key)}. argument must be a positive integer."
        if errors:
            return 400, {"errors": errors, "message": "Input payload validation failed"}
        org = args.get("organization")
        if org is not None and not _OBJECT_ID.match(org):
            return 400, {"message": "Organization arg must be an identifier"}
        selected = self._visible()
        if org:
            selected = [d for d in selected if (d.get("organization") or {}).get("id") == org]
        if not self.ignore_sort:
            field, reverse = (sort.lstrip("-"), sort.startswith("-")) if sort else ("created", True)
            dotted = SORTS[field]
            if field == "last_update" and self.sort_field != "last_update":
                dotted = self.sort_field
            if dotted == "created_at_internal":
                dotted = "internal.created_at_internal"
            elif dotted == "last_modified_internal":
                dotted = "internal.last_modified_internal"
            selected.sort(key=lambda d: (str(_path_value(d, dotted) or "")), reverse=reverse)
        page, size = numbers["page"], numbers["page_size"]
        served = size if self.max_page_size is None else min(size, self.max_page_size)
        total = len(selected)
        items = selected[(page - 1) * size:(page - 1) * size + served]
        if not items and page != 1:
            return 404, {"message": NOT_FOUND}
        pages = math.ceil(total / size) if total else 0
        base = f"http://{self.next_host}" if self.next_host else self.base_url
        nxt = None
        if page < pages:
            nxt = f"{base}/api/1/datasets/?{urlencode({**args, 'page': 1 if self.loop_after == page else page + 1})}"
        prev = f"{self.base_url}/api/1/datasets/?{urlencode({**args, 'page': page - 1})}" if page > 1 else None
        body = {"data": copy.deepcopy(items), "page": page, "page_size": size, "total": total, "next_page": nxt,
                "previous_page": prev}
        return 200, self._masked(body, headers)

    def _masked(self, body, headers: dict):
        mask = headers.get("x-fields")
        if mask and not self.ignore_mask:
            return apply_mask(body, parse_mask(mask))
        return body

    def _dataset(self, ref: str, headers: dict) -> tuple[int, dict]:
        ds = self.datasets.get(ref) or next((d for d in self.datasets.values() if d.get("slug") == ref), None)
        if ds is None or ds.get("private"):
            return 404, {"message": NOT_FOUND}
        if ds.get("deleted"):
            return 410, {"message": "Dataset has been deleted"}
        return 200, self._masked(copy.deepcopy(ds), headers)

    def _organization(self, ref: str, headers: dict) -> tuple[int, dict]:
        org = self.organizations.get(ref) or next((o for o in self.organizations.values() if o.get("slug") == ref),
                                                  None)
        if org is None:
            return 404, {"message": NOT_FOUND}
        return 200, self._masked(copy.deepcopy(org), headers)

    def answer(self, path: str, headers: dict) -> tuple[int, dict, int | None]:
        """(status, body, page asked) of a GET."""
        parts = urlsplit(path)
        query = parse_qs(parts.query, keep_blank_values=True)
        segments = [s for s in parts.path.split("/") if s]
        with self._lock:
            if segments == ["api", "1", "datasets"]:
                status, body = self._list(query, headers)
                try:
                    page = int(query.get("page", ["1"])[-1])
                except ValueError:
                    page = None
                return status, body, page
            if len(segments) == 4 and segments[:3] == ["api", "1", "datasets"]:
                return (*self._dataset(segments[3], headers), None)
            if len(segments) == 4 and segments[:3] == ["api", "1", "organizations"]:
                return (*self._organization(segments[3], headers), None)
        return 404, {"message": NOT_FOUND}, None

    def _handler(self):
        server = self

        class Handler(QuietHandler):
            def do_GET(self):
                headers = {k.lower(): v for k, v in self.headers.items()}
                with server._lock:
                    server.requests.append(self.path)
                    server.headers_seen.append(headers)
                    fault = server._faults.pop(0) if server._faults and self.path.startswith("/api/1/") else None
                if fault and not fault["truncate"]:
                    extra = {"Retry-After": fault["retry_after"]} if fault["retry_after"] else {}
                    self._send(fault["status"], b'{"message": "Service unavailable"}', extra)
                    return
                status, body, page = server.answer(self.path, headers)
                data = dumps(body).encode()
                if fault:
                    self._send(200, data[:len(data) // 2])  # a whole response of half a document
                    return
                if status == 200 and page is not None and page == server.endless_page:
                    self._endless(data)
                    return
                self._send(status, data)

            def _endless(self, data: bytes) -> None:
                """A chunked 200 that starts like the page and never ends (64 MB at most)."""
                self.send_response(200)
                self.send_header("Content-Type", self.content_type)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                head = data[:data.index(b'"data": [') + 9] if b'"data": [' in data else b'{"data": ['
                chunk = b'{"id": "x", "title": "again"},' * 2000
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(head), head))
                    for _ in range(64 * 1024 * 1024 // len(chunk)):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                except (BrokenPipeError, ConnectionResetError):
                    return

        return Handler


def organizations_of(datasets: list[dict]) -> list[dict]:
    """The organisations the datasets name (their reference objects)."""
    out = {}
    for ds in datasets:
        org = ds.get("organization")
        if isinstance(org, dict) and org.get("id"):
            out.setdefault(org["id"], {k: org.get(k) for k in ("id", "name", "slug", "acronym", "uri", "page",
                                                                 "logo")})
    return list(out.values())


def bench_catalogue(n: int):
    """(an unstarted UdataPortal serving ``catalogue(n)``, a function giving the URL to harvest)."""
    datasets = catalogue(n)
    server = UdataPortal(datasets, organizations_of(datasets))
    return server, lambda: server.base_url
