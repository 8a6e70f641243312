"""A batch answered with unusable vectors (issue 36): NaN or infinite values, a vector of another
size, an empty one, all zeros, or another count of vectors than texts. The real google-genai SDK
talks HTTP to the local Gemini stand-in, which answers chosen texts wrong (FakeGemini.poison); real
PostgreSQL. What the provider answered about some texts spoils those texts alone: the other vectors
are stored, the breaker is not tripped, the run goes on; the bad texts stay pending, held back for
a while, sent alone when retried, and given up after a few refusals."""
import collections
import datetime
import logging

import pytest

from harvester.domain import dataset as ds
from harvester.embeddings import TerminalEmbeddingError
from harvester.embeddings.batching import EmbedSettings
from harvester.store import vectors
from harvester.testing.runs import embed, run_stats, stage
from harvester.testing.samples import distinct_records

MODEL = "gemini-embedding-001@768"


def settings(**more):
    return EmbedSettings(concurrency=4, retry_delay=0, **more)


def texts_of(db, run_id, n):
    """(content hash, the text Gemini is sent) of ``n`` of the run's staged records."""
    rows = db.execute("SELECT DISTINCT content_hash, title, description FROM staging_records WHERE run_id = %s"
                      " ORDER BY content_hash LIMIT %s", (run_id, n)).fetchall()
    return [(h, ds.embedding_text(title, description)) for h, title, description in rows]


def stored(db):
    return {r[0] for r in db.execute("SELECT encode(content_hash, 'hex') FROM embeddings WHERE model ="
                                     " (SELECT id FROM embedding_models WHERE name = %s)", (MODEL,))}


def failures(db):
    return {h: (n, reason, retry_at is None) for h, n, reason, retry_at in db.execute(
        "SELECT content_hash, failures, reason, retry_at FROM embedding_failures WHERE model = %s", (MODEL,))}


def pass_backoff(db, seconds):
    """What waiting ``seconds`` does to every text held back by a refusal, without the wait."""
    db.execute("UPDATE embedding_failures SET retry_at = retry_at - make_interval(secs => %s)"
               " WHERE retry_at IS NOT NULL", (seconds,))


def breaker_untouched(db):
    """No breaker has seen a failure (a row appears with the first one)."""
    return db.execute("SELECT count(*) FROM circuit_breakers WHERE consecutive_failures > 0 OR state <> 'closed'"
                      ).fetchone()[0] == 0


