"""A local Web Accessible Folder of ISO 19139 / 19115-2 files (test-only): ``WafServer``.

It serves a folder tree under ``/waf/`` as the web servers of the recorded listings do
(../shared/portal-samples/iso-waf/): each folder's index page in one of the styles
``apache`` (mod_autoindex FancyIndexing table, ``2026-07-12 02:23``), ``apache-pre`` (the
``<pre>`` form), ``apache-nodates`` (a plain ``<ul>``, no dates: the Census listing), ``nginx``
(autoindex ``<pre>``, ``02-Oct-2025 11:47``), ``iis`` (``6/17/2021 12:20 PM``, absolute hrefs,
``[To Parent Directory]``) and ``iis-long`` (``Friday, July 31, 2026  4:53 PM``); a folder without
its trailing slash is redirected to it (301), as Apache and nginx do. Files are answered with an
``ETag`` (of the body) and ``Last-Modified``, and ``304 Not Modified`` to a matching
``If-None-Match`` / ``If-Modified-Since``. Every request is recorded (``requests``: path, headers,
status).

Misbehaviour on demand: ``fail_files(after, times, status)`` (file requests after ``after``
answered files get ``status``, ``times`` of them), ``fail_next(n, status)`` (any request),
``aliases`` (a folder that is another one, as a symbolic link looping back is: ``{"a/loop/": "a/"}``),
``error_pages`` (folders answering 200 with a proxy's HTML error page), ``forbidden`` (folders
answering 403), ``endless`` (files whose body never ends: chunks until the client goes), ``moved`` (a path
prefix redirected to another, as a WAF that moved is), ``cut_listings`` (the next listings cut
short), ``gzip`` (bodies gzipped, as mod_deflate does).

``derive(body, title=, file_id=)`` rewrites a real record's title and fileIdentifier in its own
declared encoding; ``catalogue(n)`` builds n files from the five real records in nested folders of
every style; ``bench_catalogue(n)`` is the bench's (bench/sources_bench.py).
"""
from __future__ import annotations

import email.utils
import gzip
import hashlib
import re
import socket
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from html import escape
from urllib.parse import quote, unquote, urlsplit

from harvester.testing.local_http import FailureQueue, LocalServer, QuietHandler
from harvester.testing.samples import portal_sample

RECORDS = ("iso19139-epa-enviroatlas-acs-demographics-2021-06-17.xml", "iso19115-2-noaa-inport-47598-2024-02-29.xml",
           "iso19115-2-census-cb_2014_us_necta_500k.xml", "iso19115-2-census-tl_2013_us_county-iso8859-1.xml",
           "iso19115-2-noaa-psl-20crv3-many-keywords.xml")
STYLES = ("apache", "nginx", "iis", "iis-long", "apache-pre", "apache-nodates")
ROOT = "/waf/"
# what a proxy in front of a WAF answers, with 200, while the server behind it is down
ERROR_PAGE = (b"<html><head><title>Service Temporarily Unavailable</title></head><body><h1>Service Temporarily "
              b"Unavailable</h1><p>Please try again later.</p></body></html>")
_DECLARED = re.compile(rb"^\s*<\?xml[^>]*encoding\s*=\s*[\"']([A-Za-z0-9._-]+)[\"']")
_TITLE = re.compile(r"(<gmd:title[^>]*>\s*<gco:CharacterString[^>]*>)([^<]*)(</gco:CharacterString>)")
_FILE_ID = re.compile(r"(<gmd:fileIdentifier[^>]*>\s*<gco:CharacterString[^>]*>)([^<]*)(</gco:CharacterString>)")


def real_record(name: str) -> bytes:
    """One of the recorded ISO files of ../shared/portal-samples/iso-waf/."""
    return portal_sample("iso-waf", name).read_bytes()


