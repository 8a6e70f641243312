"""A local DCAT catalogue server (test-only): serves documents set by the test at paths of its
choice, with an ETag and Last-Modified per document, answering conditional requests with 304 as
a web server does, and recording every request."""
from __future__ import annotations

import hashlib
import threading
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler

from harvester.testing.local_http import LocalServer


class DcatServer(LocalServer):
    name = "dcat-server"

    def __init__(self):
        self.documents: dict[str, tuple[bytes, str, str, str]] = {}
        self.requests: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        self._version = 0
        super().__init__()

    def url(self, path: str) -> str:
        return self.base_url + path

    def set_document(self, path: str, body: bytes, content_type: str = "application/json") -> None:
        """Serve ``body`` at ``path`` from now on, with a new ETag when the body changed."""
        with self._lock:
            self._version += 1
            etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
            modified = formatdate(1_600_000_000 + self._version * 86400, usegmt=True)
            self.documents[path] = (body, content_type, etag, modified)

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                with server._lock:
                    server.requests.append((self.path, dict(self.headers)))
                    document = server.documents.get(self.path)
                if document is None:
                    self.send_response(404)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    self.wfile.write(b"not found")
                    return
                body, content_type, etag, modified = document
                if self.headers.get("If-None-Match") == etag or (
                        "If-None-Match" not in self.headers and self.headers.get("If-Modified-Since") == modified):
                    self.send_response(304)
                    self.send_header("ETag", etag)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("ETag", etag)
                self.send_header("Last-Modified", modified)
                self.end_headers()
                self.wfile.write(body)

        return Handler
