"""Texts claimed across runs before they are sent (store/claims.py): two runs of different portals
that meet the same texts at the same moment pay for each once; a dead run's claims lapse. Real
PostgreSQL, the real google-genai SDK against the local Gemini stand-in, which holds requests until
the expected number are in flight, so the runs overlap by construction, not by timing."""
import collections
import threading
import time

import pytest

from harvester.pipeline import steps as pipeline
from harvester.testing.ckan_portal import DemoPortal
from harvester.embeddings.batching import EmbedSettings
from harvester.config.portals import Portal
from harvester.store import claims, runs, vectors
from harvester.store import db as store_db

from harvester.testing.runs import embed, run_stats, stage
from harvester.testing.samples import distinct_records

MODEL = "gemini-embedding-001@768"
H = [f"{i:064x}" for i in range(6)]


def started_run(db, name):
    portal = Portal(name=name, url=f"http://{name}.example", politeness_delay=0)
    return pipeline.begin(db, portal)["run_id"]


def staged_with_claims(db, portal_server, records, claimer: str, n: int):
    """A run of a portal with ``records`` staged, and the first ``n`` of its texts claimed by a
    running run of another portal, ``claimer``, begun just before it (its run id is one less)."""
    claimer_run = started_run(db, claimer)
    portal, run_id = stage(portal_server, records)
    assert run_id == claimer_run + 1
    hashes = [row[0] for row in db.execute("SELECT DISTINCT content_hash FROM staging_records WHERE run_id = %s"
                                           " ORDER BY content_hash", (run_id,)).fetchall()]
    claims.take(db, MODEL, claimer_run, hashes[:n], ttl_seconds=600)
    return portal, run_id


def test_a_claim_keeps_a_text_for_one_run_until_its_vector_is_written(db):
    a, b = started_run(db, "a"), started_run(db, "b")
    got = claims.take(db, MODEL, a, H[:3], ttl_seconds=60)
    assert (got.mine, got.stored, got.others) == (set(H[:3]), set(), set())

    got = claims.take(db, MODEL, b, H[1:5], ttl_seconds=60)
    assert got.mine == set(H[3:5]) and got.others == set(H[1:3]) and not got.stored

    # a's vector of H[1] is written: its claim goes with it, and b finds the vector
    vectors.write(db, MODEL, 4, [H[1]], [[1.0, 0, 0, 0]], run_id=a)
    assert db.execute("SELECT count(*) FROM embedding_claims WHERE content_hash = %s", (H[1],)).fetchone()[0] == 0
    got = claims.take(db, MODEL, b, [H[1], H[2]], ttl_seconds=60)
    assert got.stored == {H[1]} and got.others == {H[2]} and not got.mine

    # a retry of a's own task takes its claims back at once
    assert claims.take(db, MODEL, a, [H[2]], ttl_seconds=60).mine == {H[2]}
    # released (the batch kept failing): b may take it
    claims.release(db, MODEL, a, {H[2]})
    assert claims.take(db, MODEL, b, [H[2]], ttl_seconds=60).mine == {H[2]}


def test_the_claims_of_a_dead_or_slow_run_lapse(db):
    a, b = started_run(db, "a"), started_run(db, "b")
    claims.take(db, MODEL, a, H[:2], ttl_seconds=60)
    claims.take(db, MODEL, b, H[2:4], ttl_seconds=0.001)  # expires at once
    c = started_run(db, "c")
    assert claims.take(db, MODEL, c, H[2:4], ttl_seconds=60).mine == set(H[2:4]), "expired"
    assert claims.take(db, MODEL, c, H[:2], ttl_seconds=60).others == set(H[:2])
    runs.abort(db, a, "failed", "its worker died")
    assert claims.take(db, MODEL, c, H[:2], ttl_seconds=60).mine == set(H[:2]), "a's run is over"
    assert claims.prune(db) == 0  # c's claims are live
    runs.abort(db, c, "failed", "done")
    assert claims.prune(db) == 4


