"""dataset_vectors (sql/010): the copy of each dataset's vector that search's exact path reads, kept
by the runs' upserts. Real PostgreSQL + pgvector, the local CKAN portal, the real google-genai SDK
against the local Gemini-protocol server."""
import copy
from datetime import datetime, timedelta, timezone

import pytest

from harvester.pipeline import steps as pipeline
from harvester.config.portals import Portal
from harvester.store import vectors

from harvester.testing.runs import COPY_DRIFT
from harvester.testing.samples import distinct_records

DRIFT = COPY_DRIFT


def copies(db) -> dict[str, tuple[str, str]]:
    """source_id -> (model, xmin of the copy's row: a new one whenever the row was written)."""
    return {r[0]: (r[1], r[2]) for r in db.execute(
        "SELECT d.source_id, k.model, v.xmin::text FROM dataset_vectors v JOIN datasets d ON d.id = v.dataset_id"
        " JOIN vector_scopes k ON k.id = v.scope")}


def _later(minutes: int) -> str:
    return (datetime.now(timezone.utc) + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%f")


def harvested(db, reader, portal_server, samples, n: int):
    """A portal of ``n`` distinct records after its first sync (every copy written, the portal
    checked for the model): (portal, provider)."""
    from harvester.embeddings import get_provider

    portal_server.set_records(distinct_records(samples, n))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    provider = get_provider()
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    assert vectors.copies_checked(db, portal.url, provider.model)
    return portal, provider


def test_runs_copy_what_they_link_and_check_everything_when_the_model_changes(
        db, reader, portal_server, samples, gemini, monkeypatch):
    from harvester.embeddings import get_provider

    records = distinct_records(samples, 40)
    portal_server.set_records(records)
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    first = get_provider()

    # A first sync: every dataset's copy, in dataset order, and the portal checked for the model.
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), first)
    before = copies(db)
    assert len(before) == 40 and {m for m, _ in before.values()} == {first.model}
    assert db.execute(DRIFT, {"model": first.model}).fetchone()[0] == 0
    assert vectors.copies_checked(db, portal.url, first.model)
    assert db.execute("SELECT array_agg(dataset_id ORDER BY ctid) = array_agg(dataset_id ORDER BY dataset_id)"
                      " FROM dataset_vectors").fetchone()[0]

    # An incremental run that changes nothing writes no copy.
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), first)
    assert copies(db) == before

    # One dataset's text changes: its copy alone is written again, of its new text.
    changed = copy.deepcopy(records)
    changed[7]["title"] = changed[7]["title"] + " (revised)"
    changed[7]["metadata_modified"] = _later(5)
    portal_server.set_records(changed)
    stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), first)
    assert stats["updated"] == 1
    after = copies(db)
    assert {s for s in after if after[s] != before[s]} == {changed[7]["id"]}
    assert db.execute(DRIFT, {"model": first.model}).fetchone()[0] == 0

    # Another model: its first run checks every dataset of the portal and copies the new vectors.
    monkeypatch.setenv("GEMINI_EMBEDDING_DIMENSION", "256")
    second = get_provider()
    assert second.model != first.model
    assert not vectors.copies_checked(db, portal.url, second.model)
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), second)
    assert {m for m, _ in copies(db).values()} == {second.model}
    assert db.execute("SELECT DISTINCT vector_dims(embedding) FROM dataset_vectors").fetchall() == [(256,)]
    assert db.execute(DRIFT, {"model": second.model}).fetchone()[0] == 0
    assert vectors.copies_checked(db, portal.url, second.model)
    assert not vectors.copies_checked(db, portal.url, first.model)


def test_a_portal_with_datasets_still_waiting_for_vectors_is_checked_again(db, reader, portal_server, samples,
                                                                         gemini):
    portal, provider = harvested(db, reader, portal_server, samples, 30)

    # a vector invalidated (to be embedded again) takes its copy with it
    source_id = db.execute("SELECT source_id FROM datasets ORDER BY id LIMIT 1").fetchone()[0]
    assert vectors.invalidate(db, provider.model, portal_url=portal.url, source_id=source_id) == 1
    assert source_id not in copies(db)
    with db.transaction():
        assert vectors.copy_for_search(db, portal.url, provider.model) == 0  # no vector to copy yet
    assert not vectors.copies_checked(db, portal.url, provider.model), "one live dataset has no copy"

    # the next run embeds it again, links it, and copies it
    stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider)
    assert stats["embedded"] == 1
    assert source_id in copies(db)
    assert db.execute(DRIFT, {"model": provider.model}).fetchone()[0] == 0
    assert vectors.copies_checked(db, portal.url, provider.model)


