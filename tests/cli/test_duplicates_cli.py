"""`harvester duplicates` on a real PostgreSQL: a national CKAN portal, a DCAT aggregator republishing
three of its records (testing/aggregator.py) and a second CKAN portal with an unrelated dataset,
harvested below Airflow; then the commands, in-process, against what the tables hold."""
import json

import pytest
import yaml

from harvester.cli.main import main
from harvester.config.portals import Portal
from harvester.pipeline import steps as pipeline
from harvester.testing import aggregator
from harvester.testing.ckan_portal import DemoPortal
from harvester.testing.dcat_portal import DcatServer

NATIONAL = "data-birmingham-gov-uk.jsonl"   # ten records, each with a UUID id and a name of its own
OTHER = "data-gov-au.jsonl"


@pytest.fixture(scope="module")
def provider():
    from harvester.embeddings.local import LocalProvider

    return LocalProvider()


class World:
    """Three portals in portals.yaml, harvested with ``harvest``; the aggregator copies records 0-2."""

    def __init__(self, db, reader, provider, national_server, dcat_server, other_server, samples, tmp_path,
                 monkeypatch):
        self.db, self.reader, self.provider = db, reader, provider
        self.records = samples(NATIONAL)
        self.copied = self.records[:3]
        self.unrelated = samples(OTHER)[0]
        national_server.set_records(self.records)
        dcat_server.set_document("/catalog.ttl", aggregator.catalogue(self.copied, national_server.base_url),
                                 "text/turtle")
        other_server.set_records([self.unrelated])
        self.national = Portal(name="national", url=national_server.base_url, politeness_delay=0, max_retries=0)
        self.aggregator = Portal(name="aggregator", url=dcat_server.url("/catalog.ttl"), type="dcat-rdf",
                                 politeness_delay=0, max_retries=0)
        self.other = Portal(name="other", url=other_server.base_url, politeness_delay=0, max_retries=0)
        path = tmp_path / "portals.yaml"
        path.write_text(yaml.safe_dump({"portals": [
            {"name": "national", "url": self.national.url, "politeness_delay": 0},
            {"name": "aggregator", "url": self.aggregator.url, "type": "dcat-rdf", "politeness_delay": 0},
            {"name": "other", "url": self.other.url, "politeness_delay": 0}]}))
        monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))

    def harvest(self, *portals, **kwargs):
        for portal in portals or (self.national, self.aggregator, self.other):
            stats = pipeline.harvest(self.db, self.reader, portal, pipeline.source_for(portal), self.provider,
                                     **kwargs)
            assert stats["failed"] == 0

    def copy_id(self, n: int) -> str:
        """The aggregator's source_id of its copy of record ``n``."""
        return aggregator.dataset_iri(n, self.copied[n])

    def group_rows(self) -> dict[int, set[tuple[str, str]]]:
        out: dict[int, set] = {}
        for g, portal, source in self.db.execute(
                "SELECT m.group_id, d.portal_url, d.source_id FROM duplicate_members m"
                " JOIN datasets d ON d.id = m.dataset_id"):
            out.setdefault(g, set()).add((portal, source))
        return out


