"""The Ollama provider: any embedding model served by an Ollama server, over its HTTP API.

``POST {OLLAMA_URL}/api/embed`` with ``{"model": ..., "input": [texts], "truncate": true}``
answers ``{"model": ..., "embeddings": [[...], ...]}`` (Ollama 0.3.4+).

Configuration (environment):

- ``OLLAMA_URL`` (default ``http://127.0.0.1:11434``)
- ``OLLAMA_EMBEDDING_MODEL`` (default ``nomic-embed-text``); the identity stored with each vector
  is ``ollama/<model>``
- ``OLLAMA_EMBEDDING_DIMENSION``: the vector size; when unset it is discovered by embedding a
  probe text the first time ``dimension`` is read
- ``OLLAMA_MAX_BATCH`` (default 64): texts per request
- ``OLLAMA_TIMEOUT``: seconds per request (default 120; a cold model may take a while to load)

Errors: 404 model not found -> ``TerminalEmbeddingError`` saying ``ollama pull <model>``; 429 ->
``RateLimited``; 5xx, 408, timeouts, connection errors -> ``EmbeddingError`` (transient); other
4xx -> ``TerminalEmbeddingError``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import requests

from harvester.config.secrets import redact_text, redact_url
from harvester.config.settings import SettingError, default, env_value
from harvester.domain.dataset import MAX_TEXT_CHARS
from harvester.embeddings.base import EmbeddingError, RateLimited, TerminalEmbeddingError

DEFAULT_URL = default("OLLAMA_URL")  # http://127.0.0.1:11434
DEFAULT_MODEL = default("OLLAMA_EMBEDDING_MODEL")  # nomic-embed-text
DEFAULT_MAX_BATCH = default("OLLAMA_MAX_BATCH")  # 64
PROBE_TEXT = "dimension probe"
POOL_SIZE = 64  # connections kept per host: HARVESTER_EMBED_CONCURRENCY's maximum


class OllamaProvider:
    name = "ollama"

    def __init__(self, *, url: str | None = None, model: str | None = None, dimension: int | None = None,
                 max_batch: int | None = None, timeout: float | None = None):
        try:  # the OLLAMA_* settings (config/settings.py: ranges, messages); a bad one is terminal
            self.url = (url or env_value("OLLAMA_URL")).strip().rstrip("/")
            self.model_name = (model or env_value("OLLAMA_EMBEDDING_MODEL")).strip()
            self.max_batch = int(max_batch or env_value("OLLAMA_MAX_BATCH"))
            self.timeout = float(timeout or env_value("OLLAMA_TIMEOUT"))
            self._dimension = int(dimension or env_value("OLLAMA_EMBEDDING_DIMENSION") or 0) or None
        except SettingError as exc:
            raise TerminalEmbeddingError(str(exc)) from None
        self.model = f"ollama/{self.model_name}"
        # Shared by the threads that embed at once (HARVESTER_EMBED_CONCURRENCY): enough pooled
        # connections that none is dropped and reopened.
        self._session = requests.Session()
        self._session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=POOL_SIZE))
        self._session.mount("https://", requests.adapters.HTTPAdapter(pool_maxsize=POOL_SIZE))

    def __repr__(self) -> str:
        return f"OllamaProvider(model={self.model!r}, url={redact_url(self.url)!r})"

    @property
    def dimension_needs_call(self) -> bool:
        """Reading ``dimension`` sends a request (the probe): the caller guards it like any call."""
        return self._dimension is None

    @property
    def dimension(self) -> int:
        """The vector size: configured, or learnt from one probe request on first use."""
        if self._dimension is None:
            self._dimension = len(self._request([PROBE_TEXT])[0])
        return self._dimension

    def _request(self, texts: list[str]) -> list[list[float]]:
        endpoint = f"{self.url}/api/embed"
        payload = {"model": self.model_name, "input": [text[:MAX_TEXT_CHARS] for text in texts], "truncate": True}
        error: EmbeddingError | None = None
        response = None
        try:
            response = self._session.post(endpoint, json=payload, timeout=self.timeout)
        except requests.Timeout:
            error = EmbeddingError(f"Ollama at {redact_url(self.url)} did not answer within {self.timeout:g}s")
        except requests.RequestException as exc:
            error = EmbeddingError(f"could not reach Ollama at {redact_url(self.url)}: {type(exc).__name__}: "
                                   f"{redact_text(str(exc))[:300]}")
        if error is None:
            error = self._check(response)
        if error is not None:
            raise error  # outside the except block: no chained request objects
        try:
            embeddings = response.json()["embeddings"]
        except (ValueError, KeyError, TypeError):
            raise EmbeddingError(f"Ollama at {redact_url(self.url)} answered without embeddings "
                                 f"(is {redact_url(self.url)} an Ollama server?)") from None
        if not isinstance(embeddings, list) or len(embeddings) != len(texts):
            raise EmbeddingError(f"Ollama returned {len(embeddings) if isinstance(embeddings, list) else 'no'} "
                                 f"embeddings for {len(texts)} texts")
        return embeddings

    def _check(self, response: requests.Response) -> EmbeddingError | None:
        code = response.status_code
        if code == 200:
            return None
        try:
            body = response.json()
            message = str(body.get("error") or body) if isinstance(body, dict) else str(body)
        except ValueError:
            message = response.text.strip()[:300]
        where = f"Ollama at {redact_url(self.url)}"
        if code == 404:
            if "not found" in message and "model" in message:
                return TerminalEmbeddingError(
                    f"{where} has no model {self.model_name!r} ({message}): run `ollama pull {self.model_name}` "
                    f"on the Ollama host, or set OLLAMA_EMBEDDING_MODEL")
            return TerminalEmbeddingError(f"{where} has no /api/embed (HTTP 404: {message}): it needs Ollama "
                                          "0.3.4 or later, or OLLAMA_URL is wrong")
        if code == 429:
            from harvester.http import retry_after_seconds as _retry_after_seconds

            return RateLimited(f"{where} is rate limiting (HTTP 429): {message}",
                               retry_after=_retry_after_seconds(response.headers.get("Retry-After")))
        if code == 408 or code >= 500:
            return EmbeddingError(f"{where} failed (HTTP {code}), trying again later may succeed: {message}")
        return TerminalEmbeddingError(f"{where} refused the request for model {self.model_name!r} "
                                      f"(HTTP {code}): {message}")

    def _normalized(self, embeddings: list[list[float]]) -> list[np.ndarray]:
        vectors = []
        for values in embeddings:
            vector = np.asarray(values, dtype=np.float64)
            if self._dimension is None:
                self._dimension = vector.shape[0]
            if vector.shape != (self._dimension,):
                raise TerminalEmbeddingError(
                    f"Ollama model {self.model_name!r} returned {vector.shape[0]} dimensions, expected "
                    f"{self._dimension} (OLLAMA_EMBEDDING_DIMENSION or the first answer)")
            norm = np.linalg.norm(vector)
            vectors.append((vector / norm if norm else vector).astype(np.float32))
        return vectors

    def embed_documents(self, texts: Sequence[str]) -> list[Sequence[float]]:
        texts = list(texts)
        if len(texts) > self.max_batch:
            raise ValueError(f"{len(texts)} texts in one request: max_batch is {self.max_batch} (OLLAMA_MAX_BATCH)")
        if not texts:
            return []
        return self._normalized(self._request(texts))

    def embed_query(self, text: str) -> Sequence[float]:
        return self._normalized(self._request([text]))[0]
