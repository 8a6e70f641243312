"""Embedding a run's pending texts: batches through the provider, guarded by the shared breaker.

Every vector is stored (and committed) as soon as its batch returns, so money spent is never
spent twice: a failed run's retry, another portal with the same text, a reverted edit all find
it. When the breaker is open, or a batch keeps failing, the remaining texts stay pending
(``embedded_content_hash <> content_hash``); the run still commits and the next run embeds them.
An authentication error is not the provider being unwell: it fails the task at once.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from . import dataset as ds
from .breaker import BreakerConfig
from .embeddings.base import EmbeddingError, EmbeddingProvider, RateLimited, TerminalEmbeddingError
from .run import Progress, summary
from .store import runs, vectors
from .store.breaker import SharedBreaker

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class EmbedSettings:
    attempts: int = 3             # calls per batch before it is left pending for the next run
    retry_delay: float = 2.0      # seconds between attempts (a 429's Retry-After wins, up to max_delay)
    max_delay: float = 30.0
    backlog_per_run: int | None = None  # texts left pending by earlier runs embedded per run (None: all)
    shard_size: int = 5000        # pending texts per mapped embed_changed task
    max_shards: int = 8

    @classmethod
    def from_env(cls, environ=None) -> "EmbedSettings":
        env = os.environ if environ is None else environ

        def number(name, default, kind=float, minimum=0):
            raw = env.get(name)
            if raw in (None, ""):
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a {'whole ' if kind is int else ''}number") from None
            if value < minimum:
                raise ValueError(f"{name}={raw!r} must be at least {minimum}")
            return value

        backlog = number("HARVESTER_EMBED_BACKLOG_PER_RUN", None, int)
        return cls(attempts=number("HARVESTER_EMBED_ATTEMPTS", cls.attempts, int, 1),
                   retry_delay=number("HARVESTER_EMBED_RETRY_DELAY_SECS", cls.retry_delay),
                   max_delay=number("HARVESTER_EMBED_MAX_DELAY_SECS", cls.max_delay),
                   backlog_per_run=backlog,
                   shard_size=number("HARVESTER_EMBED_SHARD_SIZE", cls.shard_size, int, 1),
                   max_shards=number("HARVESTER_EMBED_MAX_SHARDS", cls.max_shards, int, 1))


def plan_shards(pending: int, settings: EmbedSettings) -> int:
    """How many embed_changed tasks to fan out to: one per shard_size texts, at most max_shards
    (at most 256: shards split texts by the first byte of their hash), and always at least one."""
    return max(1, min(settings.max_shards, 256, math.ceil(pending / settings.shard_size)))


class BreakerOpen(Exception):
    """The breaker rejected a call: stop calling for this run."""


def _call(breaker: SharedBreaker, request: Callable[[], T], what: str, settings: EmbedSettings,
          counts: dict) -> T | None:
    """One provider call (``request``; ``what`` names it in logs): its result, or None when it kept
    failing. Raises BreakerOpen and terminal errors."""
    for attempt in range(1, settings.attempts + 1):
        decision = breaker.admit()
        if not decision.allowed:
            raise BreakerOpen(f"circuit breaker {breaker.name} is {decision.state}: retry in {decision.retry_in:.0f}s")
        counts["embedding_requests"] += 1
        try:
            result = request()
        except TerminalEmbeddingError:
            raise
        except EmbeddingError as exc:
            rate_limited = isinstance(exc, RateLimited)
            breaker.record_failure(rate_limited=rate_limited, error_text=str(exc), probe=decision.probe)
            wait = min(settings.max_delay, exc.retry_after if rate_limited and exc.retry_after else
                       settings.retry_delay * attempt)
            log.warning("%s failed (attempt %d of %d): %s", what, attempt, settings.attempts, exc)
            if attempt < settings.attempts:
                time.sleep(wait)
            continue
        breaker.record_success(probe=decision.probe)
        return result
    return None


def _dimension(provider: EmbeddingProvider, breaker: SharedBreaker, settings: EmbedSettings,
               counts: dict) -> int | None:
    """The provider's vector size; when reading it calls the provider (Ollama's probe), that call
    goes through the breaker like any batch: None when it kept failing. Raises BreakerOpen."""
    if not getattr(provider, "dimension_needs_call", False):
        return provider.dimension
    return _call(breaker, lambda: provider.dimension, f"reading the vector size of {provider.model}", settings,
                 counts)


def embed_pending(conn, reader, portal_url: str, run_id: int, provider: EmbeddingProvider, *,
                  shard: int = 0, shards: int = 1, settings: EmbedSettings | None = None,
                  breaker_config: BreakerConfig | None = None, label: str = "") -> dict:
    """Embed one shard of the portal's pending texts. Returns this call's counts; they are also
    added to the run's stats as they happen. Vectors of the provider's model already stored with
    another dimension raise TerminalEmbeddingError (retrying cannot help)."""
    settings = settings or EmbedSettings.from_env()
    breaker = SharedBreaker(conn, provider.name, provider.model, breaker_config or BreakerConfig.from_env())
    counts = {"embedding_requests": 0, "embedded": 0}
    left_pending = 0
    stopped: str | None = None
    total = vectors.count_pending(conn, run_id, portal_url, provider.model, shard, shards)
    dimension = None
    if total:  # nothing to embed: no model to load, no probe to send
        try:
            dimension = _dimension(provider, breaker, settings, counts)
        except BreakerOpen as exc:
            stopped = str(exc)
        finally:
            if counts["embedding_requests"]:
                runs.add_counts(conn, run_id, {"embedding_requests": counts["embedding_requests"]})
        if dimension is None:
            stopped = stopped or f"reading the vector size of {provider.model} kept failing"
            log.warning("%s; leaving the texts pending for the next run", stopped)
        else:
            try:
                vectors.ensure_index(conn, provider.model, dimension)
            except vectors.DimensionMismatch as exc:
                raise TerminalEmbeddingError(f"nothing was embedded: {exc}") from None
    backlog = None if settings.backlog_per_run is None else math.ceil(settings.backlog_per_run / shards)
    progress = Progress(f"embed_changed {label}shard {shard + 1}/{shards} ({provider.model})", total, log)
    for batch in vectors.iter_pending(reader, run_id, portal_url, provider.model, provider.max_batch,
                                      shard=shard, shards=shards, backlog_limit=backlog):
        if stopped or dimension is None:  # (None: none were pending a moment ago; the next run sees them)
            left_pending += len(batch)
            continue
        before = counts["embedding_requests"]
        texts = [ds.embedding_text(r[1], r[2]) for r in batch]
        try:
            result = _call(breaker, functools.partial(provider.embed_documents, texts),
                           f"embedding batch of {len(texts)} texts", settings, counts)
        except BreakerOpen as exc:
            stopped = str(exc)
            left_pending += len(batch)
            log.warning("%s; leaving the remaining texts pending for the next run", exc)
            continue
        finally:
            runs.add_counts(conn, run_id, {"embedding_requests": counts["embedding_requests"] - before})
        if result is None:
            left_pending += len(batch)
            continue
        stored = vectors.write(conn, provider.model, dimension, [r[0] for r in batch], result)
        counts["embedded"] += stored
        runs.add_counts(conn, run_id, {"embedded": stored})
        progress.advance(len(batch))
    counts["left_pending"] = left_pending
    log.info("embed_changed shard %d/%d done: %s", shard + 1, shards,
             summary(counts, ("embedding_requests", "embedded", "left_pending")))
    return counts