@pytest.fixture
def world(db, reader, provider, database_url, samples, tmp_path, monkeypatch):
    with DemoPortal(records=[]) as national, DcatServer() as dcat, DemoPortal(records=[]) as other:
        w = World(db, reader, provider, national, dcat, other, samples, tmp_path, monkeypatch)
        w.harvest(full_sync=True)
        yield w


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def as_json(capsys, *argv):
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_list_and_show_say_what_the_tables_hold(world, capsys):
    listed = as_json(capsys, "duplicates", "list")
    tables = world.group_rows()
    assert listed["total"] == len(tables) == 3
    listed_groups = {g["group_id"]: {(m["portal_url"], m["source_id"]) for m in g["members"]} for g in listed["groups"]}
    assert listed_groups == tables
    expected = {frozenset({(world.national.url, r["id"]), (world.aggregator.url, world.copy_id(n))})
                for n, r in enumerate(world.copied)}
    assert {frozenset(v) for v in tables.values()} == expected
    for g in listed["groups"]:
        canonical, copy = g["members"]
        assert (canonical["portal_name"], canonical["is_canonical"]) == ("national", True)
        assert (copy["portal_name"], copy["is_canonical"], copy["copy_of"]) == ("aggregator", False, True)
        assert (copy["evidence"], copy["confidence"]) == ("identifier", 1.0)
        assert copy["title"] and canonical["title"]
    # paging and a portal filter (by name, and by URL)
    page = as_json(capsys, "duplicates", "list", "--limit", "2", "--offset", "2")
    assert (page["total"], len(page["groups"])) == (3, 1)
    assert page["groups"][0]["group_id"] == listed["groups"][2]["group_id"]
    assert as_json(capsys, "duplicates", "list", "-p", "other")["total"] == 0
    assert as_json(capsys, "duplicates", "list", "-p", world.aggregator.url)["total"] == 3

    code, out, _ = run(capsys, "duplicates", "list")
    assert code == 0 and "3 duplicate groups" in out and world.copy_id(0) in out

    shown = as_json(capsys, "duplicates", "show", "aggregator", world.copy_id(0))
    (members,) = [v for g, v in tables.items() if g == shown["group_id"]]
    assert {(m["portal_url"], m["source_id"]) for m in shown["members"]} == members
    assert shown["overrides"] == []
    alone = as_json(capsys, "duplicates", "show", "national", world.records[5]["id"])
    assert (alone["group_id"], alone["members"]) == (None, [])
    code, out, _ = run(capsys, "duplicates", "show", "national", world.records[5]["id"])
    assert code == 0 and "alone" in out

    stats = as_json(capsys, "duplicates", "stats", "aggregator")
    assert stats["copies"] == 3 and stats["copies_of"][0]["portal_url"] == world.national.url
    national = as_json(capsys, "duplicates", "stats", world.national.url)
    assert (national["copies"], national["copied_by"][0]["datasets"]) == (0, 3)


def test_a_split_is_kept_by_the_next_runs(world, capsys, monkeypatch):
    monkeypatch.setattr("getpass.getuser", lambda: "ana")
    code, out, err = run(capsys, "duplicates", "split", "aggregator", world.copy_id(1), "--note", "another edition")
    assert code == 0, err
    assert "alone" in out
    world.harvest(world.national, world.aggregator, full_sync=True)
    shown = as_json(capsys, "duplicates", "show", "aggregator", world.copy_id(1))
    assert shown["group_id"] is None
    (override,) = shown["overrides"]
    assert (override["decision"], override["decided_by"], override["note"]) == ("different", "cli:ana",
                                                                                  "another edition")
    assert as_json(capsys, "duplicates", "show", "national", world.copied[1]["id"])["group_id"] is None
    assert len(world.group_rows()) == 2

    # forget: the evidence alone groups them again
    forgot = as_json(capsys, "duplicates", "forget", "aggregator", world.copy_id(1))
    assert forgot["forgotten"] == 1 and forgot["overrides"] == []
    assert {(m["portal_url"], m["source_id"]) for m in forgot["members"]} == {
        (world.national.url, world.copied[1]["id"]), (world.aggregator.url, world.copy_id(1))}
    assert len(world.group_rows()) == 3

    # --from: apart from one member only
    code, _, err = run(capsys, "duplicates", "split", "national", world.copied[2]["id"],
                       "--from", "aggregator", world.copy_id(2), "--by", "bob")
    assert code == 0, err
    shown = as_json(capsys, "duplicates", "show", "national", world.copied[2]["id"])
    assert shown["group_id"] is None and shown["overrides"][0]["decided_by"] == "bob"


def test_a_merge_of_unrelated_datasets_survives_a_run(world, capsys):
    unrelated, uncopied = world.unrelated["id"], world.records[6]["id"]
    merged = as_json(capsys, "duplicates", "merge", "other", unrelated, "national", uncopied, "--note", "same survey")
    assert {(m["portal_url"], m["source_id"]) for m in merged["members"]} == {
        (world.other.url, unrelated), (world.national.url, uncopied)}
    assert {m["evidence"] for m in merged["members"]} == {"override"}
    world.harvest(world.other, world.national, full_sync=True)
    groups = {frozenset(v) for v in world.group_rows().values()}
    assert frozenset({(world.other.url, unrelated), (world.national.url, uncopied)}) in groups
    assert len(groups) == 4
    assert as_json(capsys, "duplicates", "forget", "national", uncopied)["group_id"] is None
    assert len(world.group_rows()) == 3


