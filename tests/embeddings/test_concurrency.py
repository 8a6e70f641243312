"""Several embedding requests in flight per embed_changed task (HARVESTER_EMBED_CONCURRENCY): the
real google-genai SDK over HTTP to the local Gemini stand-in, real PostgreSQL. The stand-in holds
requests until the expected number are being answered at once, so nothing here depends on timing."""
import collections
import logging
import threading

import pytest

from harvester.embeddings import batching as embedder
from harvester.pipeline import steps as pipeline
from harvester.domain.breaker import BreakerConfig
from harvester.embeddings.batching import EmbedSettings
from harvester.embeddings import TerminalEmbeddingError
from harvester.embeddings.gemini import GeminiProvider
from harvester.config.portals import Portal
from harvester.store import db as store_db

from harvester.testing.clock import pass_breaker_time
from harvester.testing.runs import embed, run_stats, stage
from harvester.testing.samples import distinct_records

MODEL = "gemini-embedding-001@768"


def settings(concurrency, **more):
    return EmbedSettings(concurrency=concurrency, retry_delay=0, **more)


def vector_count(db):
    return db.execute("SELECT count(*) FROM embeddings WHERE model ="
                      " (SELECT id FROM embedding_models WHERE name = %s)", (MODEL,)).fetchone()[0]


def pending(db, run_id, portal):
    from harvester.store import vectors

    return vectors.count_pending(db, run_id, portal.url, MODEL)


