"""The Gemini provider: gemini-embedding-001 through the official google-genai SDK.

Configuration (environment):

- ``GEMINI_EMBEDDING_MODEL`` (default ``gemini-embedding-001``)
- ``GEMINI_EMBEDDING_DIMENSION`` (default 768): ``output_dimensionality``; vectors are
  L2-normalized after the API truncates them. The dimension is part of the model identity
  stored with each vector (``gemini-embedding-001@768``), so sizes never mix.
- the API key: the password of the Airflow connection ``gemini_default`` when Airflow is there
  and the connection exists, else ``GEMINI_API_KEY``
- ``GEMINI_BASE_URL``: another endpoint (a proxy, or a local fake in tests)
- ``GEMINI_TIMEOUT``: seconds per request (default 60)

One ``embed_documents`` call is exactly one ``batchEmbedContents`` request of at most 100 texts
(the API's limit). It returns the vectors the answer holds, as they are: another count than the
texts, a vector of another size, empty or NaN is judged by the embed step (embeddings/batching.py),
which refuses those texts alone. The SDK neither splits batches nor retries (no ``retry_options`` is set):
retrying is the caller's business, guided by the error classes below.

Errors: HTTP 429 -> ``RateLimited`` (with ``retry_after`` from Retry-After or Google's RetryInfo);
5xx, 408, timeouts, connection errors -> ``EmbeddingError`` (transient); a rejected key (400
API_KEY_INVALID, 401, 403) and other 4xx -> ``TerminalEmbeddingError``. The API key never
appears in an error's message, its chain (errors are raised outside the SDK's ``except`` block,
so they carry no ``__cause__`` or ``__context__``), or this object's ``repr``.
"""
from __future__ import annotations

import logging
import re
import threading
from typing import Sequence

import numpy as np

from harvester.config.secrets import lookup_connection
from harvester.config.settings import SettingError, default, env_value, setting
from harvester.domain.dataset import MAX_TEXT_CHARS
from harvester.embeddings.base import EmbeddingError, RateLimited, TerminalEmbeddingError

DEFAULT_MODEL = default("GEMINI_EMBEDDING_MODEL")  # gemini-embedding-001
DEFAULT_DIMENSION = default("GEMINI_EMBEDDING_DIMENSION")  # 768
MAX_DIMENSION = setting("GEMINI_EMBEDDING_DIMENSION").high  # 3072
MAX_BATCH = 100  # batchEmbedContents rejects more requests per batch
CONNECTION_ID = "gemini_default"
DEFAULT_ENDPOINT = "https://generativelanguage.googleapis.com"
KEY_HELP = (f"set the password of the Airflow connection {CONNECTION_ID} "
            f"(e.g. AIRFLOW_CONN_GEMINI_DEFAULT='{{\"conn_type\": \"generic\", \"password\": \"<key>\"}}') "
            "or the environment variable GEMINI_API_KEY")

# Made once per provider, however many threads embed at once: the SDK's client (its httpx
# connection pool) is shared by them, and httpx clients are safe to call from several threads.
_CLIENT_LOCK = threading.Lock()
_GOOGLE_KEY = re.compile(r"AIza[0-9A-Za-z_\-]{6,}")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")
# The HTTP libraries the SDK may use log every request at INFO ("HTTP Request: POST .../
# batchEmbedContents "HTTP/1.1 200 OK""): one line per 100 texts, 10,000 lines in the task logs of a
# first sync of a million datasets (bench/scale_bench.py), telling an operator nothing the embed
# step's progress lines do not. Quieted to WARNING unless a level was configured for them.
_REQUEST_LOGGERS = ("httpx", "httpx2")


def _quiet_request_logs() -> None:
    for name in _REQUEST_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def api_key_from_settings() -> str | None:
    """The ``gemini_default`` connection's password if Airflow can give it, else ``GEMINI_API_KEY``."""
    try:
        conn = lookup_connection(CONNECTION_ID)
    except Exception:  # noqa: BLE001  no Airflow here, or no backend to ask: the variable will do
        conn = None
    password = conn.password if conn is not None else None
    if password and password.strip():
        return password.strip()
    return env_value("GEMINI_API_KEY")


