"""A local stand-in for the Gemini API's embedding endpoint, speaking its wire protocol (test-only).

``POST /<v1|v1beta>/models/<model>:batchEmbedContents`` with the key in ``x-goog-api-key`` and
``{"requests": [{"model": "models/<model>", "content": {"parts": [{"text": ...}]}, "taskType": ...,
"outputDimensionality": ...}, ...]}`` answers ``{"embeddings": [{"values": [...]}, ...]}``, as
google-genai sends and expects it. Vectors are deterministic pseudo-embeddings: 3072 values seeded
by SHA-256 of the task type and text, unit length at 3072, cut to ``outputDimensionality``
without renormalizing (as the real API does for smaller sizes).

Errors use Google's JSON error bodies: 400 INVALID_ARGUMENT with reason API_KEY_INVALID for an
unknown key, 403 PERMISSION_DENIED with no key, 400 for more than 100 requests in a batch, 404 for
an unknown model, and whatever ``fail_next`` queues (429 RESOURCE_EXHAUSTED with optional
Retry-After header and RetryInfo detail, 500 INTERNAL, 503 UNAVAILABLE, ...).

    with FakeGemini(valid_keys={"AIza-good"}) as server:
        server.base_url          # http://127.0.0.1:<port>
        server.fail_next(1, 429, retry_delay="7s")
        server.requests          # [(path, headers (lower-case names), parsed JSON body), ...]
        server.hold_until_in_flight(4)  # requests wait until 4 are being answered at once
        server.peak_in_flight    # the most requests it was answering at once
        server.poison(text, "nan")      # this text's vector answered with "NaN" values (or "inf",
                                        # "short", "empty", "zero", "missing": see poison)
"""
from __future__ import annotations

import hashlib
import re
import threading
import time
import zlib

import numpy as np
import orjson

from harvester.testing.local_http import LocalAPIServer

FULL_DIMENSION = 3072
MAX_BATCH = 100
_PATH = re.compile(r"^/(v1|v1beta)/models/([^/:?]+):batchEmbedContents$")

_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           408: "DEADLINE_EXCEEDED", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 502: "UNAVAILABLE",
           503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
_MESSAGES = {
    429: "You exceeded your current quota, please check your plan and billing details. For more "
         "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.",
    500: "An internal error has occurred. Please retry or report in "
         "https://developers.generativeai.google/guide/troubleshooting",
    503: "The model is overloaded. Please try again later.",
}


TEST_KEY = "AIza-test-key-for-harvester"  # the key the tests configure and the stand-in accepts


def pseudo_vector(text: str, task_type: str | None, dimension: int | None) -> np.ndarray:
    """A random direction seeded by the text (and task type): unrelated texts, unrelated vectors."""
    seed = int.from_bytes(hashlib.sha256(f"{task_type or ''}\0{text}".encode()).digest()[:8], "big")
    full = np.random.default_rng(seed).standard_normal(FULL_DIMENSION)
    full /= np.linalg.norm(full)
    # The API's values are float32 (protobuf ``float``): its JSON carries about nine significant
    # digits, not the seventeen of a float64 repr.
    return full[: dimension or FULL_DIMENSION].astype(np.float32)


def pseudo_embedding(text: str, task_type: str | None, dimension: int | None) -> list[float]:
    return pseudo_vector(text, task_type, dimension).tolist()