def test_poisoned_texts_spoil_only_themselves_and_are_held_back_then_given_up(db, portal_server, samples, gemini,
                                                                              caplog):
    portal, run_id = stage(portal_server, distinct_records(samples, 400))
    poisoned = dict(zip([h for h, _ in texts_of(db, run_id, 5)], ("nan", "inf", "short", "empty", "zero")))
    text = dict(texts_of(db, run_id, 5))
    for h, how in poisoned.items():
        gemini.poison(text[h], how)
    caplog.set_level(logging.WARNING, logger="harvester.embeddings.batching")
    gemini.hold_until_in_flight(4)

    counts = embed(portal, run_id, settings())
    # Every other vector is stored, each text was sent once, and the run's step ends well.
    assert (counts["embedding_requests"], counts["embedded"], counts["embeddings_refused"],
            counts["left_pending"]) == (4, 395, 5, 5)
    assert len(gemini.texts) == len(set(gemini.texts)) == 400
    assert len(stored(db)) == 395 and not stored(db) & set(poisoned)
    stats = run_stats(db, run_id)
    assert (stats["embedded"], stats["embeddings_refused"], stats["embedding_requests"]) == (395, 5, 4)
    # The poisoned texts: pending (no vector), refused once each with their reason, claims given back.
    assert failures(db) == {h: (1, {"nan": "not-finite", "inf": "not-finite", "short": "wrong-dimension",
                                    "empty": "empty", "zero": "zero"}[how], False) for h, how in poisoned.items()}
    assert db.execute("SELECT count(*) FROM embedding_claims").fetchone()[0] == 0
    # The provider answered: no failure for the breaker.
    assert breaker_untouched(db)
    warned = [r.getMessage() for r in caplog.records if "unusable vectors" in r.getMessage()]
    assert warned and all("gemini model gemini-embedding-001@768 answered unusable vectors for" in m
                          for m in warned)
    assert sum(int(m.split(" answered unusable vectors for ")[1].split()[0]) for m in warned) == 5
    assert any("2 not-finite" in m or "1 not-finite" in m for m in warned)
    message = db.execute("SELECT message FROM embedding_failures WHERE reason = 'wrong-dimension'").fetchone()[0]
    assert message.startswith("gemini model gemini-embedding-001@768 answered a vector of 767 dimensions, "
                              f"expected 768 for this text (run {run_id})")

    # Before their backoff, no run sends them again: nothing is pending work.
    gemini.requests.clear()
    counts = embed(portal, run_id, settings())
    assert (counts["embedding_requests"], counts["embedded"], counts["embeddings_held_back"]) == (0, 0, 5)
    assert gemini.requests == []
    assert vectors.count_pending(db, run_id, portal.url, MODEL) == 0

    # After it, each is sent again, alone in its request; still refused: a second refusal.
    pass_backoff(db, 3600)
    counts = embed(portal, run_id, settings())
    assert sorted(len(body["requests"]) for _, _, body in gemini.requests) == [1] * 5
    assert sorted(gemini.texts) == sorted(text.values())
    assert (counts["embedded"], counts["embeddings_refused"]) == (0, 5)
    assert {n for n, _, _ in failures(db).values()} == {2}

    # The backoff doubled: an hour is not enough now, two are; the third refusal gives them up.
    gemini.requests.clear()
    pass_backoff(db, 3600)
    assert embed(portal, run_id, settings())["embedding_requests"] == 0
    pass_backoff(db, 3600)
    assert embed(portal, run_id, settings())["embedding_requests"] == 5
    assert {(n, gone) for n, _, gone in failures(db).values()} == {(3, True)}
    assert sum("1 given up after 3 refusals in a row" in r.getMessage() for r in caplog.records) == 5

    # Given up: never sent again, however long one waits; reported as held back on each run.
    gemini.requests.clear()
    pass_backoff(db, 365 * 86400)
    db.execute("UPDATE embedding_failures SET last_failed_at = last_failed_at - interval '1 year'")
    counts = embed(portal, run_id, settings())
    assert (counts["embedding_requests"], counts["embeddings_held_back"]) == (0, 5) and gemini.requests == []
    assert any("5 texts of the portal are not sent to gemini model gemini-embedding-001@768 this run" in m
               and "0 wait for their retry" in m and "5 were given up after 3 refusals" in m
               for m in (r.getMessage() for r in caplog.records))
    sent = collections.Counter(gemini.texts)
    assert not sent
    assert len(stored(db)) == 395, "nothing paid twice, nothing lost"


def test_one_text_healed_gets_its_vector_and_its_refusals_end(db, portal_server, samples, gemini):
    portal, run_id = stage(portal_server, distinct_records(samples, 150))
    (h, text), = texts_of(db, run_id, 1)
    gemini.poison(text, "nan")
    assert embed(portal, run_id, settings())["embedded"] == 149
    assert set(failures(db)) == {h}
    gemini.unpoison(text)
    pass_backoff(db, 3600)
    gemini.requests.clear()
    counts = embed(portal, run_id, settings())
    assert (counts["embedding_requests"], counts["embedded"]) == (1, 1) and gemini.texts == [text]
    assert failures(db) == {} and h in stored(db)


def test_another_count_of_vectors_refuses_that_batch_alone_and_its_texts_are_retried_one_by_one(
        db, portal_server, samples, gemini):
    portal, run_id = stage(portal_server, distinct_records(samples, 400))
    (culprit, text), = texts_of(db, run_id, 1)
    gemini.poison(text, "missing")  # its batch's answer holds 99 vectors for 100 texts
    counts = embed(portal, run_id, settings())
    assert (counts["embedding_requests"], counts["embedded"], counts["embeddings_refused"]) == (4, 300, 100)
    assert len(gemini.requests) == 4, "not retried within the run: it is the provider's answer, not an outage"
    assert breaker_untouched(db)
    refused = failures(db)
    assert len(refused) == 100 and {reason for _, reason, _ in refused.values()} == {"count-mismatch"}
    assert culprit in refused and not stored(db) & set(refused)

    # After the backoff each of them goes alone: the 99 get their vectors, the culprit alone is refused.
    pass_backoff(db, 3600)
    gemini.requests.clear()
    counts = embed(portal, run_id, settings())
    assert [len(body["requests"]) for _, _, body in gemini.requests] == [1] * 100
    assert (counts["embedded"], counts["embeddings_refused"]) == (99, 1)
    assert failures(db) == {culprit: (2, "count-mismatch", False)}
    assert len(stored(db)) == 399