def _transport_errors() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(timeout, other transport) exception classes of the HTTP libraries the SDK may use."""
    timeouts: list[type] = []
    transport: list[type] = []
    for module_name in ("httpx", "httpx2"):
        try:
            module = __import__(module_name)
        except ImportError:
            continue
        for attr, bucket in (("TimeoutException", timeouts), ("TransportError", transport)):
            cls = getattr(module, attr, None)
            if isinstance(cls, type):
                bucket.append(cls)
    return tuple(timeouts), tuple(transport)


class GeminiProvider:
    name = "gemini"
    max_batch = MAX_BATCH

    def __init__(self, *, api_key: str | None = None, model: str | None = None, dimension: int | None = None,
                 base_url: str | None = None, timeout: float | None = None):
        try:  # the GEMINI_* settings (config/settings.py: ranges, messages); a bad one is terminal
            self.model_name = (model or env_value("GEMINI_EMBEDDING_MODEL")).strip()
            self.dimension = int(dimension) if dimension is not None else env_value("GEMINI_EMBEDDING_DIMENSION")
            self.base_url = (base_url or env_value("GEMINI_BASE_URL") or "").strip() or None
            self.timeout = float(timeout if timeout is not None else env_value("GEMINI_TIMEOUT"))
        except SettingError as exc:
            raise TerminalEmbeddingError(str(exc)) from None
        if self.model_name.startswith("models/"):
            self.model_name = self.model_name[len("models/"):]
        if not 1 <= self.dimension <= MAX_DIMENSION:
            raise TerminalEmbeddingError(f"GEMINI_EMBEDDING_DIMENSION={self.dimension} must be from 1 to "
                                         f"{MAX_DIMENSION} (gemini-embedding-001 recommends 768, 1536 or 3072)")
        self.model = f"{self.model_name}@{self.dimension}"
        self._api_key = api_key.strip() if api_key else None  # resolved at the first request otherwise
        self._client = None
        self._key: str | None = None

    def __repr__(self) -> str:
        return f"GeminiProvider(model={self.model!r}, endpoint={self.endpoint!r})"

    @property
    def endpoint(self) -> str:
        return self.base_url or DEFAULT_ENDPOINT

    # -- the SDK ----------------------------------------------------------------------------------
    def _get_client(self):
        if self._client is not None:
            return self._client
        with _CLIENT_LOCK:
            if self._client is None:
                self._client = self._new_client()
            return self._client

    def _new_client(self):
        try:
            from google import genai
            from google.genai import types
        except ImportError:
            raise TerminalEmbeddingError("the gemini embedding provider needs google-genai: "
                                         "pip install -r requirements.txt") from None
        key = self._api_key or api_key_from_settings()
        if not key:
            raise TerminalEmbeddingError(f"no Gemini API key: {KEY_HELP}")
        options = types.HttpOptions(timeout=int(self.timeout * 1000))  # milliseconds; no retry_options: no retries
        if self.base_url:
            options.base_url = self.base_url
        self._key = key
        _quiet_request_logs()
        return genai.Client(api_key=key, vertexai=False, http_options=options)

    def _scrub(self, text: str) -> str:
        if self._key:
            text = text.replace(self._key, "***")
        return _GOOGLE_KEY.sub("AIza***", text)

    def _embed(self, texts: list[str], task_type: str) -> list[np.ndarray]:
        import orjson

        client = self._get_client()
        model = f"models/{self.model_name}"
        # Deterministic cap (the model reads at most 2048 tokens); the API rejects empty parts. One
        # request (one Content) per text: batchEmbedContents answers one vector for each.
        body = {"requests": [{"model": model, "content": {"role": "user", "parts": [
                    {"text": text[:MAX_TEXT_CHARS] if text.strip() else " "}]},
                              "taskType": task_type, "outputDimensionality": self.dimension} for text in texts]}
        error: EmbeddingError | None = None
        try:
            # The SDK's own request (endpoint, key header, timeout, errors raised as
            # google.genai.errors), the body being what models.embed_content sends; the answer is
            # read here rather than by embed_content, whose pydantic objects cost about 50 ms of CPU
            # for 100 vectors of 768 dimensions, twice the JSON parsing, holding the GIL the other
            # requests in flight wait for (py-spy over bench/first_sync_bench.py (f)). Pinned
            # google-genai (requirements.txt); tests/embeddings/test_providers.py checks the wire.
            response = client._api_client.request("post", f"{model}:batchEmbedContents", body)
        except Exception as exc:  # noqa: BLE001 - every failure becomes one of ours, scrubbed
            error = self._map_error(exc)
        if error is not None:
            # Raised here, not in the except block: no __context__ holding the SDK's request (and key).
            raise error
        try:
            answer = orjson.loads(response.body or "{}")
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise EmbeddingError(f"Gemini answered {len(response.body or '')} bytes that are not a JSON object")
        embeddings = answer.get("embeddings")
        if not isinstance(embeddings, list):
            raise EmbeddingError(f"Gemini returned no embeddings for {len(texts)} texts")
        # What came, as it came: the caller judges each vector (batching: another count than the texts,
        # a vector of another size, empty, NaN -- "NaN" / "Infinity" in Google's JSON -- is refused for
        # its text alone; embed_query: an error), so one bad text never costs a batch.
        rows = [e.get("values") or [] if isinstance(e, dict) else [] for e in embeddings]
        try:
            if all(len(row) == self.dimension for row in rows):
                vectors = list(np.array(rows, dtype=np.float64).reshape(len(rows), self.dimension))
            else:
                vectors = [np.array(row, dtype=np.float64) for row in rows]
        except (TypeError, ValueError):
            raise EmbeddingError("Gemini returned a vector with values that are not numbers") from None
        out = []
        with np.errstate(invalid="ignore", over="ignore"):  # NaN in, NaN out: refused by the caller
            for vector in vectors:
                norm = np.linalg.norm(vector) if vector.shape == (self.dimension,) else 0.0
                out.append((vector / norm if norm else vector).astype(np.float32))
        return out

    def _map_error(self, exc: Exception) -> EmbeddingError:
        from google.genai import errors as genai_errors

        if isinstance(exc, genai_errors.APIError):
            return self._map_api_error(exc)
        timeouts, transport = _transport_errors()
        if timeouts and isinstance(exc, timeouts):
            return EmbeddingError(f"Gemini did not answer within {self.timeout:g}s at {self.endpoint} "
                                  f"({type(exc).__name__})")
        if transport and isinstance(exc, transport):
            from harvester.http.guard import failure_text  # (one wording of network failures)

            return EmbeddingError(f"could not reach Gemini at {self.endpoint}: {self._scrub(failure_text(exc))}")
        return EmbeddingError(f"Gemini embedding request failed: {type(exc).__name__}: {self._scrub(str(exc))}")

    def _map_api_error(self, exc) -> EmbeddingError:
        code = int(exc.code or 0)
        status = exc.status or ""
        message = self._scrub(str(exc.message or "")).strip()
        body = exc.details if isinstance(exc.details, dict) else {}
        if isinstance(body.get("error"), dict):
            body = body["error"]
        details = [d for d in body.get("details") or [] if isinstance(d, dict)]
        reasons = {d.get("reason") for d in details if d.get("reason")}
        label = f"HTTP {code} {status}".strip()
        said = f": {message}" if message else ""
        if code == 429:
            return RateLimited(f"Gemini rate limit or quota exceeded ({label}){said}",
                               retry_after=self._retry_after(exc, details))
        if code == 408 or code >= 500:
            return EmbeddingError(f"Gemini failed ({label}), trying again later may succeed{said}")
        if "API_KEY_INVALID" in reasons or code in (401, 403):
            why = "API_KEY_INVALID" if "API_KEY_INVALID" in reasons else status
            return TerminalEmbeddingError(
                f"Gemini rejected the API key (HTTP {code} {why}): check GEMINI_API_KEY or the {CONNECTION_ID} "
                f"connection" + (f". Gemini said: {message}" if message else ""))
        if code == 404:
            return TerminalEmbeddingError(f"Gemini has no embedding model {self.model_name!r} ({label}): "
                                          f"check GEMINI_EMBEDDING_MODEL{said}")
        return TerminalEmbeddingError(f"Gemini refused the request ({label}){said}")

    @staticmethod
    def _retry_after(exc, details: list[dict]) -> float | None:
        from harvester.http import retry_after_seconds as _retry_after_seconds

        headers = getattr(getattr(exc, "response", None), "headers", None)
        if headers is not None:
            seconds = _retry_after_seconds(headers.get("retry-after"))
            if seconds is not None:
                return seconds
        for detail in details:
            if str(detail.get("@type", "")).endswith("google.rpc.RetryInfo"):
                match = _DURATION.match(str(detail.get("retryDelay", "")))
                if match:
                    return float(match.group(1))
        return None

    # -- the provider interface --------------------------------------------------------------------
    def embed_documents(self, texts: Sequence[str]) -> list[Sequence[float]]:
        texts = list(texts)
        if len(texts) > self.max_batch:
            raise ValueError(f"{len(texts)} texts in one request: the Gemini API takes at most {self.max_batch}")
        if not texts:
            return []
        return self._embed(texts, "RETRIEVAL_DOCUMENT")

    def embed_query(self, text: str) -> Sequence[float]:
        vectors = self._embed([text], "RETRIEVAL_QUERY")
        if len(vectors) != 1:
            raise EmbeddingError(f"Gemini returned {len(vectors)} embeddings for 1 texts")
        if vectors[0].shape != (self.dimension,):
            raise TerminalEmbeddingError(f"Gemini returned a vector of {vectors[0].size} dimensions, "
                                         f"expected {self.dimension} ({self.model})")
        if not np.isfinite(vectors[0]).all() or not vectors[0].any():
            raise EmbeddingError(f"Gemini returned a vector that is not finite, or all zeros, for the query "
                                 f"({self.model})")
        return vectors[0]
