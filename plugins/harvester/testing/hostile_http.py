"""A local server that answers as a hostile or broken one would (test-only), for the guarded client's
tests (harvester.http.guard): each path is given a behaviour, and every request is recorded with
its headers (``requests``), so a test can tell what reached it (an Authorization header, a request
that should never have been made).

Behaviours (``serve(path, behaviour)``):
- ``Document(body, content_type, headers)``: a plain answer;
- ``Redirect(location, status)``;
- ``Drip(every, headers_too, body_first)``: the answer a byte every ``every`` seconds (its status
  line and headers too, when ``headers_too``), for as long as the client reads;
- ``Endless(chunk, prefix)``: a chunked answer, ``prefix`` then ``chunk`` again and again, that never
  ends (until the client goes, or ``cap`` bytes);
- ``Silent()``: the connection is accepted and nothing is ever sent.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from harvester.testing.local_http import LocalServer, QuietHandler


@dataclass
class Document:
    body: bytes
    content_type: str = "application/json"
    headers: dict = field(default_factory=dict)
    status: int = 200


@dataclass
class Redirect:
    location: str
    status: int = 302


@dataclass
class Drip:
    every: float = 1.0
    headers_too: bool = False
    content_type: str = "text/turtle"


@dataclass
class Endless:
    chunk: bytes = b"x" * 65536
    prefix: bytes = b""
    cap: int = 1 << 30  # stops after this many bytes, so a client that never stops is bounded too


@dataclass
class Silent:
    seconds: float = 600.0


@dataclass
class Seen:
    """A request the server received."""

    path: str
    headers: dict


class HostileServer(LocalServer):
    """A server on 127.0.0.1 (``host``: another loopback address, e.g. 127.0.0.2) whose paths
    behave as ``serve`` says; anything else is a 404. ``requests``: every request received."""

    name = "hostile-server"

    def __init__(self, host: str = "127.0.0.1"):
        self.routes: dict[str, object] = {}
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        super().__init__()
        if host != "127.0.0.1":  # (LocalServer binds 127.0.0.1: bind again where asked)
            from http.server import ThreadingHTTPServer

            self._server.server_close()
            self._server = ThreadingHTTPServer((host, 0), self._handler())
            self._server.daemon_threads = True

    def serve(self, path: str, behaviour) -> str:
        """Give ``path`` a behaviour; its URL."""
        self.routes[path] = behaviour
        return self.base_url + path

    def url(self, path: str) -> str:
        return self.base_url + path

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def hits(self) -> list[str]:
        """The path (and query) of every request received, in order."""
        return [r.path for r in self.seen()]

    def seen(self, path: str | None = None) -> list[Seen]:
        with self._lock:
            return [r for r in self.requests if path is None or r.path.split("?")[0] == path]

    def stop(self):
        self._stopping.set()
        super().stop()

    def _handler(self):
        server = self

        class Handler(QuietHandler):
            def do_GET(self):
                with server._lock:
                    server.requests.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}))
                behaviour = server.routes.get(self.path.split("?")[0])
                try:
                    self._answer(behaviour)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    self.close_connection = True

            def _answer(self, behaviour):
                if behaviour is None:
                    self.content_type = "text/plain"
                    self._send(404, b"not here")
                elif isinstance(behaviour, Document):
                    self.content_type = behaviour.content_type
                    self._send(behaviour.status, behaviour.body, behaviour.headers)
                elif isinstance(behaviour, Redirect):
                    self.content_type = "text/plain"
                    self._send(behaviour.status, b"moved", {"Location": behaviour.location})
                elif isinstance(behaviour, Drip):
                    self._drip(behaviour)
                elif isinstance(behaviour, Endless):
                    self._endless(behaviour)
                elif isinstance(behaviour, Silent):
                    server._stopping.wait(behaviour.seconds)
                    self.close_connection = True

            def _drip(self, drip: Drip):
                head = (f"HTTP/1.1 200 OK\r\nContent-Type: {drip.content_type}\r\n"
                        "Content-Length: 100000000\r\n\r\n").encode()
                if not drip.headers_too:
                    self.wfile.write(head)
                    self.wfile.flush()
                    head = b""
                body = head + b"@prefix dcat: <http://www.w3.org/ns/dcat#> .\n"
                sent = 0
                while not server._stopping.is_set() and sent < 100_000_000:
                    self.wfile.write(body[sent:sent + 1] if sent < len(body) else b"#")
                    self.wfile.flush()
                    sent += 1
                    time.sleep(drip.every)
                self.close_connection = True

            def _endless(self, endless: Endless):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if endless.prefix:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(endless.prefix), endless.prefix))
                sent = 0
                while sent < endless.cap and not server._stopping.is_set():
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(endless.chunk), endless.chunk))
                    sent += len(endless.chunk)
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

        return Handler