def test_two_portals_republishing_the_same_texts_at_the_same_moment_pay_for_each_once(
        database_url, db, portal_server, samples, gemini):
    """Portal b republishes a's 100 records and has 50 of its own. a's request is held until b's
    is in flight too: without claims b would send the 100 shared texts again."""
    records = distinct_records(samples, 150)
    shared, own = records[:100], records[100:]
    a, run_a = stage(portal_server, shared)
    other = DemoPortal(records=shared + own)
    other.start()
    try:
        b, run_b = stage(other, shared + own)
        b_portal = Portal(name="b", url=other.base_url, politeness_delay=0)
        gemini.hold_until_in_flight(2)
        out = {}

        def embed_a():
            out["a"] = embed(a, run_a, EmbedSettings(concurrency=1, retry_delay=0))

        thread = threading.Thread(target=embed_a)
        thread.start()
        # b starts once a holds its claims (its request is in flight, held by the server)
        deadline = time.monotonic() + 30
        while db.execute("SELECT count(*) FROM embedding_claims WHERE run_id = %s", (run_a,)).fetchone()[0] < 100:
            assert time.monotonic() < deadline, "a never claimed its texts"
            time.sleep(0.01)
        out["b"] = embed(b, run_b, EmbedSettings(concurrency=1, retry_delay=0, claim_poll=0.05))
        thread.join(60)
        assert not thread.is_alive()
        sent = collections.Counter(gemini.texts)
        assert len(sent) == 150 and max(sent.values()) == 1, sent.most_common(3)
        assert gemini.peak_in_flight == 2, "the two runs overlapped"
        assert (out["a"]["embedded"], out["b"]["embedded"]) == (100, 50)
        # b met a's texts while a's request was in flight: it waited for those (the later ones of its
        # listing may have had their vector by the time b read them)
        assert 0 < out["b"]["embeddings_awaited"] <= 100 and out["b"]["left_pending"] == 0
        assert run_stats(db, run_b)["embeddings_awaited"] == out["b"]["embeddings_awaited"]

        with store_db.open_cli() as conn:
            stats_a = pipeline.upsert(conn, a, run_a, MODEL)
            stats_b = pipeline.upsert(conn, b_portal, run_b, MODEL)
    finally:
        other.stop()
    assert (stats_a["embedded"], stats_a["embeddings_reused"]) == (100, 0)
    assert (stats_b["embedded"], stats_b["embeddings_reused"]) == (50, 100), "every shared text is accounted for"
    assert db.execute("SELECT count(*) FROM embedding_claims").fetchone()[0] == 0
    live = db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL"
                      " AND embedded_content_hash = content_hash").fetchone()[0]
    assert live == 250


def test_a_text_whose_claimer_died_is_embedded_by_the_run_waiting_for_it(database_url, db, portal_server, samples,
                                                                          gemini):
    """The claim of a run that stopped (here: marked failed while b waits) lapses: b embeds the
    text itself rather than leaving it pending."""
    b, run_b = staged_with_claims(db, portal_server, distinct_records(samples, 20), "dead", 5)
    dead = run_b - 1

    def die():
        time.sleep(0.5)
        with store_db.open_cli() as conn:
            runs.abort(conn, dead, "failed", "worker lost")

    killer = threading.Thread(target=die)
    killer.start()
    got = embed(b, run_b, EmbedSettings(concurrency=1, retry_delay=0, claim_poll=0.05))
    killer.join()
    assert (got["embedded"], got["left_pending"]) == (20, 0)
    assert max(collections.Counter(gemini.texts).values()) == 1


def test_a_wait_for_another_run_is_bounded(database_url, db, portal_server, samples, gemini):
    b, run_b = staged_with_claims(db, portal_server, distinct_records(samples, 10), "alive", 3)
    got = embed(b, run_b, EmbedSettings(concurrency=1, retry_delay=0, claim_wait=0.3, claim_poll=0.05))
    assert (got["embedded"], got["left_pending"]) == (7, 3), "left pending for the next run, never paid twice"
    assert len(gemini.texts) == 7


@pytest.mark.parametrize("raw", ["-1", "soon"])
def test_claim_settings_are_checked(raw):
    with pytest.raises(ValueError, match=f"HARVESTER_EMBED_CLAIM_TTL_SECS={raw!r} must be a number >= 1"):
        EmbedSettings.from_env({"HARVESTER_EMBED_CLAIM_TTL_SECS": raw})
