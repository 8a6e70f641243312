"""Embedding a run's pending texts: batches through the provider, guarded by the shared breaker.

Every vector is stored (and committed) as soon as its batch returns, so money spent is never
spent twice: a failed run's retry, another portal with the same text, a reverted edit all find
it. When the breaker is open, or a batch keeps failing, the remaining texts stay pending
(``embedded_content_hash <> content_hash``); the run still commits and the next run embeds them.
An authentication error is not the provider being unwell: it fails the task at once.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

from . import dataset as ds
from .breaker import BreakerConfig
from .embeddings.base import EmbeddingError, EmbeddingProvider, RateLimited, TerminalEmbeddingError
from .run import Progress, summary
from .store import runs, vectors
from .store.breaker import SharedBreaker

log = logging.getLogger(__name__)


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


def _call(provider: EmbeddingProvider, breaker: SharedBreaker, texts: list[str], settings: EmbedSettings,
          counts: dict) -> list | None:
    """One batch: vectors, or None when it kept failing. Raises BreakerOpen and terminal errors."""
    for attempt in range(1, settings.attempts + 1):
        decision = breaker.admit()
        if not decision.allowed:
            raise BreakerOpen(f"circuit breaker {breaker.name} is {decision.state}: retry in {decision.retry_in:.0f}s")
        counts["embedding_requests"] += 1
        try:
            result = provider.embed_documents(texts)
        except TerminalEmbeddingError:
            raise
        except EmbeddingError as exc:
            rate_limited = isinstance(exc, RateLimited)
            breaker.record_failure(rate_limited=rate_limited, error_text=str(exc), probe=decision.probe)
            wait = min(settings.max_delay, exc.retry_after if rate_limited and exc.retry_after else
                       settings.retry_delay * attempt)
            log.warning("embedding batch of %d texts failed (attempt %d of %d): %s", len(texts), attempt,
                        settings.attempts, exc)
            if attempt < settings.attempts:
                time.sleep(wait)
            continue
        breaker.record_success(probe=decision.probe)
        return result
    return None


def embed_pending(conn, reader, portal_url: str, run_id: int, provider: EmbeddingProvider, *,
                  shard: int = 0, shards: int = 1, settings: EmbedSettings | None = None,
                  breaker_config: BreakerConfig | None = None, label: str = "") -> dict:
    """Embed one shard of the portal's pending texts. Returns this call's counts; they are also
    added to the run's stats as they happen."""
    settings = settings or EmbedSettings.from_env()
    breaker = SharedBreaker(conn, provider.name, provider.model, breaker_config or BreakerConfig.from_env())
    vectors.ensure_index(conn, provider.model, provider.dimension)
    total = vectors.count_pending(conn, run_id, portal_url, provider.model, shard, shards)
    backlog = None if settings.backlog_per_run is None else math.ceil(settings.backlog_per_run / shards)
    progress = Progress(f"embed_changed {label}shard {shard + 1}/{shards} ({provider.model})", total, log)
    counts = {"embedding_requests": 0, "embedded": 0}
    left_pending = 0
    stopped: str | None = None
    for batch in vectors.iter_pending(reader, run_id, portal_url, provider.model, provider.max_batch,
                                      shard=shard, shards=shards, backlog_limit=backlog):
        if stopped:
            left_pending += len(batch)
            continue
        before = counts["embedding_requests"]
        try:
            result = _call(provider, breaker, [ds.embedding_text(r[1], r[2]) for r in batch], settings, counts)
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
        stored = vectors.write(conn, provider.model, provider.dimension, [r[0] for r in batch], result)
        counts["embedded"] += stored
        runs.add_counts(conn, run_id, {"embedded": stored})
        progress.advance(len(batch))
    counts["left_pending"] = left_pending
    log.info("embed_changed shard %d/%d done: %s", shard + 1, shards,
             summary(counts, ("embedding_requests", "embedded", "left_pending")))
    return counts
