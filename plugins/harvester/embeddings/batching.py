"""Embedding a run's pending texts: batches through the provider, guarded by the shared breaker.

Every vector is stored (and committed) as soon as its batch returns, so money spent is never
spent twice: a failed run's retry, another portal with the same text, a reverted edit all find
it. When the breaker is open, or a batch keeps failing, the remaining texts stay pending
(``embedded_content_hash <> content_hash``); the run still commits and the next run embeds them.
An authentication error is not the provider being unwell: it fails the task at once.

A batch the provider answers with vectors that cannot be stored (not finite, of the wrong size,
empty, all zeros, or another count of vectors than texts; or an error that says as much, such as
Ollama's HTTP 500 "json: unsupported value: NaN": UnusableAnswer) is the provider's answer about those
texts, not an outage: the breaker records a success, the usable vectors of the batch are stored,
and each unusable one's text is refused (store/claims.py refuse, sql/021): it stays pending, its
claim is given back, and it is not sent again before a backoff (``refused_backoff``, doubling up to
``refused_max_backoff``), alone in its request then; after ``refused_attempts`` refusals in a row it
is given up until its text changes or an operator resets it (``harvester embeddings invalidate``).
The run goes on. HARVESTER_EMBED_REFUSED_BACKOFF_SECS (an hour), _REFUSED_MAX_BACKOFF_SECS (a week)
and _REFUSED_ATTEMPTS (3) set them.

Up to ``concurrency`` batches are in flight at once (HARVESTER_EMBED_CONCURRENCY), so a remote
provider's latency is not paid batch after batch. Only the provider calls run on worker threads;
the reading, the breaker's bookkeeping (each call admitted before it is sent, its outcome recorded
when it returns: the breaker uses the task's connection), the vectors' writes and the counts stay
on the calling thread.
"""
from __future__ import annotations

import logging
import math
import time
from concurrent import futures
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

from harvester.config.settings import SettingError, breaker_config as breaker_config_from_env, fields_from_env
from harvester.domain import dataset as ds
from harvester.domain.breaker import HALF_OPEN, BreakerConfig
from harvester.embeddings.base import (EmbeddingError, EmbeddingProvider, RateLimited, TerminalEmbeddingError,
                                       UnusableAnswer)
from harvester.domain.run import summary
from harvester.domain.tasklog import Progress
from harvester.store import claims, runs, vectors
from harvester.store.breaker import SharedBreaker

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
    concurrency: int = 8          # provider requests in flight at once per embed_changed task
    claim_ttl: float = 600.0      # seconds a claim of texts being embedded holds (store/claims.py)
    claim_wait: float = 600.0     # seconds a shard waits for texts another run claimed, after its own
    claim_poll: float = 0.5       # seconds between looks for the vectors of texts another run claimed
    # A text whose vector came back unusable (NaN, wrong size, empty, ...): runs that send it before
    # it is given up, and how long it is held back after its first refusal (doubling after each, up
    # to refused_max_backoff). HARVESTER_EMBED_REFUSED_ATTEMPTS, _REFUSED_BACKOFF_SECS, _REFUSED_MAX_BACKOFF_SECS.
    refused_attempts: int = 3
    refused_backoff: float = 3600.0
    refused_max_backoff: float = 7 * 86400.0

    @classmethod
    def from_env(cls, environ=None) -> "EmbedSettings":
        """The HARVESTER_EMBED_* variables (config/settings.py: their ranges and messages), and the
        rule between two of them: the longest backoff is at least the first."""
        got = fields_from_env(cls, "HARVESTER_EMBED_", environ)
        if got.refused_max_backoff < got.refused_backoff:
            raise SettingError(
                f"HARVESTER_EMBED_REFUSED_MAX_BACKOFF_SECS={got.refused_max_backoff:g} must be at least "
                f"HARVESTER_EMBED_REFUSED_BACKOFF_SECS={got.refused_backoff:g}: a refused text's first wait "
                "cannot be longer than its longest",
                ["HARVESTER_EMBED_REFUSED_MAX_BACKOFF_SECS", "HARVESTER_EMBED_REFUSED_BACKOFF_SECS"])
        return got



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


def concurrency(provider: EmbeddingProvider, settings: EmbedSettings) -> int:
    """Requests in flight at once: the setting, or fewer if the provider says so (a local model on
    the CPU: ``max_concurrency`` 1)."""
    limit = getattr(provider, "max_concurrency", None)
    return max(1, min(settings.concurrency, limit)) if limit else settings.concurrency