def test_unknown_portals_and_datasets_are_named(world, capsys):
    code, _, err = run(capsys, "duplicates", "show", "nowhere", "x")
    assert code == 2 and "no portal named 'nowhere'" in err
    code, _, err = run(capsys, "duplicates", "show", "https://nowhere.example", "x")
    assert code == 2 and "no portal https://nowhere.example in portals.yaml or in the database" in err
    code, _, err = run(capsys, "duplicates", "show", "national", "no-such-dataset")
    assert code == 2 and f"no dataset with id 'no-such-dataset' in portal national ({world.national.url})" in err
    code, _, err = run(capsys, "duplicates", "merge", "national", world.records[6]["id"], "other", "missing-too")
    assert code == 2 and "no dataset with id 'missing-too' in portal other" in err
    code, _, err = run(capsys, "duplicates", "split", "national", world.records[6]["id"])
    assert code == 2 and "is in no duplicate group" in err
    code, _, err = run(capsys, "duplicates", "merge", "national", world.records[6]["id"],
                       "national", world.records[6]["id"])
    assert code == 2 and "cannot be a duplicate of itself" in err
    code, _, err = run(capsys, "duplicates", "stats", "nowhere")
    assert code == 2 and "no portal named 'nowhere'" in err


def test_regroup_groups_what_a_deferred_grouping_left_and_says_when_it_cannot(world, database_url, capsys,
                                                                               monkeypatch):
    import psycopg

    from harvester.store import duplicates

    # as a database whose runs committed but whose groupings were all left: nothing grouped yet
    world.db.execute("DELETE FROM duplicate_members; DELETE FROM dataset_keys")
    queued = world.db.execute("INSERT INTO duplicate_pending (dataset_id) SELECT id FROM datasets").rowcount
    assert queued == 14
    code, out, _ = run(capsys, "duplicates", "list")
    assert code == 0 and "14 datasets changed by committed runs wait to be grouped" in out
    with psycopg.connect(database_url) as other:  # a grouping under way
        other.execute("SELECT pg_advisory_xact_lock(%s)", (duplicates._LOCK_KEY,))
        code, _, err = run(capsys, "duplicates", "regroup", "--wait", "0.5")
        other.rollback()
    assert code == 2 and "held the duplicate groups' lock for more than 0.5s" in err
    assert duplicates.waiting(world.db) == 14
    code, out, _ = run(capsys, "duplicates", "regroup", "--json")
    assert code == 0 and json.loads(out)["touched"] == 14
    assert duplicates.waiting(world.db) == 0
    assert len(world.group_rows()) == 3
    code, out, _ = run(capsys, "duplicates", "regroup")
    assert code == 0 and out.strip() == "no dataset waits to be grouped"
    with pytest.raises(SystemExit) as exited:
        main(["duplicates", "regroup", "--wait", "-1"])
    assert exited.value.code == 2 and "'-1' must be a number of seconds above 0" in capsys.readouterr().err


def test_a_split_during_a_long_grouping_says_so_and_changes_nothing(world, database_url, capsys, monkeypatch):
    import psycopg

    from harvester.store import duplicates

    monkeypatch.setenv("HARVESTER_LOCK_TIMEOUT_SECS", "1")
    before = world.group_rows()
    with psycopg.connect(database_url) as grouping:
        grouping.execute("SELECT pg_advisory_xact_lock(%s)", (duplicates._LOCK_KEY,))
        code, _, err = run(capsys, "duplicates", "split", "national", world.copied[0]["id"])
        grouping.rollback()
    assert code == 2 and "a duplicate grouping held the groups' lock for more than 1s" in err
    assert "nothing was changed" in err and "Traceback" not in err
    assert world.group_rows() == before