def derive(body: bytes, *, title: str | None = None, file_id: str | None = None) -> bytes:
    """``body`` with the citation's title and the fileIdentifier replaced, written back in the
    encoding the file declares (UTF-8 when it declares none)."""
    m = _DECLARED.match(body)
    codec = m.group(1).decode() if m else "utf-8"
    text = body.decode(codec)
    if title is not None:
        at = text.find("identificationInfo")
        head, tail = text[:at], text[at:]
        tail = _TITLE.sub(lambda m: m[1] + escape(title, quote=False) + m[3], tail, count=1)
        text = head + tail
    if file_id is not None:
        text = _FILE_ID.sub(lambda m: m[1] + escape(file_id, quote=False) + m[3], text, count=1)
    return text.encode(codec)


@dataclass
class WafFile:
    """A file of the folder: its body (bytes, or a zero-argument function making them) and its date
    (naive: the server's local time)."""

    body: object
    modified: datetime
    _size: int | None = None

    def data(self) -> bytes:
        return self.body() if callable(self.body) else self.body

    @property
    def size(self) -> int:
        if self._size is None:
            self._size = len(self.data())
        return self._size


def _http_date(when: datetime) -> str:
    return email.utils.format_datetime(when.replace(tzinfo=timezone.utc), usegmt=True)


def _size(n: int) -> str:
    return f"{n / 1024:.0f}K" if n >= 1024 else str(n)


