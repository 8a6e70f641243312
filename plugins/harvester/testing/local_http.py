"""What the local stand-ins for outside HTTP APIs share (test-only): a threaded server on
127.0.0.1, the requests it received, queued failures, and JSON that ``json.dumps`` cannot write
(``Verbatim``, written by ``dumps``)."""
from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Verbatim:
    """A JSON value that the local portals write as ``text``, as it is (``dumps``): what
    ``json.dumps`` cannot write, such as objects nested 100,000 levels deep (it raises
    RecursionError at about 1,000), planted in a record. A leaf to Python: copied as itself."""

    def __init__(self, text: str):
        self.text = text

    def __copy__(self) -> "Verbatim":
        return self

    def __deepcopy__(self, memo) -> "Verbatim":
        return self

    def __repr__(self) -> str:
        return f"Verbatim({len(self.text)} characters)"


def nested(levels: int, leaf: str = '"bottom"') -> Verbatim:
    """``levels`` objects one in another (``{"in": {"in": ... leaf}}``), as JSON text."""
    return Verbatim('{"in": ' * levels + leaf + "}" * levels)


def dumps(value: Any, **kwargs) -> str:
    """``json.dumps(value, **kwargs)``, each ``Verbatim`` in it written as its text."""
    try:
        return json.dumps(value, **kwargs)  # (the common case, at json's own speed)
    except TypeError:
        pass
    planted: dict[str, str] = {}

    def default(obj):
        if isinstance(obj, Verbatim):
            mark = f"verbatim-{secrets.token_hex(16)}"
            planted[json.dumps(mark)] = obj.text
            return mark
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    text = json.dumps(value, default=default, **kwargs)
    for mark, raw in planted.items():
        text = text.replace(mark, raw, 1)
    return text


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler of the local servers: HTTP/1.1, no access log, and ``_send`` of a body
    with its ``content_type`` (``length``: a Content-Length other than the body's, for a body cut
    short)."""

    protocol_version = "HTTP/1.1"
    content_type = "application/json; charset=utf-8"

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes, headers: dict | None = None, length: int | None = None):
        self.send_response(status)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


class FailureQueue:
    """Failures queued for a local server's next requests, in order: ``add(n, *details)`` makes the
    next ``n`` requests that ask (``take()``) get ``details`` (the server decides what they mean).
    Thread-safe: handler threads take while a test adds."""

    def __init__(self):
        self._entries: list[list] = []
        self._lock = threading.Lock()

    def add(self, n: int, *details) -> None:
        with self._lock:
            self._entries.append([n, *details])

    def take(self) -> list | None:
        """The details of the next queued failure (its count used up), or None."""
        with self._lock:
            if not self._entries:
                return None
            entry = self._entries[0]
            entry[0] -= 1
            if entry[0] <= 0:
                self._entries.pop(0)
            return entry[1:]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class LocalServer:
    """A threaded HTTP server on 127.0.0.1 (a free port) serving the handler class ``_handler()``
    builds, in a daemon thread between ``start()`` and ``stop()`` (or as a context manager)."""

    name = "local-server"

    def __init__(self):
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self):
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=self.name,
                         daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class LocalAPIServer(LocalServer):
    """Subclasses answer ``_answer(path, headers, raw) -> (status, extra headers, body)`` for POSTs
    and may answer GETs with ``_get(path)``; a str body is sent as text, bytes as JSON already
    encoded, anything else as JSON."""

    name = "local-api"
    content_type = "application/json; charset=UTF-8"

    # The ways an embedding stand-in can answer a text's vector wrong (``poison``); its class says
    # what each means for its protocol.
    POISONS: tuple[str, ...] = ()

    def __init__(self):
        self.requests: list[tuple[str, dict, object]] = []
        self._fail = FailureQueue()
        self._lock = threading.Lock()
        self.poisoned: dict[str, str] = {}  # text -> how its vector is answered wrong (poison)
        super().__init__()

    def poison(self, text: str, how: str = "nan") -> None:
        """From now on, whenever ``text`` is in a request, its vector is answered wrong in the way
        ``how`` names (one of the class's POISONS), the rest of the answer as usual. ``unpoison``
        ends it."""
        if how not in self.POISONS:
            raise ValueError(f"poison {how!r}: one of {', '.join(self.POISONS)}")
        with self._lock:
            self.poisoned[text] = how

    def unpoison(self, text: str) -> None:
        with self._lock:
            self.poisoned.pop(text, None)

    def _record(self, path: str, headers: dict, raw: bytes):
        """Parse a request's JSON body (None if it is not JSON) and remember the request."""
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        with self._lock:
            self.requests.append((path, headers, body))
        return body

    def _queue_failure(self, n: int, *details) -> None:
        self._fail.add(n, *details)

    def _next_failure(self):
        """The details of the next queued failure (its count used up), or None."""
        return self._fail.take()

    def _answer(self, path: str, headers: dict, raw: bytes):  # pragma: no cover - subclasses answer
        raise NotImplementedError

    def _get(self, path: str):
        return 404, {}, {"error": f"Path {path} was not found."}

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _reply(self, status, extra, body):
                text = isinstance(body, str)
                # bytes: JSON already encoded (a bench's server answering thousands of vectors)
                data = body if isinstance(body, bytes) else body.encode() if text else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8" if text else api.content_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    self._reply(*api._answer(self.path, headers, raw))
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
                    pass

            def do_GET(self):
                self._reply(*api._get(self.path))

        return Handler