class ThreadRecordingProvider(GeminiProvider):
    """Gemini, remembering which threads called embed_documents."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.threads = set()

    def embed_documents(self, texts):
        self.threads.add(threading.current_thread().name)
        return super().embed_documents(texts)


# -- the setting --------------------------------------------------------------------------------------
def test_the_concurrency_setting_is_read_and_checked():
    assert EmbedSettings.from_env({}).concurrency == EmbedSettings.concurrency == 8
    assert EmbedSettings.from_env({"HARVESTER_EMBED_CONCURRENCY": "3"}).concurrency == 3
    assert EmbedSettings.from_env({"HARVESTER_EMBED_CONCURRENCY": ""}).concurrency == 8
    for raw in ("0", "-2", "two", "1.5", "65"):
        with pytest.raises(ValueError, match=f"HARVESTER_EMBED_CONCURRENCY={raw!r} must be a whole number from 1 to 64"):
            EmbedSettings.from_env({"HARVESTER_EMBED_CONCURRENCY": raw})


def test_a_local_model_embeds_one_batch_at_a_time():
    from harvester.embeddings.local import LocalProvider

    local = LocalProvider.__new__(LocalProvider)  # (no model loaded: only its limit matters here)
    assert embedder.concurrency(local, EmbedSettings(concurrency=8)) == 1
    assert embedder.concurrency(GeminiProvider(api_key="AIza-x"), EmbedSettings(concurrency=8)) == 8
    assert embedder.concurrency(GeminiProvider(api_key="AIza-x"), EmbedSettings(concurrency=1)) == 1


# -- several in flight ----------------------------------------------------------------------------------
def test_requests_in_flight_reach_the_setting_and_every_text_gets_one_vector(db, portal_server, samples, gemini):
    portal, run_id = stage(portal_server, distinct_records(samples, 650))
    gemini.hold_until_in_flight(4)
    provider = ThreadRecordingProvider()
    counts = embed(portal, run_id, settings(4), provider=provider)
    assert gemini.peak_in_flight == 4, "never more, and at some point exactly as many as the setting"
    assert (counts["embedding_requests"], counts["embedded"], counts["left_pending"]) == (7, 650, 0)
    assert sorted(len(body["requests"]) for _, _, body in gemini.requests) == [50] + [100] * 6
    assert len(gemini.texts) == len(set(gemini.texts)) == 650, "each text sent once"
    assert vector_count(db) == 650 and pending(db, run_id, portal) == 0
    stats = run_stats(db, run_id)
    assert (stats["embedding_requests"], stats["embedded"]) == (7, 650)
    assert threading.current_thread().name not in provider.threads and len(provider.threads) > 1


def test_the_default_keeps_eight_requests_in_flight(db, portal_server, samples, gemini, monkeypatch):
    monkeypatch.delenv("HARVESTER_EMBED_CONCURRENCY", raising=False)
    portal, run_id = stage(portal_server, distinct_records(samples, 900))
    gemini.hold_until_in_flight(8)
    counts = embed(portal, run_id)  # settings from the environment: the defaults
    assert gemini.peak_in_flight == 8
    assert (counts["embedding_requests"], counts["embedded"], counts["left_pending"]) == (9, 900, 0)
    assert len(gemini.texts) == len(set(gemini.texts)) == 900 == vector_count(db)


def test_concurrency_1_sends_one_request_at_a_time_from_the_calling_thread(db, portal_server, samples, gemini):
    portal, run_id = stage(portal_server, distinct_records(samples, 250))
    gemini.delay = 0.05  # (a chance for a second request to overlap, were one sent)
    provider = ThreadRecordingProvider()
    counts = embed(portal, run_id, settings(1), provider=provider)
    assert gemini.peak_in_flight == 1
    assert [len(body["requests"]) for _, _, body in gemini.requests] == [100, 100, 50]  # in the reader's order
    assert (counts["embedding_requests"], counts["embedded"], counts["left_pending"]) == (3, 250, 0)
    assert provider.threads == {threading.current_thread().name}, "no worker thread"
    assert len(gemini.texts) == len(set(gemini.texts)) == 250 == vector_count(db)


def test_a_failing_batch_among_several_in_flight_is_retried_and_every_text_gets_its_vector(
        db, portal_server, samples, gemini, caplog):
    portal, run_id = stage(portal_server, distinct_records(samples, 600))
    gemini.hold_until_in_flight(4)
    gemini.fail_next(1, 503)
    gemini.fail_next(1, 429, retry_after=0)
    caplog.set_level(logging.WARNING, logger="harvester.embeddings.batching")
    counts = embed(portal, run_id, settings(4))
    assert (counts["embedding_requests"], counts["embedded"], counts["left_pending"]) == (8, 600, 0)
    assert len(gemini.requests) == 8 and gemini.peak_in_flight == 4
    sent = collections.Counter(gemini.texts)
    assert len(sent) == 600 and sorted(collections.Counter(sent.values()).items()) == [(1, 400), (2, 200)]
    assert vector_count(db) == 600 and pending(db, run_id, portal) == 0
    assert run_stats(db, run_id)["embedding_requests"] == 8
    retried = [r.getMessage() for r in caplog.records if "failed (attempt 1 of 3)" in r.getMessage()]
    assert len(retried) == 2 and any("HTTP 503" in m for m in retried) and any("HTTP 429" in m for m in retried)
    state = db.execute("SELECT state, consecutive_failures FROM circuit_breakers").fetchone()
    assert state[0] == "closed"


def test_the_breaker_opening_mid_run_leaves_the_rest_pending_and_the_next_attempt_embeds_it(
        db, portal_server, samples, gemini):
    portal, run_id = stage(portal_server, distinct_records(samples, 1000))
    config = BreakerConfig(failure_threshold=3, recovery_timeout_secs=1)
    gemini.fail_next(2, status=None)   # two batches go through...
    gemini.fail_next(10_000, 503)      # ...then the API is down
    counts = embed(portal, run_id, settings(4), breaker_config=config)
    assert (counts["embedded"], counts["left_pending"]) == (200, 800)
    assert vector_count(db) == 200 and pending(db, run_id, portal) == 800, "no vector lost or written twice"
    # Every attempt is counted, and calling stopped once the breaker opened: at most the two
    # successes, two failures before each of them and the three in a row that opened it, and three
    # more in flight then (the breaker not opening: 2 + 8 batches x 3 attempts).
    assert counts["embedding_requests"] == len(gemini.requests) == run_stats(db, run_id)["embedding_requests"]
    assert len(gemini.requests) <= 2 + (2 + 2 + 3) + 3 and gemini.peak_in_flight <= 4
    assert db.execute("SELECT state FROM circuit_breakers").fetchone()[0] == "open"

    # The API recovers; once the breaker half-opens (at most 2 probes at once), the task's next
    # attempt embeds exactly what was left, each text once.
    gemini._fail.clear()
    gemini.requests.clear()
    gemini.peak_in_flight = 0
    pass_breaker_time(db, config.recovery_timeout_secs)
    counts = embed(portal, run_id, settings(4), breaker_config=config)
    assert (counts["embedding_requests"], counts["embedded"], counts["left_pending"]) == (8, 800, 0)
    assert len(gemini.texts) == len(set(gemini.texts)) == 800 and gemini.peak_in_flight <= 4
    assert vector_count(db) == 1000 and pending(db, run_id, portal) == 0
    assert db.execute("SELECT state FROM circuit_breakers").fetchone()[0] == "closed"


def test_a_refused_key_fails_at_once_without_retrying_or_sending_more(db, portal_server, samples, gemini):
    portal, run_id = stage(portal_server, distinct_records(samples, 1000))
    gemini.hold_until_in_flight(4)
    gemini.fail_next(4, 401)
    with pytest.raises(TerminalEmbeddingError, match="Gemini rejected the API key"):
        embed(portal, run_id, settings(4))
    # The four in flight when the first refusal came back were all sent; nothing after, nothing again.
    assert len(gemini.requests) == 4 and len(gemini.texts) == len(set(gemini.texts)) == 400
    assert run_stats(db, run_id)["embedding_requests"] == 4
    assert vector_count(db) == 0
    assert db.execute("SELECT count(*) FROM circuit_breakers WHERE consecutive_failures > 0 OR state <> 'closed'"
                      ).fetchone()[0] == 0, "a refused key is not the API failing"


def test_vectors_in_flight_when_the_key_is_refused_are_kept(db, portal_server, samples, gemini):
    portal, run_id = stage(portal_server, distinct_records(samples, 1000))
    gemini.hold_until_in_flight(4)
    gemini.fail_next(3, status=None)
    gemini.fail_next(1, 403)
    with pytest.raises(TerminalEmbeddingError, match="Gemini rejected the API key"):
        embed(portal, run_id, settings(4))
    sent = len(gemini.requests)
    assert 4 <= sent < 10 and len(gemini.texts) == len(set(gemini.texts)), "not retried, not every batch sent"
    # Every answered batch was stored before the task failed: paid for once.
    assert vector_count(db) == 100 * (sent - 1)
    assert run_stats(db, run_id)["embedding_requests"] == sent