def test_a_checked_portal_looks_for_texts_to_embed_among_its_unlinked_datasets_only(db, reader, portal_server,
                                                                                    samples, gemini):
    """sql/012: once a pass found every live dataset of the portal with its copy of the model, a
    dataset linked to its current text counts as having that model's vector; the others (new,
    changed, waiting for a vector) are found through the datasets_pending index."""
    portal, provider = harvested(db, reader, portal_server, samples, 20)
    content_hash = db.execute("SELECT content_hash FROM datasets ORDER BY id LIMIT 1").fetchone()[0]

    # A vector gone behind the triggers' back: a checked portal trusts the link, an unchecked one looks.
    with db.transaction():
        db.execute("SET LOCAL session_replication_role = replica")
        db.execute("DELETE FROM embeddings WHERE content_hash = decode(%s, 'hex')", (content_hash,))
    assert vectors.count_pending(db, 0, portal.url, provider.model) == 0
    db.execute("DELETE FROM dataset_vectors_checked")
    assert vectors.count_pending(db, 0, portal.url, provider.model) == 1
    assert [b for b in vectors.iter_pending(reader, 0, portal.url, provider.model, 10)][0][0][0] == content_hash

    # Unlinked datasets are found either way.
    db.execute("UPDATE datasets SET embedded_content_hash = NULL WHERE content_hash = %s", (content_hash,))
    db.execute("INSERT INTO dataset_vectors_checked (portal_url, model) VALUES (%s, %s)", (portal.url, provider.model))
    assert vectors.count_pending(db, 0, portal.url, provider.model) == 1


def test_a_vector_deleted_by_hand_unmarks_the_portals_of_its_text(db, reader, portal_server, samples, gemini):
    portal, provider = harvested(db, reader, portal_server, samples, 20)

    # Not through `harvester embeddings invalidate` (which unlinks the datasets): the link stays.
    source_id, content_hash = db.execute("SELECT source_id, content_hash FROM datasets ORDER BY id LIMIT 1").fetchone()
    db.execute("DELETE FROM embeddings WHERE content_hash = decode(%s, 'hex')", (content_hash,))
    assert not vectors.copies_checked(db, portal.url, provider.model)
    assert source_id not in copies(db)

    # Pruning vectors no dataset has the text of leaves the mark alone.
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider, full_sync=True)
    assert vectors.copies_checked(db, portal.url, provider.model)
    db.execute("INSERT INTO embeddings (content_hash, model, dimension, embedding)"
               " SELECT decode('f' || repeat('0', 63), 'hex'), model, dimension, embedding FROM embeddings LIMIT 1")
    assert vectors.prune(db) == 1
    assert vectors.copies_checked(db, portal.url, provider.model)
    assert db.execute(DRIFT, {"model": provider.model}).fetchone()[0] == 0


def test_a_dataset_back_from_removal_after_a_model_switch_gets_the_new_models_vector(
        db, reader, portal_server, samples, gemini, monkeypatch):
    """Removed under one model, back (its text unchanged) after the portal moved to another, in an
    incremental run whose embedding is deferred: the next run still embeds it with the new model,
    though its link to the old model's vector would have said it had one."""
    from harvester.embeddings import get_provider

    records = distinct_records(samples, 20)
    gone = records[3]
    portal_server.set_records(records)
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    first = get_provider()
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), first)
    portal_server.set_records([r for r in records if r is not gone])
    assert pipeline.harvest(db, reader, portal, pipeline.source_for(portal), first, full_sync=True)["removed"] == 1

    monkeypatch.setenv("GEMINI_EMBEDDING_DIMENSION", "256")
    second = get_provider()
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), second, full_sync=True)
    assert vectors.copies_checked(db, portal.url, second.model)

    back = {**copy.deepcopy(gone), "metadata_modified": _later(5)}
    portal_server.set_records([r for r in records if r is not gone] + [back])
    monkeypatch.setenv("CB_FAILURE_THRESHOLD", "1")
    gemini.fail_next(10_000, status=503)
    stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), second)
    assert (stats["fetched"], stats["embedded"]) == (1, 0)
    assert db.execute("SELECT removed_at IS NULL FROM datasets WHERE source_id = %s", (gone["id"],)).fetchone()[0]

    gemini._fail.clear()
    db.execute("DELETE FROM circuit_breakers")  # the API is back: no waiting out the breaker
    stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), second)
    assert stats["embedded"] == 1
    assert copies(db)[gone["id"]][0] == second.model
    assert db.execute(DRIFT, {"model": second.model}).fetchone()[0] == 0


@pytest.mark.parametrize("table, make, find", [
    ("vector_scopes", lambda conn, key: vectors.scope(conn, f"https://{key}.example", "m"),
     lambda conn, key: vectors.existing_scope(conn, f"https://{key}.example", "m")),
    ("embedding_models", lambda conn, key: vectors.model_id(conn, key, create=True), vectors.model_id),
], ids=["scope", "model"])
def test_a_scope_or_a_models_id_is_made_once_and_two_transactions_making_it_get_one(database_url, table, make,
                                                                                       find):
    """vector_scopes (sql/041), embedding_models (sql/042): a portal's scope of a model, a model's id,
    is looked up, made only when missing (no identity value used up by the runs that find it), and a
    transaction that meets another's new, uncommitted one waits for it and gets its id."""
    import threading

    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        first = make(conn, "a")
        assert [make(conn, "a") for _ in range(3)] == [first] * 3
        assert find(conn, "other") is None
        assert make(conn, "other") == first + 1
        with psycopg.connect(database_url) as holder:
            made = make(holder, "b")  # its transaction left open
            got = []
            waiter = threading.Thread(target=lambda: got.append(make(conn, "b")))
            waiter.start()
            waiter.join(0.5)
            assert waiter.is_alive() and got == []  # waiting on the uncommitted row
            holder.commit()
            waiter.join(10)
        assert got == [made]
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 3