class WafServer(LocalServer):
    """The folder tree ``files`` ({path under /waf/: WafFile}, e.g. ``"2024/a/x.xml"``) served with
    the listing style of each folder: ``styles`` ({folder: style}, e.g. ``{"": "apache",
    "2024/": "iis"}``), else ``style`` (a style of STYLES, or ``"mixed"``: each folder one of
    STYLES, chosen by its name)."""

    name = "waf-portal"

    def __init__(self, files: dict[str, WafFile] | None = None, *, style: str = "mixed",
                 styles: dict[str, str] | None = None):
        self.files: dict[str, WafFile] = dict(files or {})
        self.style, self.styles = style, dict(styles or {})
        self.requests: list[tuple[str, dict, int]] = []
        self.aliases: dict[str, str] = {}
        self.error_pages: set[str] = set()
        self.forbidden: set[str] = set()
        self.endless: set[str] = set()
        self.cut_listings = 0  # the next listings answered cut short (half the page, then the close)
        self.cut_quietly = False  # ... without a Content-Length that would tell
        self.gzip = False  # bodies gzipped to a client that accepts it, as Apache's mod_deflate does
        self.moved: dict[str, str] = {}  # a path prefix answered 301 to another ({"/old/": "/waf/"})
        self._fail = FailureQueue()
        self._file_failures: list = []  # [after, times, status]
        self._answered_files = 0
        self._lock = threading.Lock()
        super().__init__()

    @property
    def url(self) -> str:
        return self.base_url + ROOT

    # -- what tests change
    def set_files(self, files: dict[str, WafFile]) -> None:
        with self._lock:
            self.files = dict(files)

    def fail_next(self, n: int, status: int = 503) -> None:
        self._fail.add(n, status)

    def fail_files(self, after: int, times: int, status: int = 500) -> None:
        """File requests after the next ``after`` answered files get ``status``, ``times`` of them."""
        with self._lock:
            self._answered_files = 0
            self._file_failures = [after, times, status]

    def file_requests(self) -> list[tuple[str, dict, int]]:
        return [r for r in self.requests if not r[0].endswith("/")]

    def listing_requests(self) -> list[tuple[str, dict, int]]:
        return [r for r in self.requests if r[0].endswith("/")]

    # -- the tree
    def _resolve(self, path: str) -> str:
        """``path`` (under /waf/, without it) through the aliases (symbolic links), bounded."""
        for _ in range(100):
            for alias, target in self.aliases.items():
                if path.startswith(alias):
                    path = target + path[len(alias):]
                    break
            else:
                return path
        return path

    def _style(self, folder: str) -> str:
        if folder in self.styles:
            return self.styles[folder]
        if self.style != "mixed":
            return self.style
        return STYLES[(folder.count("/") + sum(folder.encode())) % len(STYLES)]

    def _entries(self, folder: str) -> tuple[list[tuple[str, WafFile]], list[tuple[str, datetime]]]:
        """(files, sub-folders with their newest date) directly in ``folder``."""
        files, folders = [], {}
        for path, f in self.files.items():
            if not path.startswith(folder):
                continue
            rest = path[len(folder):]
            if "/" in rest:
                name = rest.split("/", 1)[0] + "/"
                folders[name] = max(folders.get(name, f.modified), f.modified)
            else:
                files.append((rest, f))
        for alias in self.aliases:
            if alias.startswith(folder) and alias.count("/") == folder.count("/") + 1:
                folders.setdefault(alias[len(folder):], datetime(2024, 1, 1))
        return sorted(files, key=lambda e: e[0]), sorted(folders.items())

    def listing(self, folder: str) -> str:
        files, folders = self._entries(folder)
        style = self._style(folder)
        here = ROOT + folder
        rows = [(name, f.modified, str(f.size) if style.startswith("iis") else _size(f.size), False)
                for name, f in files]
        rows = [(name, when, "-", True) for name, when in folders] + rows
        if style == "apache":
            body = "".join(
                f'<tr><td valign="top"><img src="/icons/{"folder" if d else "text"}.gif" '
                f'alt="[{"DIR" if d else "TXT"}]"></td><td><a href="{quote(n)}">{escape(n)}</a></td>'
                f'<td align="right">{w:%Y-%m-%d %H:%M}  </td>'
                f'<td align="right">{s}</td><td>&nbsp;</td></tr>\n' for n, w, s, d in rows)
            return ('<!DOCTYPE HTML PUBLIC "-//W3C//DTD HTML 3.2 Final//EN">\n<html>\n <head>\n  <title>Index of '
                    f'{escape(here)}</title>\n </head>\n <body>\n<h1>Index of {escape(here)}</h1>\n  <table>\n'
                    '   <tr><th valign="top"><img src="/icons/blank.gif" alt="[ICO]"></th>'
                    '<th><a href="?C=N;O=D">Name</a></th><th><a href="?C=M;O=A">Last modified</a></th>'
                    '<th><a href="?C=S;O=A">Size</a></th>'
                    '<th><a href="?C=D;O=A">Description</a></th></tr>\n   <tr><th colspan="5"><hr></th></tr>\n'
                    f'<tr><td valign="top"><img src="/icons/back.gif" alt="[PARENTDIR]"></td><td><a href="'
                    f'{escape(here.rsplit("/", 2)[0] + "/")}">Parent Directory</a></td><td>&nbsp;</td>'
                    f'<td align="right">  - </td><td>&nbsp;</td></tr>\n{body}'
                    '   <tr><th colspan="5"><hr></th></tr>\n</table>\n</body></html>\n')
        if style == "apache-pre":
            body = "".join(f'      <a href="{quote(n)}">{escape(n)}</a>{" " * max(1, 24 - len(n))}{w:%Y-%m-%d %H:%M}'
                           f'  {s:>4}  \n' for n, w, s, d in rows)
            return (f'<!DOCTYPE HTML PUBLIC "-//W3C//DTD HTML 3.2 Final//EN">\n<html>\n <head>\n  <title>Index of '
                    f'{escape(here)}</title>\n </head>\n <body>\n<h1>Index of {escape(here)}</h1>\n<pre>      '
                    '<a href="?C=N;O=D">Name</a>                    <a href="?C=M;O=A">Last modified</a>      '
                    '<a href="?C=S;O=A">Size</a>  <a href="?C=D;O=A">Description</a><hr>      <a href="/">Parent '
                    f'Directory</a>                             -   \n{body}<hr></pre>\n</body></html>\n')
        if style == "apache-nodates":
            body = "".join(f'<li><a href="{quote(n)}"> {escape(n)}</a></li>\n' for n, w, s, d in rows)
            return (f'<!DOCTYPE HTML PUBLIC "-//W3C//DTD HTML 3.2 Final//EN">\n<html>\n <head>\n  <title>Index of '
                    f'{escape(here)}</title>\n </head>\n <body>\n<h1>Index of {escape(here)}</h1>\n'
                    f'<ul><li><a href="#NO"> Parent Directory</a></li>\n{body}</ul>\n</body></html>\n')
        if style == "nginx":
            body = "".join(f'<a href="{quote(n)}">{escape(n)}</a>{" " * max(1, 51 - len(n))}'
                           f'{w.strftime("%d-%b-%Y %H:%M")}{s:>20}\n' for n, w, s, d in rows)
            return (f'<html>\n<head><title>Index of {escape(here)}</title></head>\n<body>\n<h1>Index of '
                    f'{escape(here)}</h1><hr><pre><a href="../">../</a>\n{body}</pre><hr></body>\n</html>\n')
        if style in ("iis", "iis-long"):
            def when(w: datetime) -> str:
                clock = f"{(w.hour % 12) or 12}:{w.minute:02d} {'PM' if w.hour >= 12 else 'AM'}"
                if style == "iis":
                    return f"{w.month}/{w.day}/{w.year} {clock:>8}"
                return f"{w:%A}, {w:%B} {w.day}, {w.year} {clock:>8}"
            body = "".join(f'{when(w):>30} {"&lt;dir&gt;" if d else s:>12} <A HREF="{quote(here + n)}">'
                           f'{escape(n.rstrip("/"))}</A><br>' for n, w, s, d in rows)
            return (f'<html><head><title>localhost - {escape(here)}</title></head><body><H1>localhost - '
                    f'{escape(here)}</H1><hr>\n\n<pre><A HREF="{escape(here.rsplit("/", 2)[0] + "/")}">[To Parent '
                    f'Directory]</A><br><br>{body}</pre><hr></body></html>')
        raise ValueError(f"style {style!r}: one of {', '.join(STYLES)}")

    # -- answers
    def _answer(self, path: str, headers: dict) -> tuple[int, dict, bytes | None, str | None]:
        """(status, headers, body, the endless file's name or None)."""
        failure = self._fail.take()
        if failure:
            return failure[0], {}, b"<html><body>Service Unavailable</body></html>", None
        for old, new in self.moved.items():
            if path.startswith(old):
                return 301, {"Location": new + path[len(old):]}, b"", None
        if not path.startswith(ROOT):
            if path + "/" == ROOT:
                return 301, {"Location": ROOT}, b"", None
            return 404, {}, b"<html><body>Not Found</body></html>", None
        rel = self._resolve(unquote(path[len(ROOT):]))
        if rel.rsplit("/", 1)[-1] == "index.html" and rel not in self.files:
            rel = rel[:-len("index.html")]  # a folder's listing answers at its index page too
        html = {"Content-Type": "text/html;charset=utf-8"}
        if rel == "" or rel.endswith("/"):
            if rel in self.forbidden:
                return 403, html, b"<html><body><h1>Forbidden</h1></body></html>", None
            if rel in self.error_pages:
                return 200, html, ERROR_PAGE, None
            files, folders = self._entries(rel)
            if rel and not files and not folders:
                return 404, html, b"<html><body>Not Found</body></html>", None
            return 200, html, self.listing(rel).encode(), None
        if rel in self.endless:
            return 200, {"Content-Type": "application/xml"}, None, rel
        with self._lock:
            found = self.files.get(rel)
        if found is None:
            if any(p.startswith(rel + "/") for p in self.files):
                return 301, {"Location": path + "/"}, b"", None
            return 404, html, b"<html><body>Not Found</body></html>", None
        with self._lock:
            if self._file_failures:
                after, times, status = self._file_failures
                if self._answered_files >= after and times > 0:
                    self._file_failures[1] -= 1
                    return status, html, b"<html><body>Internal Server Error</body></html>", None
        data = found.data()
        etag = '"' + hashlib.sha1(data).hexdigest()[:16] + '"'
        last_modified = _http_date(found.modified)
        validators = {"ETag": etag, "Last-Modified": last_modified, "Content-Type": "application/xml"}
        if headers.get("if-none-match") == etag or (
                "if-none-match" not in headers and headers.get("if-modified-since") == last_modified):
            return 304, validators, b"", None
        with self._lock:
            self._answered_files += 1
        return 200, validators, data, None

    def _handler(self):
        server = self

        class Handler(QuietHandler):
            content_type = "text/html"

            def setup(self):
                super().setup()
                # headers and body are two writes: without this, Nagle's algorithm and the client's
                # delayed ACK hold each body ~40 ms (a WAF is a request a file)
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self):
                path = urlsplit(self.path).path
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, extra, body, endless = server._answer(path, headers)
                with server._lock:
                    server.requests.append((path, headers, status))
                if endless is not None:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    chunk = b"<gmd:keyword>" + b"x" * 65_000 + b"</gmd:keyword>\n"
                    line = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
                    try:
                        self.wfile.write(b"5\r\n<?xml\r\n")
                        for _ in range(4000):  # ~256 MB at most, should the client never stop
                            self.wfile.write(line)
                    except (BrokenPipeError, ConnectionResetError, OSError):
                        pass
                    self.close_connection = True
                    return
                if server.gzip and body and "gzip" in headers.get("accept-encoding", ""):
                    body = gzip.compress(body)
                    extra = {**extra, "Content-Encoding": "gzip"}
                cut = False
                if status == 200 and path.endswith("/"):
                    with server._lock:
                        cut, server.cut_listings = server.cut_listings > 0, max(0, server.cut_listings - 1)
                self.send_response(status)
                for k, v in extra.items():
                    self.send_header(k, v)
                # a listing cut short: the Content-Length promises more than comes before the close
                # (or, ``cut_quietly``, there is none: the close is the only end a client sees)
                if not (cut and server.cut_quietly):
                    self.send_header("Content-Length", str(len(body or b"") + (1000 if cut else 0)))
                elif cut:
                    self.send_header("Connection", "close")
                self.end_headers()
                if body:
                    self.wfile.write(body[:len(body) // 2] if cut else body)
                if cut:
                    self.close_connection = True

        return Handler


# -- catalogues built from the real records ---------------------------------------------------------------
_FOLDERS_A_LEVEL = 6


def folder_of(i: int, per_folder: int = 100) -> str:
    """The folder of the i-th file of a catalogue: nested two levels, six a level."""
    group = i // per_folder
    return f"g{group % _FOLDERS_A_LEVEL}/s{group // _FOLDERS_A_LEVEL}/"


def catalogue(n: int, *, start: datetime = datetime(2024, 1, 1), per_folder: int = 100,
              prefix: str = "record") -> dict[str, WafFile]:
    """n files derived from the five real records (a new fileIdentifier, a numbered title, a
    distinct minute each from ``start``), ``per_folder`` a folder in nested folders. Bodies are
    made when asked (a bench's 5,000 files would be 300 MB)."""
    bases = [real_record(name) for name in RECORDS]
    files = {}
    for i in range(n):
        base = bases[i % len(bases)]
        title, file_id = f"{prefix.capitalize()} {i}", f"{prefix}-{i:06d}"
        files[f"{folder_of(i, per_folder)}{prefix}-{i:06d}.xml"] = WafFile(
            (lambda b=base, t=title, f=file_id: derive(b, title=t, file_id=f)), start + timedelta(minutes=i))
    return files


def bench_catalogue(n: int):
    """(an unstarted server of ``n`` files in nested folders of every listing style, a function
    giving the URL to harvest once it runs)."""
    server = WafServer(catalogue(n, start=datetime(2024, 1, 1)))
    return server, lambda: server.url
