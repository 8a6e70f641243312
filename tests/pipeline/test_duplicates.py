"""Cross-portal duplicates on a real PostgreSQL, below Airflow: a national CKAN portal, a DCAT
aggregator that republishes part of it (testing/aggregator.py), and a second national portal with
an unrelated dataset of the same title. Expected groups are worked out here from the records: a
record is copied by the aggregator (its IRI from aggregator.dataset_iri), and is recognisable when
its id is a UUID or its name is unique on its portal."""
import copy
import re
from datetime import datetime, timedelta, timezone

import pytest

from harvester.config.portals import Portal
from harvester.pipeline import steps as pipeline
from harvester.store import duplicates
from harvester.testing import aggregator
from harvester.testing.dcat_portal import DcatServer

UK = "data-gov-uk.jsonl"
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture(scope="module")
def provider():
    from harvester.embeddings.local import LocalProvider

    return LocalProvider()


@pytest.fixture
def dcat_server():
    with DcatServer() as server:
        yield server


@pytest.fixture
def second_server():
    from harvester.testing.ckan_portal import DemoPortal

    with DemoPortal(records=[]) as server:
        yield server


def _recognisable(records: list[dict]) -> list[dict]:
    names = [r.get("name") for r in records]
    return [r for r in records if _UUID.match(r["id"]) or names.count(r.get("name")) == 1]


def _groups(db) -> dict[int, set[tuple[str, str]]]:
    out: dict[int, set] = {}
    for g, portal, source in db.execute("SELECT m.group_id, d.portal_url, d.source_id FROM duplicate_members m"
                                        " JOIN datasets d ON d.id = m.dataset_id"):
        out.setdefault(g, set()).add((portal, source))
    return out


def _decoy(record: dict) -> dict:
    """An unrelated dataset of the same title on another portal: another publisher, text, id, files."""
    other = copy.deepcopy(record)
    other.update(id="0c0ffee0-0000-4000-8000-000000000001", name="same-title-elsewhere",
                 notes="A survey of something else entirely, by another body.",
                 organization={"name": "other-body", "title": "Another Public Body"},
                 resources=[{"url": "https://other.example/data.csv", "format": "CSV", "name": "data"}],
                 extras=[], url=None)
    return other


class World:
    def __init__(self, db, reader, provider, national_server, dcat_server, second_server, records):
        self.db, self.reader, self.provider = db, reader, provider
        self.national_server, self.dcat_server, self.second_server = national_server, dcat_server, second_server
        self.records = records
        self.copied = _recognisable(records)[:4]
        self.national = Portal(name="national", url=national_server.base_url, politeness_delay=0, max_retries=0)
        self.aggregator = Portal(name="aggregator", url=dcat_server.url("/catalog.ttl"), type="dcat-rdf",
                                 politeness_delay=0, max_retries=0)
        self.other = Portal(name="other", url=second_server.base_url, politeness_delay=0, max_retries=0)
        national_server.set_records(records)
        dcat_server.set_document("/catalog.ttl", aggregator.catalogue(self.copied, national_server.base_url),
                                 "text/turtle")
        second_server.set_records([_decoy(self.copied[0])])

    def harvest(self, portal, **kwargs):
        stats = pipeline.harvest(self.db, self.reader, portal, pipeline.source_for(portal), self.provider, **kwargs)
        assert stats["failed"] == 0
        return stats

    def expected(self) -> dict[frozenset, None]:
        return {frozenset({(self.national.url, r["id"]), (self.aggregator.url, aggregator.dataset_iri(n, r))})
                for n, r in enumerate(self.copied)}

    def member(self, portal, source_id) -> dict:
        return duplicates.group_of(self.db, duplicates.find_dataset_id(self.db, portal.url, source_id))


@pytest.fixture
def world(db, reader, provider, portal_server, dcat_server, second_server, samples):
    return World(db, reader, provider, portal_server, dcat_server, second_server, samples(UK))


def test_an_aggregators_copies_are_grouped_with_their_source_and_the_same_title_elsewhere_is_not(world, db):
    for p in (world.national, world.aggregator, world.other):
        world.harvest(p, full_sync=True)
    assert {frozenset(m) for m in _groups(db).values()} == world.expected()
    # the national portal publishes first-hand: its member is canonical, the aggregator's is the copy
    rows = db.execute("SELECT d.portal_url, m.is_canonical, m.evidence, m.confidence, m.copy_of"
                      " FROM duplicate_members m JOIN datasets d ON d.id = m.dataset_id").fetchall()
    assert {(p, canonical, copy_of) for p, canonical, _, _, copy_of in rows} == {
        (world.national.url, True, False), (world.aggregator.url, False, True)}
    assert {(evidence, confidence) for _, _, evidence, confidence, _ in rows} == {("identifier", 1.0)}
    # the same title from another publisher, with other text and files: alone
    decoy = world.member(world.other, "0c0ffee0-0000-4000-8000-000000000001")
    assert decoy["group_id"] is None and decoy["members"] == []
    # a record whose name another record of its portal shares and whose id is no UUID is not
    # recognisable: the aggregator's copy of it would stay alone (none of them is grouped here)
    grouped_national = {s for g in _groups(db).values() for p, s in g if p == world.national.url}
    assert grouped_national == {r["id"] for r in world.copied}


