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
4xx -> ``TerminalEmbeddingError``. One 500 is no outage: ``failed to encode response: json:
unsupported value: NaN`` (or ``+Inf``) is Ollama's answer when a vector of the batch is not finite
(its JSON encoder cannot write it, so no vector comes back): ``UnusableAnswer``, which the embed
step takes as a batch of unusable vectors (each text refused, sent again alone later).

``embed_documents`` returns the vectors as they came, as the Gemini provider does: another count
than the texts sent, a vector of another size, an empty one, NaN values are judged by the embed
step (embeddings/batching.py), which refuses the texts of the bad ones and stores the others, so
one bad text never fails its batch (issue 36). ``embed_query`` and the dimension probe still
raise: a query has no batch to save.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import requests

from harvester.config.secrets import redact_text, redact_url
from harvester.config.settings import SettingError, default, env_value
from harvester.domain.dataset import MAX_TEXT_CHARS
from harvester.embeddings.base import EmbeddingError, RateLimited, TerminalEmbeddingError, UnusableAnswer
from harvester.http.guard import failure_text

DEFAULT_URL = default("OLLAMA_URL")  # http://127.0.0.1:11434
DEFAULT_MODEL = default("OLLAMA_EMBEDDING_MODEL")  # nomic-embed-text
DEFAULT_MAX_BATCH = default("OLLAMA_MAX_BATCH")  # 64
PROBE_TEXT = "dimension probe"
# Ollama's HTTP 500 when a vector of its answer is not finite (Go's encoding/json refuses it):
# "failed to encode response: json: unsupported value: NaN" (ollama/ollama#9639).
_NOT_FINITE = re.compile(r"unsupported value: (NaN|[+-]?Inf)")
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
            probe = self._request([PROBE_TEXT], exact=True)[0]
            if not isinstance(probe, list) or not probe:
                raise EmbeddingError(f"Ollama model {self.model_name!r} answered no vector for the dimension probe "
                                     f"{PROBE_TEXT!r}: set OLLAMA_EMBEDDING_DIMENSION, or check the model")
            self._dimension = len(probe)
        return self._dimension

    def _request(self, texts: list[str], *, exact: bool) -> list:
        """The ``embeddings`` of Ollama's answer for ``texts``, as they came; with ``exact``, exactly
        one per text (EmbeddingError otherwise)."""
        endpoint = f"{self.url}/api/embed"
        payload = {"model": self.model_name, "input": [text[:MAX_TEXT_CHARS] for text in texts], "truncate": True}
        error: EmbeddingError | None = None
        response = None
        try:
            response = self._session.post(endpoint, json=payload, timeout=self.timeout)
        except requests.Timeout:
            error = EmbeddingError(f"Ollama at {redact_url(self.url)} did not answer within {self.timeout:g}s")
        except requests.RequestException as exc:
            error = EmbeddingError(f"could not reach Ollama at {redact_url(self.url)}: "
                                   f"{redact_text(failure_text(exc))[:300]}")  # (guard.py's words)
        if error is None:
            error = self._check(response, len(texts))
        if error is not None:
            raise error  # outside the except block: no chained request objects
        try:
            embeddings = response.json()["embeddings"]
        except (ValueError, KeyError, TypeError):
            raise EmbeddingError(f"Ollama at {redact_url(self.url)} answered without embeddings "
                                 f"(is {redact_url(self.url)} an Ollama server?)") from None
        if not isinstance(embeddings, list) or (exact and len(embeddings) != len(texts)):
            raise EmbeddingError(f"Ollama returned {len(embeddings) if isinstance(embeddings, list) else 'no'} "
                                 f"embeddings for {len(texts)} texts")
        return embeddings

    def _check(self, response: requests.Response, sent: int) -> EmbeddingError | None:
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
        if code == 500 and _NOT_FINITE.search(message):
            return UnusableAnswer(
                f"{where} could not write the vectors of {sent} texts (HTTP 500: {message}): one of them is not "
                "finite", "not-finite",
                detail=f"HTTP 500 ({message}) for the {sent} texts of its batch, one of whose vectors is not finite")
        if code == 408 or code >= 500:
            return EmbeddingError(f"{where} failed (HTTP {code}), trying again later may succeed: {message}")
        return TerminalEmbeddingError(f"{where} refused the request for model {self.model_name!r} "
                                      f"(HTTP {code}): {message}")

    def _as_vectors(self, embeddings: list) -> list[np.ndarray]:
        """Each embedding as a float32 vector, unit length when it has the model's size and a
        direction; any other (another size, empty, NaN, zeros) as it came, for the caller to judge.
        The size is learnt from the first non-empty vector when it is not known yet."""
        vectors = []
        with np.errstate(invalid="ignore", over="ignore"):  # NaN in, NaN out: refused by the caller
            for values in embeddings:
                try:
                    vector = np.asarray(values if isinstance(values, list) else [], dtype=np.float64).reshape(-1)
                except (TypeError, ValueError):
                    raise EmbeddingError(f"Ollama model {self.model_name!r} returned a vector with values that are "
                                         "not numbers") from None
                if self._dimension is None and vector.size:
                    self._dimension = vector.size
                norm = np.linalg.norm(vector) if vector.shape == (self._dimension,) else 0.0
                vectors.append((vector / norm if norm and np.isfinite(norm) else vector).astype(np.float32))
        return vectors

    def embed_documents(self, texts: Sequence[str]) -> list[Sequence[float]]:
        texts = list(texts)
        if len(texts) > self.max_batch:
            raise ValueError(f"{len(texts)} texts in one request: max_batch is {self.max_batch} (OLLAMA_MAX_BATCH)")
        if not texts:
            return []
        return self._as_vectors(self._request(texts, exact=False))

    def embed_query(self, text: str) -> Sequence[float]:
        vector, = self._as_vectors(self._request([text], exact=True))
        if not np.isfinite(vector).all() or not vector.any():
            raise EmbeddingError(f"Ollama model {self.model_name!r} returned a vector that is empty, not finite, or "
                                 "all zeros, for the query")
        if vector.shape != (self._dimension,):
            raise TerminalEmbeddingError(
                f"Ollama model {self.model_name!r} returned {vector.size} dimensions, expected "
                f"{self._dimension} (OLLAMA_EMBEDDING_DIMENSION or the first answer)")
        return vector
