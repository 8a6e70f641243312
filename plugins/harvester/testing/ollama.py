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
        server.poison(text, "nan")  # a request holding this text answered as Ollama does when its vector
                                    # is NaN (or "short", "empty", "zero", "missing": see poison)
"""
from __future__ import annotations

import hashlib

import numpy as np

from harvester.testing.local_http import LocalAPIServer

_ERRORS = {500: "llama runner process has terminated: exit status 2",
           503: "server busy, please try again.  maximum pending requests exceeded",
           429: "too many requests"}


def pseudo_embedding(text: str, dimension: int) -> list[float]:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    vector = np.random.default_rng(seed).standard_normal(dimension)
    return (vector / np.linalg.norm(vector)).tolist()


def _bare(name: str) -> str:
    return name[: -len(":latest")] if name.endswith(":latest") else name


class FakeOllama(LocalAPIServer):
    name = "fake-ollama"
    content_type = "application/json; charset=utf-8"

    def __init__(self, models=None):
        super().__init__()
        self.models = dict(models or {"nomic-embed-text": 768, "all-minilm": 384})

    @property
    def url(self) -> str:
        return self.base_url

    def fail_next(self, n: int = 1, status: int = 500, retry_after: float | str | None = None) -> None:
        self._queue_failure(n, status, retry_after)

    # poison(text, how): ``nan`` as Ollama does for a NaN vector (HTTP 500 ``NAN_ERROR``, no vector
    # of the request comes back), ``short`` (one value less than the model's size), ``empty``
    # (``[]``), ``zero`` (every value 0) or ``missing`` (left out: the answer holds one vector fewer
    # than the texts sent, as a gateway dropping one would).
    POISONS = ("nan", "short", "empty", "zero", "missing")
    # What Ollama answers when a vector of the batch holds a NaN: its Go JSON encoder refuses it, so
    # the whole request fails (ollama/ollama#9639, #15582: bge-m3 on some GPUs).
    NAN_ERROR = "failed to encode response: json: unsupported value: NaN"

    @property
    def texts(self) -> list[str]:
        """Every text received in embedding requests, in order."""
        out = []
        for _, _, body in self.requests:
            inputs = body.get("input") if isinstance(body, dict) else None
            out.extend([inputs] if isinstance(inputs, str) else list(inputs or []))
        return out

    def _answer(self, path: str, headers: dict, raw: bytes):
        body = self._record(path, headers, raw)
        failure = self._next_failure()
        if path != "/api/embed":
            return 404, {}, "404 page not found"
        if failure:
            status, retry_after = failure
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
        with self._lock:
            poisoned = {t: self.poisoned[t] for t in inputs if t in self.poisoned}
        if "nan" in poisoned.values():
            return 500, {}, {"error": self.NAN_ERROR}
        embeddings = []
        for text in inputs:
            vector = pseudo_embedding(text, dimension)
            how = poisoned.get(text)
            if how == "missing":
                continue
            embeddings.append({"short": vector[:-1], "empty": [], "zero": [0.0] * dimension}.get(how, vector))
        return 200, {}, {"model": model, "embeddings": embeddings,
                         "total_duration": 14143917, "load_duration": 1019500,
                         "prompt_eval_count": sum(len(t.split()) for t in inputs)}

    def _get(self, path: str):
        return (200, {}, "Ollama is running") if path == "/" else (404, {}, "404 page not found")