class WordVectors:
    """Vectors shaped like real text embeddings, for benches (``FakeGemini(vectors="words")``):
    every word has a fixed direction (one of ``size`` rows, chosen by the word's CRC32), drawn
    mostly within a fixed ``rank``-dimensional subspace plus a little noise; a text's vector is
    the normalized sum of its words' directions. Texts sharing words are near each other and the
    data has a low intrinsic dimension, as with real sentence embeddings (bench/search_bench.py's
    stand-in, without its corpus-wide IDF: this server sees one batch at a time). Random
    directions (the default) are the hardest case there is for an HNSW index, to build and to
    search: no real model's vectors look like that."""

    WORD = re.compile(r"\w+")

    def __init__(self, rank: int = 64, size: int = 1 << 15):
        self.rank, self.size = rank, size
        self._tables: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def table(self, dimension: int) -> np.ndarray:
        with self._lock:
            table = self._tables.get(dimension)
            if table is None:
                rng = np.random.default_rng(dimension)
                basis = np.linalg.qr(rng.standard_normal((dimension, self.rank)))[0].T
                noise = 0.3 * (self.rank / dimension) ** 0.5
                table = self._tables[dimension] = (rng.standard_normal((self.size, self.rank)) @ basis
                                                   + rng.standard_normal((self.size, dimension)) * noise
                                                   ).astype(np.float32)
            return table

    def __call__(self, text: str, task_type: str | None, dimension: int | None) -> np.ndarray:
        words = self.WORD.findall(text.lower())[:200] or [""]
        rows = np.fromiter((zlib.crc32(w.encode()) % self.size for w in words), dtype=np.int64, count=len(words))
        vector = self.table(dimension or FULL_DIMENSION)[rows].sum(axis=0)
        return vector / (np.linalg.norm(vector) or 1.0)


def error_body(code: int, message: str | None = None, details: list | None = None) -> dict:
    body = {"code": code, "message": message or _MESSAGES.get(code, f"HTTP {code}"),
            "status": _STATUS.get(code, "UNKNOWN")}
    if details:
        body["details"] = details
    return {"error": body}