class _Inline:
    """An executor that runs each call at once on the calling thread (concurrency 1: no threads)."""

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # noqa: BLE001 - handed over like a worker's exception
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass


class _Batch:
    """One batch of pending texts on its way through the provider."""

    __slots__ = ("seq", "rows", "texts", "attempts", "not_before", "probe")

    def __init__(self, seq: int, rows: list[tuple]):
        self.seq, self.rows = seq, rows
        self.texts = [ds.embedding_text(r[1], r[2]) for r in rows]
        self.attempts = 0        # calls made so far
        self.not_before = 0.0    # time.monotonic() before which its next call may not start
        self.probe = False       # its current call was admitted as a half-open probe

    @property
    def what(self) -> str:
        return f"embedding batch of {len(self.texts)} texts"


class _Batches:
    """Embeds batches with up to ``concurrency`` provider calls in flight. Only the provider's
    ``embed_documents`` runs on worker threads; the breaker (whose state is read and written through
    ``conn``), the vectors' writes and the counts stay on the calling thread. At most
    ``concurrency`` batches are held at a time (in flight, or waiting for their next attempt)."""

    def __init__(self, conn, run_id: int, provider: EmbeddingProvider, dimension: int, breaker: SharedBreaker,
                 settings: EmbedSettings, counts: dict, progress: Progress):
        self.conn, self.run_id, self.provider, self.dimension = conn, run_id, provider, dimension
        self.breaker, self.settings, self.counts, self.progress = breaker, settings, counts, progress
        self.concurrency = concurrency(provider, settings)
        self.waiting: list[_Batch] = []            # read, or due for another attempt; by not_before
        self.in_flight: dict[Future, _Batch] = {}
        self.left = 0                              # texts left pending
        self.stopped: str | None = None            # why no more calls are sent (the breaker)
        self.fatal: BaseException | None = None    # a terminal error: raised once in-flight calls are in
        self.unflushed = 0                         # calls counted here but not yet in the run's stats
        self.awaited: dict[str, tuple] = {}        # texts another run claimed: their rows, by content hash
        self.refused = 0                           # texts whose vectors came back unusable (left pending)
        self.held = 0                              # texts another run refused meanwhile (not sent)

    def run(self, batches: Iterator[list[tuple]]) -> int:
        """Embed from ``batches`` until they run out or the breaker stops the calls (the rest of
        ``batches`` is left to the caller). Returns the texts of read batches left pending. A
        terminal error is raised once the calls in flight are in and their vectors stored."""
        if self.concurrency > 1:
            log.info("embedding with up to %d requests in flight", self.concurrency)
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="embed") if self.concurrency > 1 else _Inline()
        seq = 0
        exhausted = False
        held = False  # a half-open breaker turned a call away while ours were in flight: wait for them
        try:
            while True:
                while (not exhausted and self.stopped is None and self.fatal is None
                       and len(self.in_flight) + len(self.waiting) < self.concurrency):
                    rows = next(batches, None)
                    if rows is None:
                        exhausted = True
                    elif rows := self._claim(rows):
                        self.waiting.append(_Batch(seq, rows))
                        seq += 1
                while (self.waiting and not held and self.stopped is None and self.fatal is None
                       and self.waiting[0].not_before <= time.monotonic()):
                    decision = self.breaker.admit()
                    if not decision.allowed:
                        if decision.state == HALF_OPEN and self.in_flight:
                            held = True  # our own calls may hold the probe slots
                            break
                        self.stopped = (f"circuit breaker {self.breaker.name} is {decision.state}: "
                                        f"retry in {decision.retry_in:.0f}s")
                        log.warning("%s; leaving the remaining texts pending for the next run", self.stopped)
                        break
                    batch = self.waiting.pop(0)
                    batch.attempts += 1
                    batch.probe = decision.probe
                    self.counts["embedding_requests"] += 1
                    self.unflushed += 1
                    self.in_flight[pool.submit(self.provider.embed_documents, batch.texts)] = batch
                if self.stopped is not None or self.fatal is not None:
                    for batch in self.waiting:
                        self._leave(batch.rows)
                    self.waiting.clear()
                if not self.in_flight:
                    if not self.waiting:
                        break
                    time.sleep(max(0.0, self.waiting[0].not_before - time.monotonic()))  # a retry's delay
                    continue
                timeout = None if held or not self.waiting else max(0.0, self.waiting[0].not_before - time.monotonic())
                done, _ = futures.wait(self.in_flight, timeout=timeout, return_when=FIRST_COMPLETED)
                if done:
                    held = False
                for future in sorted(done, key=lambda f: self.in_flight[f].seq):
                    self._finished(self.in_flight.pop(future), future)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            self._flush({})
        if self.fatal is not None:
            raise self.fatal
        return self.left

    def _finished(self, batch: _Batch, future: Future) -> None:
        """Record a call's outcome with the breaker; store its vectors, schedule its next attempt,
        or leave it pending."""
        exc = future.exception()
        if exc is None:
            # The provider answered: whatever its vectors are worth, it is not unwell.
            self.breaker.record_success(probe=batch.probe)
            self._store(batch, future.result())
            return
        if isinstance(exc, UnusableAnswer):
            # An answer about these texts that holds nothing usable (Ollama's NaN it cannot write):
            # not an outage, the same as a batch of unusable vectors.
            self.breaker.record_success(probe=batch.probe)
            self._store(batch, None, unusable=(exc.reason, exc.detail))
            return
        self._flush({})
        if isinstance(exc, TerminalEmbeddingError) or not isinstance(exc, EmbeddingError):
            self.fatal = self.fatal or exc  # not recorded: no breaker fixes a wrong key
            self._leave(batch.rows)
            return
        rate_limited = isinstance(exc, RateLimited)
        self.breaker.record_failure(rate_limited=rate_limited, error_text=str(exc), probe=batch.probe)
        log.warning("%s failed (attempt %d of %d): %s", batch.what, batch.attempts, self.settings.attempts, exc)
        if batch.attempts >= self.settings.attempts or self.stopped is not None or self.fatal is not None:
            self._leave(batch.rows)
            return
        delay = min(self.settings.max_delay, exc.retry_after if rate_limited and exc.retry_after else
                    self.settings.retry_delay * batch.attempts)
        batch.not_before = time.monotonic() + delay
        self.waiting.append(batch)
        self.waiting.sort(key=lambda b: (b.not_before, b.seq))

    def _store(self, batch: _Batch, answer, unusable: tuple[str, str] | None = None) -> None:
        """Store the usable vectors of a batch's answer, refuse the texts of the others (their vectors
        cannot be stored: see the module's docstring), and count both. ``unusable`` (reason, what was
        answered): the answer held nothing usable for any text of the batch (UnusableAnswer)."""
        hashes = [r[0] for r in batch.rows]
        answer = list(answer) if answer is not None else []
        if unusable is not None:
            verdicts = [unusable] * len(hashes)
        elif len(answer) != len(hashes):
            mismatch = ("count-mismatch", f"{len(answer)} vectors for the {len(hashes)} texts of its batch")
            verdicts = [mismatch] * len(hashes)
        else:
            verdicts = vectors.screen(self.dimension, answer)
            sizes = {len(v) for v in answer} if all(v is not None for v in answer) else set()
            if (len(hashes) > 1 and all(v is not None and v[0] == "wrong-dimension" for v in verdicts)
                    and len(sizes) == 1):
                # Every vector of the batch of one other size: the model or a gateway ignores the size
                # asked for, a setting to fix, not something about these texts.
                self.fatal = self.fatal or TerminalEmbeddingError(
                    f"{self.provider.name} model {self.provider.model} answered vectors of {sizes.pop()} dimensions "
                    f"for all {len(hashes)} texts of a batch, expected {self.dimension}: the model (or a gateway "
                    "before it) does not give the size configured; check the provider's dimension setting "
                    "(GEMINI_EMBEDDING_DIMENSION, OLLAMA_EMBEDDING_DIMENSION) and its endpoint")
                self._leave(batch.rows)
                return
        good = [i for i, verdict in enumerate(verdicts) if verdict is None]
        stored = 0
        if good:
            stored = vectors.write(self.conn, self.provider.model, self.dimension, [hashes[i] for i in good],
                                   [answer[i] for i in good], run_id=self.run_id)
        refused = {hashes[i]: verdict for i, verdict in enumerate(verdicts) if verdict is not None}
        if refused:
            self._refuse(refused, len(hashes))
        self.counts["embedded"] += stored
        self._flush({"embedded": stored, **({"embeddings_refused": len(refused)} if refused else {})})
        self.progress.advance(len(batch.rows))

    def _refuse(self, refused: dict[str, tuple[str, str]], sent: int) -> None:
        """Record the refusal of these texts (store/claims.py refuse; their claims given back in the
        same transaction): they stay pending, held back from the next runs for a while, given up
        after ``refused_attempts``. One warning naming the provider, the model and the counts."""
        provider, model, settings = self.provider.name, self.provider.model, self.settings
        by_hash = {h: (reason, f"{provider} model {model} answered {detail} for this text "
                                f"(run {self.run_id}): {vectors.UNUSABLE[reason]}")
                   for h, (reason, detail) in refused.items()}
        recorded = claims.refuse(self.conn, model, self.run_id, by_hash, attempts=settings.refused_attempts,
                                 backoff_seconds=settings.refused_backoff,
                                 max_backoff_seconds=settings.refused_max_backoff)
        self.refused += len(refused)
        self.left += len(refused)
        self.counts["embeddings_refused"] = self.counts.get("embeddings_refused", 0) + len(refused)
        reasons: dict[str, int] = {}
        for reason, _ in refused.values():
            reasons[reason] = reasons.get(reason, 0) + 1
        given_up = [r for r in recorded if r.retry_at is None]
        waiting = [r for r in recorded if r.retry_at is not None]
        what = []
        if waiting:
            what.append(f"{len(waiting)} not sent again before {min(r.retry_at for r in waiting):%Y-%m-%d %H:%M:%S %Z}"
                        f" (refused {min(r.failures for r in waiting)} of {settings.refused_attempts} times so far)")
        if given_up:
            what.append(f"{len(given_up)} given up after {settings.refused_attempts} refusals in a row: sent again "
                        "only once their text changes or `harvester embeddings invalidate` resets them")
        log.warning("%s model %s answered unusable vectors for %d of the %d texts of a batch (%s): the other vectors "
                    "are stored; these texts stay pending, %s", provider, model, len(refused), sent,
                    ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items())), "; ".join(what))

    def _claim(self, rows: list[tuple]) -> list[tuple]:
        """Claim the texts of ``rows`` before they are sent (store/claims.py): returns the rows this
        run is to embed now. Texts with a vector already are done; texts another live run claimed
        are set aside in ``awaited``, for await_others."""
        got = claims.take(self.conn, self.provider.model, self.run_id, [r[0] for r in rows], self.settings.claim_ttl)
        for row in rows:
            if row[0] in got.others:
                self.awaited[row[0]] = row
        if got.stored:
            self.progress.advance(len(got.stored))
        if got.held:  # another run refused them since they were read: left pending, not sent
            self.held += len(got.held)
            self.left += len(got.held)
            self.progress.advance(len(got.held))
        return [row for row in rows if row[0] in got.mine]

    def _leave(self, rows: list[tuple]) -> None:
        """These texts stay pending (for the next run): their claims are given back at once."""
        self.left += len(rows)
        claims.release(self.conn, self.provider.model, self.run_id, {r[0] for r in rows})

    def await_others(self) -> int:
        """Wait for the vectors of the texts other runs claimed (they are sending them now), each
        linked by upsert when it lands (the run's stats count it as reused, not paid). A text whose
        claim lapses meanwhile (its run died, or gave it back) is claimed and embedded here. Waits
        at most ``claim_wait`` seconds; what is still awaited then stays pending for the next run.
        Returns the texts left pending."""
        if not self.awaited:
            return 0
        model = self.provider.model
        log.info("%d texts are being embedded by other runs at this moment (the same text on another portal): "
                 "waiting for their vectors instead of paying for them again", len(self.awaited))
        deadline = time.monotonic() + self.settings.claim_wait
        awaited = 0
        while self.awaited and self.stopped is None and self.fatal is None:
            for content_hash in claims.landed(self.conn, model, set(self.awaited)):
                del self.awaited[content_hash]
                awaited += 1
                self.progress.advance(1)
            if not self.awaited:
                break
            rows = list(self.awaited.values())
            self.awaited.clear()
            held = self.held
            mine = self._claim(rows)  # (a claim that lapsed is ours now; a vector that landed meanwhile is done)
            awaited += len(rows) - len(mine) - len(self.awaited) - (self.held - held)  # (refused meanwhile: pending)
            if mine:
                size = max(1, self.provider.max_batch)
                self.run(iter([mine[i:i + size] for i in range(0, len(mine), size)]))
                continue
            if time.monotonic() >= deadline:
                break
            time.sleep(self.settings.claim_poll)
        self.counts["embeddings_awaited"] = self.counts.get("embeddings_awaited", 0) + awaited
        if awaited:
            runs.add_counts(self.conn, self.run_id, {"embeddings_awaited": awaited})
        left = len(self.awaited)
        self.left += left
        if left:
            log.warning("%d texts claimed by other runs got no vector within %.0fs "
                        "(HARVESTER_EMBED_CLAIM_WAIT_SECS): they stay pending for the next run", left,
                        self.settings.claim_wait)
            self.awaited.clear()
        return left

    def _flush(self, more: dict) -> None:
        """Add ``more`` and the calls not yet counted to the run's stats."""
        counts = dict(more)
        if self.unflushed:
            counts["embedding_requests"] = self.unflushed
        if counts:
            runs.add_counts(self.conn, self.run_id, counts)
        self.unflushed = 0


