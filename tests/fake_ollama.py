"""A local stand-in for an Ollama server's embedding API, speaking its wire protocol (test-only).

``POST /api/embed`` with ``{"model": ..., "input": "text" | ["text", ...]}`` answers
``{"model": ..., "embeddings": [[...], ...], "total_duration", "load_duration", "prompt_eval_count"}``
with deterministic unit vectors (Ollama normalizes its embeddings) seeded by SHA-256 of the text;
an unknown model gets Ollama's 404 ``{"error": "model \\"x\\" not found, try pulling it first"}``.
``GET /`` answers "Ollama is running".

    with FakeOllama(models={"nomic-embed-text": 768}) as server:
        server.url                # http://127.0.0.1:<port>
        server.fail_next(1, 503)
        server.requests           # [(path, headers (lower-case names), parsed JSON body), ...]
"""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

_ERRORS = {500: "llama runner process has terminated: exit status 2",
           503: "server busy, please try again.  maximum pending requests exceeded",
           429: "too many requests"}


def pseudo_embedding(text: str, dimension: int) -> list[float]:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    vector = np.random.default_rng(seed).standard_normal(dimension)
    return (vector / np.linalg.norm(vector)).tolist()


def _bare(name: str) -> str:
    return name[: -len(":latest")] if name.endswith(":latest") else name


class FakeOllama:
    def __init__(self, models=None):
        self.models = dict(models or {"nomic-embed-text": 768, "all-minilm": 384})
        self.requests: list[tuple[str, dict, object]] = []
        self._fail: list[list] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def fail_next(self, n: int = 1, status: int = 500, retry_after: float | str | None = None) -> None:
        with self._lock:
            self._fail.append([n, status, retry_after])

    def start(self) -> "FakeOllama":
        threading.Thread(target=self._server.serve_forever, name="fake-ollama", daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _answer(self, path: str, headers: dict, raw: bytes):
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        with self._lock:
            self.requests.append((path, headers, body))
            failure = None
            if self._fail:
                failure = self._fail[0]
                failure[0] -= 1
                if failure[0] <= 0:
                    self._fail.pop(0)
        if path != "/api/embed":
            return 404, {}, "404 page not found"
        if failure:
            _, status, retry_after = failure
            return status, {} if retry_after is None else {"Retry-After": str(retry_after)}, \
                {"error": _ERRORS.get(status, f"HTTP {status}")}
        if not isinstance(body, dict):
            return 400, {}, {"error": "invalid character in JSON body"}
        model = body.get("model")
        if not model:
            return 400, {}, {"error": "model is required"}
        if _bare(model) not in self.models:
            return 404, {}, {"error": f'model "{model}" not found, try pulling it first'}
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
        dimension = self.models[_bare(model)]
        return 200, {}, {"model": model, "embeddings": [pseudo_embedding(t, dimension) for t in inputs],
                         "total_duration": 14143917, "load_duration": 1019500,
                         "prompt_eval_count": sum(len(t.split()) for t in inputs)}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _reply(self, status, extra, body):
                text = isinstance(body, str)
                data = body.encode() if text else json.dumps(body).encode()
                self.send_response(status)
                kind = "text/plain" if text else "application/json"
                self.send_header("Content-Type", f"{kind}; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._reply(*fake._answer(self.path, {k.lower(): v for k, v in self.headers.items()}, raw))

            def do_GET(self):
                if self.path == "/":
                    self._reply(200, {}, "Ollama is running")
                else:
                    self._reply(404, {}, "404 page not found")

        return Handler