class FakeGemini(LocalAPIServer):
    name = "fake-gemini"

    def __init__(self, valid_keys=("AIza-fake-valid-key",), models=("gemini-embedding-001",), vectors: str = "random"):
        """``vectors``: "random" (pseudo_vector: a random direction per text) or "words"
        (WordVectors: like real embeddings)."""
        super().__init__()
        if vectors not in ("random", "words"):
            raise ValueError(f"vectors={vectors!r}: random or words")
        self.vector = pseudo_vector if vectors == "random" else WordVectors()
        self.valid_keys = set(valid_keys)
        self.models = set(models)
        self.delay = 0.0  # seconds to wait before answering (timeouts)
        self.in_flight = 0  # requests being answered now
        self.peak_in_flight = 0
        self._flight = threading.Condition()
        self._hold: int | None = None
        self._hold_timeout = 0.0
        self._odd_answers: list = []  # 200 answers to give instead of the vectors (answer_next)

    # -- control ------------------------------------------------------------------------------
    def fail_next(self, n: int = 1, status: int | None = 500, retry_after: float | str | None = None,
                  retry_delay: str | None = None, message: str | None = None) -> None:
        """The next ``n`` embedding requests answer ``status`` with Google's error body (None: they
        are answered normally, so failures can be queued after some successes).
        ``retry_after``: a Retry-After header; ``retry_delay`` (e.g. "7s"): a google.rpc.RetryInfo
        detail in the body, as Gemini sends on 429."""
        self._queue_failure(n, status, retry_after, retry_delay, message)

    def answer_next(self, body) -> None:
        """The next embedding request is answered 200 with ``body``: a str as it is (text/plain, as a
        proxy's page would be), anything else as JSON (an answer of the wrong shape)."""
        with self._lock:
            self._odd_answers.append(body)

    # poison(text, how): ``nan`` (its values "NaN", as Google's JSON writes a float NaN: proto3's
    # JSON mapping), ``inf`` (one value "Infinity"), ``short`` (one value less than asked for),
    # ``empty`` (``"values": []``), ``zero`` (every value 0) or ``missing`` (its embedding left out:
    # the answer holds one vector fewer than the texts sent).
    POISONS = ("nan", "inf", "short", "empty", "zero", "missing")

    def _poisoned(self, vector, how: str) -> list | None:
        values = vector.tolist()
        if how == "nan":
            return ["NaN"] * len(values)
        if how == "inf":
            return values[:1] and ["Infinity"] + values[1:]
        if how == "short":
            return values[:-1]
        if how == "empty":
            return []
        if how == "zero":
            return [0.0] * len(values)
        return None  # missing

    def hold_until_in_flight(self, n: int, timeout: float = 20.0) -> None:
        """Requests wait (before being answered) until ``n`` are being answered at once, then all
        go through, and later ones are not held. If ``n`` never arrive together, the hold ends
        after ``timeout`` seconds (and ``peak_in_flight`` shows how many did)."""
        with self._flight:
            self._hold, self._hold_timeout = n, timeout

    @property
    def texts(self) -> list[str]:
        """Every text received in successful or failed embedding requests, in order."""
        return [part["text"] for _, _, body in self.requests if isinstance(body, dict)
                for req in body.get("requests", []) for part in req["content"]["parts"]]

    # -- serving ------------------------------------------------------------------------------
    def _answer(self, path: str, headers: dict, raw: bytes):
        with self._flight:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            if self._hold is not None and self.in_flight >= self._hold:
                self._hold = None
                self._flight.notify_all()
            elif self._hold is not None:
                if not self._flight.wait_for(lambda: self._hold is None, timeout=self._hold_timeout):
                    self._hold = None  # they never came together: stop holding anyone
                    self._flight.notify_all()
        try:
            return self._respond(path, headers, raw)
        finally:
            with self._flight:
                self.in_flight -= 1

    def _respond(self, path: str, headers: dict, raw: bytes):
        """(status, extra headers, JSON body) for one request."""
        body = self._record(path, headers, raw)
        if self.delay:
            time.sleep(self.delay)
        with self._lock:
            odd = self._odd_answers.pop(0) if self._odd_answers else None
        if odd is not None:
            return 200, {}, odd
        match = _PATH.match(path.split("?", 1)[0])
        if not match:
            return 404, {}, error_body(404, f"Path {path} was not found.")
        key = headers.get("x-goog-api-key")
        if not key:
            return 403, {}, error_body(403, "Method doesn't allow unregistered callers (callers without "
                                            "established identity). Please use API Key or other form of API "
                                            "consumer identity to call this API.")
        if key not in self.valid_keys:
            return 400, {}, error_body(400, "API key not valid. Please pass a valid API key.", [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                 "domain": "googleapis.com",
                 "metadata": {"service": "generativelanguage.googleapis.com"}},
                {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US",
                 "message": "API key not valid. Please pass a valid API key."}])
        failure = self._next_failure()
        if failure and failure[0] is not None:
            status, retry_after, retry_delay, message = failure
            details = []
            if status == 429:
                details.append({"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                    "quotaMetric": "generativelanguage.googleapis.com/embed_content_free_tier_requests",
                    "quotaId": "EmbedContentRequestsPerMinutePerProjectPerModel-FreeTier"}]})
            if retry_delay is not None:
                details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay})
            extra = {} if retry_after is None else {"Retry-After": str(retry_after)}
            return status, extra, error_body(status, message, details)
        version, model = match.groups()
        if model not in self.models:
            return 404, {}, error_body(404, f"models/{model} is not found for API version {version}, or is not "
                                            "supported for embedContent. Call ListModels to see the list of "
                                            "available models and their supported methods.")
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not requests:
            return 400, {}, error_body(400, "* BatchEmbedContentsRequest.requests: contents is not specified")
        if len(requests) > MAX_BATCH:
            return 400, {}, error_body(400, f"* BatchEmbedContentsRequest.requests: at most {MAX_BATCH} "
                                            "requests can be in one batch")
        embeddings = []
        for i, req in enumerate(requests):
            if req.get("model") not in (None, f"models/{model}"):
                return 400, {}, error_body(400, f"* BatchEmbedContentsRequest.requests[{i}].model: unexpected "
                                                f"model name format or model mismatch")
            text = "".join(part.get("text", "") for part in req.get("content", {}).get("parts", []))
            vector = self.vector(text, req.get("taskType"), req.get("outputDimensionality"))
            with self._lock:
                how = self.poisoned.get(text)
            if how is not None:
                vector = self._poisoned(vector, how)
                if vector is None:
                    continue  # missing: one embedding fewer than the requests
            embeddings.append({"values": vector})
        # float32 arrays, written by orjson as the API writes them (each value's shortest float32 form)
        return 200, {}, orjson.dumps({"embeddings": embeddings}, option=orjson.OPT_SERIALIZE_NUMPY)

    def _get(self, path: str):
        return 404, {}, error_body(404, f"Path {path} was not found.")