def test_every_vector_of_a_batch_of_another_size_is_a_setting_to_fix_not_the_texts(db, portal_server, samples,
                                                                                  gemini):
    portal, run_id = stage(portal_server, distinct_records(samples, 50))
    for _, text in texts_of(db, run_id, 50):
        gemini.poison(text, "short")
    with pytest.raises(TerminalEmbeddingError, match="answered vectors of 767 dimensions for all 50 texts of a "
                                                     "batch, expected 768"):
        embed(portal, run_id, settings())
    assert failures(db) == {} and stored(db) == set()
    assert breaker_untouched(db)


def test_a_whole_run_with_poisoned_texts_commits_and_the_next_runs_do_not_pay_for_them_again(
        db, portal_server, samples, gemini, tmp_path, monkeypatch, capsys):
    """Through `harvester harvest` (begin .. upsert): the run commits with every other dataset
    embedded; the poisoned ones are stored, pending, reported (skipped, embedding-refused) and
    counted (embeddings_refused); the next run sends nothing; `harvester embeddings invalidate
    --dataset` resets one, which the next run sends alone."""
    import json

    import yaml

    from harvester.cli.main import main

    records = distinct_records(samples, 400)
    portal_server.set_records(records)
    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [{"name": "test", "url": portal_server.base_url,
                                                 "politeness_delay": 0}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
    chosen = records[:4]
    for record in chosen:
        gemini.poison(ds.embedding_text(record["title"], record.get("notes")), "nan")

    assert main(["harvest", "test", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["created"], stats["embedded"], stats["embeddings_refused"], stats["skipped"]) == (400, 396, 4, 4)
    run_id, status = db.execute("SELECT run_id, status FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()
    assert status == "committed"
    pending = {r[0] for r in db.execute("SELECT source_id FROM datasets"
                                        " WHERE embedded_content_hash IS DISTINCT FROM content_hash")}
    assert pending == {r["id"] for r in chosen}
    assert {r[0] for r in db.execute("SELECT source_id FROM record_outcomes WHERE run_id = %s"
                                     " AND code = 'embedding-refused'", (run_id,))} == pending
    assert not db.execute("SELECT count(*) FROM record_outcomes WHERE code = 'embedding-deferred'").fetchone()[0]
    assert len(gemini.texts) == len(set(gemini.texts)) == 400

    # The next run (nothing changed at the portal) sends nothing: the refused texts wait their backoff.
    gemini.requests.clear()
    assert main(["harvest", "test", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["embedding_requests"], stats["embedded"]) == (0, 0) and gemini.requests == []

    # An operator resets one (its text healed meanwhile): the next run sends it alone, and links it.
    healed = chosen[0]
    gemini.unpoison(ds.embedding_text(healed["title"], healed.get("notes")))
    assert main(["embeddings", "invalidate", "--dataset", healed["id"]]) == 0
    capsys.readouterr()
    assert main(["harvest", "test", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["embedding_requests"], stats["embedded"]) == (1, 1)
    assert [len(body["requests"]) for _, _, body in gemini.requests] == [1]
    assert {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE embedded_content_hash IS DISTINCT FROM"
                                     " content_hash")} == {r["id"] for r in chosen[1:]}


def test_a_text_another_run_refuses_while_this_run_waits_for_it_is_neither_sent_nor_counted_awaited(
        db, portal_server, samples, gemini):
    """Another portal's run holds the claims of 5 of this run's texts, then gets unusable vectors for
    them and gives them back, refused: this run, waiting for them, does not claim or send them
    (they are held back), nor count them as reused; they stay pending."""
    import threading

    from harvester.config.portals import Portal
    from harvester.pipeline import steps as pipeline
    from harvester.store import claims

    other = pipeline.begin(db, Portal(name="other", url="http://other.example", politeness_delay=0))["run_id"]
    portal, run_id = stage(portal_server, distinct_records(samples, 100))
    theirs = [h for h, _ in texts_of(db, run_id, 5)]
    assert claims.take(db, MODEL, other, theirs, ttl_seconds=600).mine == set(theirs)
    seen = claims.take(db, MODEL, other, theirs, ttl_seconds=600)  # (its own claims: still its own)
    assert seen.mine == set(theirs) and not seen.held

    def refuse_once_the_rest_is_stored():
        from harvester.store import db as store_db

        with store_db.open_cli() as conn:
            while conn.execute("SELECT count(*) FROM embeddings WHERE model ="
                               " (SELECT id FROM embedding_models WHERE name = %s)", (MODEL,)).fetchone()[0] < 95:
                threading.Event().wait(0.05)
            claims.refuse(conn, MODEL, other, {h: ("not-finite", "NaN") for h in theirs}, attempts=3,
                          backoff_seconds=3600, max_backoff_seconds=86400)

    thread = threading.Thread(target=refuse_once_the_rest_is_stored)
    thread.start()
    counts = embed(portal, run_id, settings(claim_poll=0.05, claim_wait=30))
    thread.join(30)
    assert (counts["embedded"], counts.get("embeddings_awaited", 0), counts["left_pending"]) == (95, 0, 5)
    assert len(gemini.texts) == 95 and not set(theirs) & stored(db)
    assert db.execute("SELECT count(*) FROM embedding_claims").fetchone()[0] == 0
    # A claim by a third run now: held back, neither its to send nor another's to wait for.
    got = claims.take(db, MODEL, run_id, theirs, ttl_seconds=600)
    assert (got.mine, got.others, got.held) == (set(), set(), set(theirs))


# -- the refusal limits are settings (HARVESTER_EMBED_REFUSED_*) ---------------------------------------------
def held_for(db):
    """Per refused text: (refusals, seconds it is held back from its last refusal; None: given up)."""
    return {h: (n, None if wait is None else round(wait)) for h, n, wait in db.execute(
        "SELECT content_hash, failures, extract(epoch FROM retry_at - last_failed_at)::float"
        " FROM embedding_failures WHERE model = %s", (MODEL,))}


def test_one_refusal_gives_a_text_up_when_the_setting_says_so(db, portal_server, samples, gemini, monkeypatch,
                                                               caplog):
    monkeypatch.setenv("HARVESTER_EMBED_REFUSED_ATTEMPTS", "1")
    portal, run_id = stage(portal_server, distinct_records(samples, 30))
    (h, text), = texts_of(db, run_id, 1)
    gemini.poison(text, "empty")
    caplog.set_level(logging.WARNING, logger="harvester.embeddings.batching")
    counts = embed(portal, run_id)  # the settings from the environment
    assert (counts["embedded"], counts["embeddings_refused"]) == (29, 1)
    assert held_for(db) == {h: (1, None)}
    assert any("1 given up after 1 refusals in a row" in r.getMessage() for r in caplog.records)
    pass_backoff(db, 365 * 86400)
    gemini.requests.clear()
    assert embed(portal, run_id)["embeddings_held_back"] == 1 and gemini.requests == []


def test_the_first_backoff_and_the_longest_are_settings(db, portal_server, samples, gemini, monkeypatch):
    monkeypatch.setenv("HARVESTER_EMBED_REFUSED_BACKOFF_SECS", "600")
    monkeypatch.setenv("HARVESTER_EMBED_REFUSED_MAX_BACKOFF_SECS", "900")
    monkeypatch.setenv("HARVESTER_EMBED_REFUSED_ATTEMPTS", "4")
    portal, run_id = stage(portal_server, distinct_records(samples, 30))
    (h, text), = texts_of(db, run_id, 1)
    gemini.poison(text, "nan")
    embed(portal, run_id)
    assert held_for(db) == {h: (1, 600)}
    pass_backoff(db, 599)
    assert embed(portal, run_id)["embedding_requests"] == 0
    pass_backoff(db, 1)
    embed(portal, run_id)
    assert held_for(db) == {h: (2, 900)}, "1200 s doubled, 900 s at most"
    pass_backoff(db, 900)
    embed(portal, run_id)
    assert held_for(db) == {h: (3, 900)}
    pass_backoff(db, 900)
    embed(portal, run_id)
    assert held_for(db) == {h: (4, None)}


@pytest.mark.parametrize("env, message", [
    ({"HARVESTER_EMBED_REFUSED_ATTEMPTS": "three"},
     "HARVESTER_EMBED_REFUSED_ATTEMPTS='three' must be a whole number from 1 to 100"),
    ({"HARVESTER_EMBED_REFUSED_ATTEMPTS": "0"}, "HARVESTER_EMBED_REFUSED_ATTEMPTS='0' must be a whole number from 1 "
                                                "to 100"),
    ({"HARVESTER_EMBED_REFUSED_ATTEMPTS": "2.5"},
     "HARVESTER_EMBED_REFUSED_ATTEMPTS='2.5' must be a whole number from 1 to 100"),
    ({"HARVESTER_EMBED_REFUSED_BACKOFF_SECS": "an hour"},
     "HARVESTER_EMBED_REFUSED_BACKOFF_SECS='an hour' must be a number from 1 to 31622400"),
    ({"HARVESTER_EMBED_REFUSED_BACKOFF_SECS": "0"},
     "HARVESTER_EMBED_REFUSED_BACKOFF_SECS='0' must be a number from 1 to 31622400"),
    ({"HARVESTER_EMBED_REFUSED_BACKOFF_SECS": "-3600"},
     "HARVESTER_EMBED_REFUSED_BACKOFF_SECS='-3600' must be a number from 1 to 31622400"),
    ({"HARVESTER_EMBED_REFUSED_BACKOFF_SECS": "nan"},
     "HARVESTER_EMBED_REFUSED_BACKOFF_SECS='nan' must be a number from 1 to 31622400"),
    ({"HARVESTER_EMBED_REFUSED_MAX_BACKOFF_SECS": "0"},
     "HARVESTER_EMBED_REFUSED_MAX_BACKOFF_SECS='0' must be a number from 1 to 31622400"),
    ({"HARVESTER_EMBED_REFUSED_MAX_BACKOFF_SECS": "1e9"},
     "HARVESTER_EMBED_REFUSED_MAX_BACKOFF_SECS='1e9' must be a number from 1 to 31622400"),
    # a rule between two of them
    ({"HARVESTER_EMBED_REFUSED_BACKOFF_SECS": "7200", "HARVESTER_EMBED_REFUSED_MAX_BACKOFF_SECS": "3600"},
     "HARVESTER_EMBED_REFUSED_MAX_BACKOFF_SECS=3600 must be at least HARVESTER_EMBED_REFUSED_BACKOFF_SECS=7200: a "
     "refused text's first wait cannot be longer than its longest"),
])
def test_bad_refusal_settings_name_the_variable(env, message):
    from harvester.config.settings import SettingError

    with pytest.raises(SettingError) as caught:
        EmbedSettings.from_env(env)
    assert str(caught.value) == message


def test_the_refusal_settings_read_from_the_environment():
    got = EmbedSettings.from_env({"HARVESTER_EMBED_REFUSED_ATTEMPTS": "5", "HARVESTER_EMBED_REFUSED_BACKOFF_SECS":
                                  " 60 ", "HARVESTER_EMBED_REFUSED_MAX_BACKOFF_SECS": "86400"})
    assert (got.refused_attempts, got.refused_backoff, got.refused_max_backoff) == (5, 60.0, 86400.0)
    assert EmbedSettings.from_env({}) == EmbedSettings() and EmbedSettings().refused_max_backoff == 7 * 86400


# -- the run's report: embedding-refused, not embedding-deferred ----------------------------------------------
def harvest_json(main, capsys) -> dict:
    import json

    assert main(["harvest", "test", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def embed_rows(db, run_id):
    """The run's embed rows: source id -> (code, message)."""
    return {source_id: (code, message) for source_id, code, message in db.execute(
        "SELECT source_id, code, message FROM record_outcomes WHERE run_id = %s AND stage = 'embed'", (run_id,))}


def retry_text(db, source_id):
    """When the dataset's text is sent again, as the report writes it."""
    retry_at, = db.execute("SELECT f.retry_at FROM embedding_failures f JOIN datasets d USING (content_hash)"
                           " WHERE d.source_id = %s", (source_id,)).fetchone()
    return f"{retry_at.astimezone(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


def test_the_report_says_what_was_wrong_how_often_and_what_happens_next(db, portal_server, samples, gemini,
                                                                         tmp_path, monkeypatch, capsys):
    """Each dataset whose text got an unusable vector is an embedding-refused row of the run that
    refused it, naming what was wrong, the refusals in a row and when it is sent again; the run that
    gives it up (sending it again for an unchanged record) says so, and how to reset it."""
    import yaml

    from harvester.cli.main import main

    records = distinct_records(samples, 20)
    portal_server.set_records(records)
    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [{"name": "test", "url": portal_server.base_url,
                                                 "politeness_delay": 0}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
    monkeypatch.setenv("HARVESTER_EMBED_REFUSED_ATTEMPTS", "2")
    nan, short, empty = (r["id"] for r in records[:3])
    for record, how in zip(records, ("nan", "short", "empty")):
        gemini.poison(ds.embedding_text(record["title"], record.get("notes")), how)

    stats = harvest_json(main, capsys)
    run_id = stats["run_id"]
    assert (stats["embedded"], stats["embeddings_refused"], stats["skipped"]) == (17, 3, 3)
    rows = embed_rows(db, run_id)
    assert {code for code, _ in rows.values()} == {"embedding-refused"} and set(rows) == {nan, short, empty}
    model = "gemini model gemini-embedding-001@768"
    assert rows[nan][1] == (
        f"stored without a vector: {model} answered 768 of its 768 values not finite (NaN or infinite) for this "
        f"text (run {run_id}): a value that is not a number (NaN or infinite); refused 1 time in a row; sent "
        f"again, alone in its request, by the first run after {retry_text(db, nan)}")
    assert rows[short][1].startswith(f"stored without a vector: {model} answered a vector of 767 dimensions, "
                                     f"expected 768 for this text (run {run_id}): another number of dimensions")
    assert rows[empty][1].startswith(f"stored without a vector: {model} answered a vector of no values for this text"
                                     f" (run {run_id}): no values at all; refused 1 time in a row; sent again")
    report = db.execute("SELECT severity, stage FROM record_outcomes WHERE run_id = %s AND code = 'embedding-refused'"
                        " GROUP BY 1, 2", (run_id,)).fetchall()
    assert report == [("warning", "embed")]

    # The next run, before the backoff: nothing sent, nothing new to say.
    stats = harvest_json(main, capsys)
    assert (stats["embedding_requests"], stats["skipped"]) == (0, 0) and embed_rows(db, stats["run_id"]) == {}

    # After it, one of them is healed: the run that sends them again reports the two it gave up.
    gemini.unpoison(ds.embedding_text(records[2]["title"], records[2].get("notes")))
    pass_backoff(db, 3600)
    stats = harvest_json(main, capsys)
    run_id = stats["run_id"]
    assert (stats["embedded"], stats["embeddings_refused"], stats["skipped"]) == (1, 2, 0)
    rows = embed_rows(db, run_id)
    assert set(rows) == {nan, short}
    assert rows[nan] == ("embedding-refused", (
        f"stored without a vector: {model} answered 768 of its 768 values not finite (NaN or infinite) for this "
        f"text (run {run_id}): a value that is not a number (NaN or infinite); refused 2 times in a row; given up: "
        f"sent again only once its text changes, or after `harvester embeddings invalidate --dataset {nan}` resets "
        "it"))
    assert rows[short][1].endswith(f"refused 2 times in a row; given up: sent again only once its text changes, or "
                                   f"after `harvester embeddings invalidate --dataset {short}` resets it")


def test_a_text_not_embedded_yet_is_still_embedding_deferred(db, portal_server, samples, gemini):
    """A run that took in datasets and refused some of their texts, the others left pending (the
    embed step not run for them): each kind of row for each."""
    from harvester.pipeline import steps as pipeline
    from harvester.store import claims

    portal, run_id = stage(portal_server, distinct_records(samples, 10))
    (refused, _), = texts_of(db, run_id, 1)
    claims.refuse(db, MODEL, run_id, {refused: ("zero", "gemini answered a vector of zeros")}, attempts=3,
                  backoff_seconds=3600, max_backoff_seconds=86400)
    stats = pipeline.upsert(db, portal, run_id, MODEL)
    codes = collections.Counter(code for code, _ in embed_rows(db, run_id).values())
    assert codes == {"embedding-deferred": 9, "embedding-refused": 1} and stats["skipped"] == 10
    message, = db.execute("SELECT message FROM record_outcomes WHERE code = 'embedding-refused'").fetchone()
    assert message.startswith("stored without a vector: gemini answered a vector of zeros; refused 1 time in a row; "
                              "sent again, alone in its request, by the first run after ")


# -- Ollama: the same answers, the same handling -------------------------------------------------------------
OLLAMA_MODEL = "ollama/nomic-embed-text"


@pytest.fixture
def ollama():
    from harvester.testing.ollama import FakeOllama

    with FakeOllama(models={"nomic-embed-text": 768}) as fake:
        yield fake


def ollama_provider(fake):
    from harvester.embeddings.ollama import OllamaProvider

    return OllamaProvider(url=fake.url, max_batch=50)  # its size discovered by the probe


def ollama_failures(db):
    return {h: (n, reason, retry_at is None) for h, n, reason, retry_at in db.execute(
        "SELECT content_hash, failures, reason, retry_at FROM embedding_failures WHERE model = %s", (OLLAMA_MODEL,))}


def ollama_stored(db):
    return {r[0] for r in db.execute("SELECT encode(content_hash, 'hex') FROM embeddings WHERE model ="
                                     " (SELECT id FROM embedding_models WHERE name = %s)", (OLLAMA_MODEL,))}


def embed_batches(fake):
    """The number of texts of each embedding request (the probe left out)."""
    return sorted(len(body["input"]) for _, _, body in fake.requests if body["input"] != ["dimension probe"])


@pytest.mark.parametrize("how, reason", [("missing", "count-mismatch"), ("nan", "not-finite")])
def test_an_ollama_batch_without_a_vector_for_each_text_is_refused_and_its_texts_sent_again_alone(
        db, portal_server, samples, ollama, how, reason, caplog):
    """Ollama answers one vector fewer than the texts (a gateway dropping one), or HTTP 500 "json:
    unsupported value: NaN" (a vector of the batch is NaN, which Ollama cannot write): no vector can
    be matched to its text, so the batch is refused, as with Gemini; the other batches are stored,
    the breaker sees no failure, nothing is retried within the run. After the backoff each text
    goes alone: the others get their vectors, the one at fault alone is refused again."""
    portal, run_id = stage(portal_server, distinct_records(samples, 150))
    (culprit, text), = texts_of(db, run_id, 1)
    ollama.poison(text, how)
    caplog.set_level(logging.WARNING, logger="harvester.embeddings.batching")
    counts = embed(portal, run_id, settings(), provider=ollama_provider(ollama))
    assert (counts["embedded"], counts["embeddings_refused"], counts["left_pending"]) == (100, 50, 50)
    assert embed_batches(ollama) == [50, 50, 50], "not retried within the run: it is Ollama's answer, not an outage"
    assert breaker_untouched(db)
    refused = ollama_failures(db)
    assert len(refused) == 50 and {r for _, r, _ in refused.values()} == {reason} and culprit in refused
    assert not ollama_stored(db) & set(refused)
    assert any(f"ollama model {OLLAMA_MODEL} answered unusable vectors for 50 of the 50 texts of a batch (50 {reason})"
               in r.getMessage() for r in caplog.records)

    pass_backoff(db, 3600)
    ollama.requests.clear()
    counts = embed(portal, run_id, settings(), provider=ollama_provider(ollama))
    assert embed_batches(ollama) == [1] * 50
    assert (counts["embedded"], counts["embeddings_refused"]) == (49, 1)
    assert ollama_failures(db) == {culprit: (2, reason, False)} and len(ollama_stored(db)) == 149
    assert breaker_untouched(db)


def test_an_ollama_vector_of_another_size_or_empty_spoils_only_its_text(db, portal_server, samples, ollama):
    portal, run_id = stage(portal_server, distinct_records(samples, 100))
    (short, short_text), (empty, empty_text) = texts_of(db, run_id, 2)
    ollama.poison(short_text, "short")
    ollama.poison(empty_text, "empty")
    counts = embed(portal, run_id, settings(), provider=ollama_provider(ollama))
    assert (counts["embedded"], counts["embeddings_refused"]) == (98, 2) and embed_batches(ollama) == [50, 50]
    assert ollama_failures(db) == {short: (1, "wrong-dimension", False), empty: (1, "empty", False)}
    message, = db.execute("SELECT message FROM embedding_failures WHERE reason = 'wrong-dimension'").fetchone()
    assert message.startswith(f"ollama model {OLLAMA_MODEL} answered a vector of 767 dimensions, expected 768 for this"
                              f" text (run {run_id})")
    assert breaker_untouched(db)