def test_groups_follow_edits_removals_and_operators(world, db):
    for p in (world.national, world.aggregator, world.other):
        world.harvest(p, full_sync=True)
    first = world.copied[0]
    before = world.member(world.national, first["id"])

    # an edit on the source portal (title and description): still grouped, the same group
    edited = copy.deepcopy(world.records)
    for r in edited:
        if r["id"] == first["id"]:
            r["title"], r["notes"] = r["title"] + " (revised)", "Revised description."
            r["metadata_modified"] = (datetime.now(timezone.utc) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.%f")
    world.national_server.set_records(edited)
    stats = world.harvest(world.national)
    assert stats["updated"] == 1
    after = world.member(world.national, first["id"])
    assert after["group_id"] == before["group_id"]
    assert [m["dataset_id"] for m in after["members"]] == [m["dataset_id"] for m in before["members"]]

    # removed on the source: the aggregator's copy is the group's only live member, and canonical
    gone = world.copied[1]
    world.national_server.set_records([r for r in edited if r["id"] != gone["id"]])
    stats = world.harvest(world.national, full_sync=True)
    assert stats["removed"] == 1
    group = world.member(world.national, gone["id"])
    live = [m for m in group["members"] if m["live"]]
    assert len(group["members"]) == 2 and len(live) == 1
    assert live[0]["portal_url"] == world.aggregator.url and live[0]["is_canonical"]

    # an operator splits a group; the next runs of both portals keep it split
    third = world.copied[2]
    agg_id = duplicates.find_dataset_id(db, world.aggregator.url, aggregator.dataset_iri(2, third))
    duplicates.split(db, agg_id, by="test", note="not the same edition")
    assert duplicates.group_of(db, agg_id)["group_id"] is None
    world.harvest(world.national, full_sync=True)
    world.harvest(world.aggregator, full_sync=True)
    assert duplicates.group_of(db, agg_id)["group_id"] is None
    assert duplicates.group_of(db, duplicates.find_dataset_id(db, world.national.url, third["id"]))["group_id"] is None
    # and a merge of two datasets no evidence links survives too
    decoy = duplicates.find_dataset_id(db, world.other.url, "0c0ffee0-0000-4000-8000-000000000001")
    duplicates.merge(db, decoy, agg_id, by="test")
    world.harvest(world.other, full_sync=True)
    merged = duplicates.group_of(db, decoy)
    assert {m["dataset_id"] for m in merged["members"]} == {decoy, agg_id}
    assert {m["evidence"] for m in merged["members"]} == {"override"}
    # forgetting the overrides: the evidence alone decides again
    duplicates.forget(db, agg_id)
    assert {m["dataset_id"] for m in duplicates.group_of(db, agg_id)["members"]} == {
        agg_id, duplicates.find_dataset_id(db, world.national.url, third["id"])}


def test_a_run_that_changed_nothing_examines_nothing(world, db, caplog):
    for p in (world.national, world.aggregator):
        world.harvest(p, full_sync=True)
    keys_before = db.execute("SELECT count(*) FROM dataset_keys").fetchone()[0]
    members_before = db.execute("SELECT * FROM duplicate_members ORDER BY dataset_id").fetchall()
    caplog.clear()
    world.harvest(world.national)
    assert not [r for r in caplog.records if r.getMessage().startswith("duplicates:")]
    assert db.execute("SELECT count(*) FROM dataset_keys").fetchone()[0] == keys_before
    assert db.execute("SELECT * FROM duplicate_members ORDER BY dataset_id").fetchall() == members_before


def test_a_database_from_before_duplicates_is_grouped_by_each_portals_next_run(world, db):
    for p in (world.national, world.aggregator):
        world.harvest(p, full_sync=True)
    # as a database migrated from schema 017 is: datasets, no keys, no groups, no scans
    db.execute("DELETE FROM dataset_keys; DELETE FROM duplicate_members; DELETE FROM duplicate_scans")
    world.harvest(world.national)        # changes nothing, but scans the portal once
    assert _groups(db) == {}             # (the aggregator's datasets have no keys yet)
    world.harvest(world.aggregator)
    assert {frozenset(m) for m in _groups(db).values()} == world.expected()


def test_purging_a_removed_member_leaves_no_group_of_one(world, db):
    from harvester.store import history

    for p in (world.national, world.aggregator):
        world.harvest(p, full_sync=True)
    gone = world.copied[1]
    world.national_server.set_records([r for r in world.records if r["id"] != gone["id"]])
    world.harvest(world.national, full_sync=True)
    copy_id = duplicates.find_dataset_id(db, world.aggregator.url, aggregator.dataset_iri(1, gone))
    assert len(duplicates.group_of(db, copy_id)["members"]) == 2
    out = history.purge(db, world.national.url, datetime.now(timezone.utc) + timedelta(days=1))
    assert out["datasets"] == 1
    assert duplicates.group_of(db, copy_id)["group_id"] is None
    assert {frozenset(m) for m in _groups(db).values()} == {
        g for g in world.expected() if (world.national.url, gone["id"]) not in g}


def test_a_commit_never_waits_for_another_portals_grouping(world, db, database_url, monkeypatch, caplog):
    """Issue 36: grouping holds one lock for all portals, for as long as its keys and groups take
    (minutes for a million datasets). A run's commit takes no part in it: it commits while another
    grouping holds the lock, its changes wait in the queue, and the next grouping (here a retry of
    its upsert, as after a worker that died past the commit) takes them."""
    import psycopg

    late = world.copied[1]  # the national portal publishes it only later: the aggregator's copy is alone
    world.national_server.set_records([r for r in world.records if r["id"] != late["id"]])
    for p in (world.national, world.aggregator):
        world.harvest(p, full_sync=True)
    copy_id = duplicates.find_dataset_id(db, world.aggregator.url, aggregator.dataset_iri(1, late))
    assert duplicates.group_of(db, copy_id)["group_id"] is None
    monkeypatch.setenv("HARVESTER_LOCK_TIMEOUT_SECS", "1")
    monkeypatch.setenv("HARVESTER_GROUPING_WAIT_SECS", "1")
    world.national_server.set_records(world.records)
    with psycopg.connect(database_url) as other:  # another portal's grouping, under way
        other.execute("SELECT pg_advisory_xact_lock(%s)", (duplicates._LOCK_KEY,))
        caplog.clear()
        stats = world.harvest(world.national)
        other.rollback()
    assert stats["created"] == 1
    assert db.execute("SELECT status FROM sync_runs WHERE run_id = %s", (stats["run_id"],)).fetchone()[0] == "committed"
    deferred = [r.getMessage() for r in caplog.records if r.getMessage().startswith("duplicate grouping deferred")]
    assert deferred and "held the duplicate groups' lock for more than 1s" in deferred[0]
    # not grouped yet: the new dataset waits in the queue
    assert duplicates.waiting(db) == 1
    assert duplicates.group_of(db, copy_id)["group_id"] is None
    # a retry of the committed run's upsert has nothing to redo but the grouping
    pipeline.upsert(db, world.national, stats["run_id"], world.provider.model)
    assert duplicates.waiting(db) == 0
    assert len(duplicates.group_of(db, copy_id)["members"]) == 2
    assert {frozenset(m) for m in _groups(db).values()} == world.expected()


def test_the_queue_is_grouped_by_any_portals_next_grouping(world, db, database_url, monkeypatch):
    import psycopg

    world.harvest(world.national, full_sync=True)
    monkeypatch.setenv("HARVESTER_GROUPING_WAIT_SECS", "1")
    with psycopg.connect(database_url) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s)", (duplicates._LOCK_KEY,))
        world.harvest(world.aggregator, full_sync=True)    # its first scan: every dataset queued
        other.rollback()
    assert duplicates.waiting(db) == len(world.copied) and _groups(db) == {}
    world.harvest(world.other, full_sync=True)             # another portal's run groups the whole queue
    assert duplicates.waiting(db) == 0
    assert {frozenset(m) for m in _groups(db).values()} == world.expected()


