"""The data path of large runs keeps what it stores: the same hashes for the same records, the same
jsonb in staging as json.dumps would give, the same dataset_search rows from the insert trigger
(sql/009) as from harvester_search_refresh."""
from __future__ import annotations

import hashlib

import psycopg
import pytest
from psycopg.types.json import Jsonb

from harvester.domain import dataset as ds
from harvester.pipeline import steps as pipeline
from harvester.config.portals import Portal
from harvester.store import staging

SAMPLE_FILES = ("catalog-data-gov.jsonl", "dados-gov-br.jsonl", "data-birmingham-gov-uk.jsonl",
                "data-gc-ca-snapshot-2013-06-17T11-50.jsonl", "data-gc-ca-snapshot-2013-06-17T12-30.jsonl",
                "data-gov-au.jsonl", "data-gov-uk.jsonl", "data-humdata-org.jsonl", "data-stadt-zuerich-ch.jsonl",
                "dkan-hauts-de-france.jsonl", "envidat-ch.jsonl", "govdata-de.jsonl")
# sha256 over "<file> <source_id> <content_hash> <metadata_hash> <url_hash>\n" of every sample record,
# normalized for https://portal.example.org, as the harvester computed them before the data path was
# made faster. A database holds these hashes: any change makes every dataset look changed.
SAMPLE_HASHES = "49e407108ec9d2850dc72719a926d77b91e93e943df496ddf5de744906429d01"


def test_the_hashes_of_the_sample_records_are_the_ones_databases_hold(samples):
    digest, n = hashlib.sha256(), 0
    for name in SAMPLE_FILES:
        for pkg in samples(name):
            r = ds.normalize(pkg, "https://portal.example.org")
            digest.update(f"{name} {r.source_id} {r.content_hash} {r.metadata_hash} {r.url_hash}\n".encode())
            n += 1
    assert n == 3122 and digest.hexdigest() == SAMPLE_HASHES


ODD = [
    {"id": "nul", "title": "Ti\x00tle", "notes": "a\x00b", "tags": [{"name": "t\x00ag"}, "plain"],
     "extras": [{"key": "k\x00", "value": "v\x00"}], "weird\x00key": {"n\x00": ["x\x00", 1, 2.5, None, True]}},
    {"id": "numbers", "x": 1.0, "y": 1e100, "z": 1e-05, "w": 1.5e-07, "big": 2 ** 70, "u64": 2 ** 64 - 1,
     "neg": -0.0, "lst": [0.1, 3, -2 ** 63]},
    {"id": "text", "uni": "ação \u2028 😀 \x7f", "esc": "quote\" back\\ tab\t \\u0000 literal", "empty": {}, "e": []},
    {"id": "keys", "nested": {"b": 1, "a": [{"z": 1, "y": 2}]}, "1": "a key that reads as a number"},
]


def test_staged_records_hold_the_jsonb_json_dumps_would_give(db, samples):
    packages = samples("dados-gov-br.jsonl")[:200] + samples("catalog-data-gov.jsonl")[:200] + ODD
    records = [ds.normalize(pkg, "https://p.org") for pkg in packages] + [ds.normalize(["not", "a", "dict"], "x")]
    run_id = pipeline.begin(db, Portal(name="p", url="https://p.org"), full_sync=True)["run_id"]
    staging.write(db, run_id, 0, records)
    db.execute("CREATE TEMP TABLE expected (seq int8, raw jsonb, tags jsonb)")
    with db.cursor() as cur, cur.copy("COPY expected (seq, raw, tags) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "jsonb", "jsonb"])
        for seq, rec in enumerate(records):  # what psycopg's Jsonb sends: json.dumps, U+0000 stripped
            copy.write_row((seq, Jsonb(staging._strip_nul(rec.raw)), Jsonb(staging._strip_nul(rec.tags))))
    differ = db.execute(
        "SELECT count(*), count(*) FILTER (WHERE s.raw::text IS DISTINCT FROM e.raw::text"
        "                                   OR s.tags::text IS DISTINCT FROM e.tags::text)"
        " FROM staging_records s JOIN expected e ON e.seq = s.seq WHERE s.run_id = %s", (run_id,)).fetchone()
    assert differ == (len(records), 0)
    title, raw = db.execute("SELECT title, raw FROM staging_records WHERE run_id = %s AND source_id = 'nul'",
                            (run_id,)).fetchone()
    assert title == "Title" and raw["weird" + "key"] == {"n": ["x", 1, 2.5, None, True]}
    assert db.execute("SELECT raw -> 'big', raw -> 'z' FROM staging_records WHERE source_id = 'numbers'"
                      ).fetchone() == (2 ** 70, 1e-05)


@pytest.mark.parametrize("value, shown", [(float("nan"), "NaN"), (float("inf"), "Infinity"),
                                          (-float("inf"), "-Infinity")])
def test_a_non_finite_number_is_staged_as_null_with_a_warning(db, value, shown):
    """json.dumps writes NaN and Infinity, which PostgreSQL refuses: the record used to fail its page's
    COPY on every run (issue 36); now the number is null and the record says so."""
    run_id = pipeline.begin(db, Portal(name="p", url="https://p.org"), full_sync=True)["run_id"]
    record = ds.normalize({"id": "x", "resources": [{"url": "u", "size": value}]}, "https://p.org")
    assert staging.write(db, run_id, 0, [record]) == 1
    raw, problems = db.execute("SELECT raw, problems FROM staging_records WHERE run_id = %s", (run_id,)).fetchone()
    assert raw["resources"] == [{"url": "u", "size": None}]
    assert [(p["code"], p["field"], p["value"]) for p in problems if p["code"] == "non-finite-number"] == [
        ("non-finite-number", "resources[0].size", shown)]


_SEARCH_ROW = ("SELECT d.source_id, s.portal_url, s.content_hash, s.removed_at, s.metadata_modified, s.config::text,"
               " s.organizations, s.tags, s.formats, s.licenses, s.document::text"
               " FROM dataset_search s JOIN datasets d ON d.id = s.dataset_id ORDER BY d.source_id")


def test_the_insert_trigger_writes_the_rows_harvester_search_refresh_writes(db, portal_server, samples):
    records = [r for name in ("dados-gov-br.jsonl", "data-humdata-org.jsonl", "data-gov-au.jsonl",
                              "govdata-de.jsonl", "envidat-ch.jsonl") for r in samples(name)[:150]]
    portal_server.set_records(records)
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0, language="portuguese")
    run_id = pipeline.begin(db, portal)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, pipeline.source_for(portal))
    from harvester.store import db as store_db
    with store_db.connect_url(db.info.dsn) as reader:
        pipeline.hash_compare(db, reader, portal, run_id)
    assert pipeline.upsert(db, portal, run_id, "no-model")["created"] == len(records)  # one INSERT statement
    by_trigger = db.execute(_SEARCH_ROW).fetchall()
    assert len(by_trigger) == len(records)
    db.execute("SELECT harvester_search_refresh(ARRAY(SELECT id FROM datasets))")
    assert db.execute(_SEARCH_ROW).fetchall() == by_trigger