def _alone_if_retried(batches: Iterator[list[tuple]]) -> Iterator[list[tuple]]:
    """Each batch of pending texts as read, less the texts the provider answered an unusable vector
    for before (iter_pending's ``retried``), each of which goes alone in a request of its own: one
    bad text never spoils a batch twice, and a count of vectors that does not match is its own."""
    for rows in batches:
        fresh = [row for row in rows if not (len(row) > 3 and row[3])]
        if fresh:
            yield fresh
        for row in rows:
            if len(row) > 3 and row[3]:
                yield [row]


def embed_pending(conn, reader, portal_url: str, run_id: int, provider: EmbeddingProvider, *,
                  shard: int = 0, shards: int = 1, settings: EmbedSettings | None = None,
                  breaker_config: BreakerConfig | None = None, label: str = "") -> dict:
    """Embed one shard of the portal's pending texts. Returns this call's counts; they are also
    added to the run's stats as they happen. Vectors of the provider's model already stored with
    another dimension raise TerminalEmbeddingError (retrying cannot help). Each text is claimed
    before it is sent (store/claims.py): a text another run is embedding at this moment is waited
    for, not paid for twice. No index is built here: the model's index is shared by every portal,
    and a missing one is built concurrently by an upsert (store/vectors.py ensure_index)."""
    settings = settings or EmbedSettings.from_env()
    breaker = SharedBreaker(conn, provider.name, provider.model, breaker_config or breaker_config_from_env())
    counts = {"embedding_requests": 0, "embedded": 0}
    left_pending = 0
    stopped: str | None = None
    total = vectors.count_pending(conn, run_id, portal_url, provider.model, shard, shards)
    waiting, given_up, next_retry = vectors.count_held_back(conn, run_id, portal_url, provider.model, shard, shards)
    if waiting or given_up:
        counts["embeddings_held_back"] = waiting + given_up
        runs.add_counts(conn, run_id, {"embeddings_held_back": waiting + given_up})
        log.warning("%d texts of the portal are not sent to %s model %s this run, which answered unusable vectors for "
                    "them before: %d wait for their retry (the first at %s), %d were given up after %d refusals "
                    "(sent again once their text changes, or `harvester embeddings invalidate` resets them)",
                    waiting + given_up, provider.name, provider.model, waiting,
                    "-" if next_retry is None else f"{next_retry:%Y-%m-%d %H:%M:%S %Z}", given_up,
                    settings.refused_attempts)
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
                vectors.check_dimension(conn, provider.model, dimension)
                vectors.drop_other_sizes(conn, provider.model, dimension)
            except vectors.DimensionMismatch as exc:
                raise TerminalEmbeddingError(f"nothing was embedded: {exc}") from None
    backlog = None if settings.backlog_per_run is None else math.ceil(settings.backlog_per_run / shards)
    progress = Progress(f"embedding {label}shard {shard + 1}/{shards} ({provider.model})", total, log, unit="texts")
    batches = _alone_if_retried(vectors.iter_pending(reader, run_id, portal_url, provider.model, provider.max_batch,
                                                     shard=shard, shards=shards, backlog_limit=backlog))
    if not stopped and dimension is not None:  # (None: none were pending a moment ago; the next run sees them)
        runner = _Batches(conn, run_id, provider, dimension, breaker, settings, counts, progress)
        runner.run(batches)
        runner.await_others()
        left_pending += runner.left
    if total:  # (none pending: no second pass over the portal's datasets to find none again)
        for batch in batches:  # not read: the breaker stopped the calls (or no vector size): the next run's
            left_pending += len(batch)
    counts["left_pending"] = left_pending
    # (the embed_changed task ends with a table of them)
    log.debug("embed_changed shard %d/%d done: %s", shard + 1, shards,
             summary(counts, ("embedding_requests", "embedded", "embeddings_awaited", "embeddings_refused",
                              "embeddings_held_back", "left_pending")))
    return counts