def test_a_queue_grouped_in_chunks_gives_the_groups_of_one_grouping(world, db):
    """Every portal re-keyed at once (an upgrade) is one queue: a grouping takes it a chunk at a time
    (GROUPING_CHUNK: bounded memory and lock time), each chunk in its own transaction, and the cut
    changes nothing in the groups; past ``until`` the rest stays queued."""
    import time

    for p in (world.national, world.aggregator, world.other):
        world.harvest(p, full_sync=True)
    expected = {frozenset(m) for m in _groups(db).values()}
    assert expected == world.expected()

    def upgrade() -> int:  # as a migration that changes the keys would leave it: every dataset queued
        db.execute("DELETE FROM duplicate_members; DELETE FROM dataset_keys")
        return db.execute("INSERT INTO duplicate_pending (dataset_id) SELECT id FROM datasets ORDER BY id DESC").rowcount

    queued = upgrade()
    assert queued > 6
    first = duplicates.regroup_pending(db, wait=5, chunk=3, until=time.monotonic())
    assert (first["chunks"], first["stopped"], first["left"]) == (1, "deadline", queued - 3)
    assert duplicates.waiting(db) == queued - 3
    rest = duplicates.regroup_pending(db, wait=5, chunk=3)
    assert rest["stopped"] is None and rest["left"] == 0 and rest["chunks"] == (queued - 3) // 3 + 1
    assert first["touched"] + rest["touched"] == queued
    assert {frozenset(m) for m in _groups(db).values()} == expected
    # the same queue in one grouping: the same groups
    upgrade()
    whole = duplicates.regroup_pending(db, wait=5)
    assert (whole["chunks"], whole["touched"]) == (1, queued)
    assert {frozenset(m) for m in _groups(db).values()} == expected