def _stage_some(db, run_id: int, n: int = 3, prefix: str = "r") -> None:
    staging.write(db, run_id, 0, [ds.normalize({"id": f"{prefix}{i}", "title": f"T{i}"}, "https://p.org")
                                  for i in range(n)])


def _staged_runs(db) -> dict[int, int]:
    return dict(db.execute("SELECT run_id, count(*) FROM staging_records GROUP BY run_id").fetchall())


def _runs(db, n: int) -> list[int]:
    return [pipeline.begin(db, Portal(name=f"p{i}", url=f"https://p{i}.org"), full_sync=True)["run_id"]
            for i in range(n)]


def test_clearing_the_only_staged_run_empties_the_table(db):
    (run,) = _runs(db, 1)
    _stage_some(db, run)
    staging.clear(db, run)
    assert _staged_runs(db) == {}


def test_clearing_a_run_keeps_every_other_runs_records(db):
    first, second, third = _runs(db, 3)
    for run in (first, second, third):
        _stage_some(db, run)
    staging.clear(db, second)
    assert _staged_runs(db) == {first: 3, third: 3}
    with db.transaction():  # inside a transaction, as upsert clears at commit
        staging.clear(db, third)
    assert _staged_runs(db) == {first: 3}


def test_clearing_does_not_wait_for_a_reader_of_the_table(db, database_url):
    (run,) = _runs(db, 1)
    _stage_some(db, run)
    with psycopg.connect(database_url) as other:  # a transaction reading staging, still open
        assert other.execute("SELECT count(*) FROM staging_records").fetchone()[0] == 3
        staging.clear(db, run)  # cannot lock the table: deletes the run's rows instead of waiting
        assert _staged_runs(db) == {}
        other.rollback()


def test_a_role_that_may_delete_but_not_truncate_still_clears_its_run(db):
    import uuid

    (run,) = _runs(db, 1)
    _stage_some(db, run)
    role = f"deleter_{uuid.uuid4().hex[:8]}"
    db.execute(f'CREATE ROLE "{role}"')
    db.execute(f'GRANT SELECT, DELETE ON staging_records TO "{role}"')
    try:
        db.execute(f'SET ROLE "{role}"')
        staging.clear(db, run)
    finally:
        db.execute("RESET ROLE")
        db.execute(f'REVOKE ALL ON staging_records FROM "{role}"')
        db.execute(f'DROP ROLE "{role}"')
    assert _staged_runs(db) == {}


def test_classifying_again_gives_the_same_outcomes(db, portal_server, samples):
    from harvester.store import datasets

    portal_server.set_records(samples("data-gov-au.jsonl"))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0)
    run_id = pipeline.begin(db, portal)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, pipeline.source_for(portal))
    first = datasets.classify(db, run_id, portal.url)
    assert first["created"] == len(samples("data-gov-au.jsonl"))
    assert datasets.classify(db, run_id, portal.url) == first
