"""Per-record outcomes on a real PostgreSQL and the local CKAN portal, below Airflow: which rows a
run writes and when, what a retried step and a second run write, a catalogue whose records all
fail, deferred embeddings, withheld removals, the purge, and the grouped report against the rows.

Expectations are computed here from the sample file itself (what a record lacks), not from the
code under test."""
import copy
import re
from datetime import datetime, timedelta, timezone

import pytest

from harvester.config.portals import Portal
from harvester.domain import outcomes as oc
from harvester.pipeline import steps as pipeline
from harvester.store import history, outcomes, runs

BIRMINGHAM = "data-birmingham-gov-uk.jsonl"
UK = "data-gov-uk.jsonl"  # 4 of 7 records name no licence, 2 have no resource
_TAG = re.compile(r"<[^>]*>")


@pytest.fixture(scope="module")
def provider():
    from harvester.embeddings.local import LocalProvider

    return LocalProvider()


def _blank_text(value) -> bool:
    return not isinstance(value, str) or not _TAG.sub(" ", value).replace("&nbsp;", " ").strip()


def _broken(records: list[dict]) -> list[dict]:
    """Two records the harvest must refuse: one without an id, one whose metadata_modified is not a date."""
    no_id = copy.deepcopy(records[0])
    no_id.pop("id")
    no_id["name"] = "no-id-here"
    bad_date = copy.deepcopy(records[1])
    bad_date["id"], bad_date["name"], bad_date["metadata_modified"] = "bad-date-1", "bad-date-1", "last tuesday"
    return [no_id, bad_date]


@pytest.fixture
def portal(portal_server):
    return Portal(name="p", url=portal_server.base_url, politeness_delay=0, max_retries=0)


def _rows(db, run_id: int) -> list[dict]:
    """The run's rows, without the time each was written (a retried step writes its rows anew)."""
    rows, total = outcomes.page(db, run_id, limit=100000)
    assert total == len(rows)
    return [{k: v for k, v in r.items() if k != "recorded_at"} for r in rows]


def _by_code(rows) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        out[r["code"]] = out.get(r["code"], 0) + 1
    return out


def test_a_run_reports_its_failed_records_and_the_warnings_of_those_it_takes(db, reader, portal, portal_server,
                                                                             samples, provider):
    good = samples(UK)
    portal_server.set_records(good + _broken(good))
    stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider, full_sync=True)
    run_id = stats["run_id"]
    assert runs.get(db, run_id).status == "committed"
    assert stats["failed"] == 2 and stats["created"] == len(good)

    rows = _rows(db, run_id)
    errors = [r for r in rows if r["severity"] == "error"]
    assert _by_code(errors) == {"no-identifier": 1, "bad-date": 1}
    no_id = next(r for r in errors if r["code"] == "no-identifier")
    assert no_id["source_id"] is None and 1 <= no_id["position"] <= len(good) + 2 and "no-id-here" in no_id["message"]
    bad = next(r for r in errors if r["code"] == "bad-date")
    assert (bad["source_id"], bad["field"], bad["value"]) == ("bad-date-1", "metadata_modified", "last tuesday")

    # Warnings never drop a record: every good record is stored, warned or not.
    warnings = [r for r in rows if r["severity"] == "warning"]
    assert db.execute("SELECT count(*) FROM datasets WHERE removed_at IS NULL").fetchone()[0] == len(good)
    expected = {
        "no-description": sum(_blank_text(r.get("notes")) for r in good),
        "no-license": sum(not (r.get("license_id") or r.get("license_title")) for r in good),
        "no-distribution": sum(not r.get("resources") for r in good),
    }
    found = _by_code(warnings)
    assert expected["no-license"] and expected["no-distribution"]  # the sample has some of each
    for code, n in expected.items():
        assert found.get(code, 0) == n, code
    assert {r["source_id"] for r in warnings} <= {r["id"] for r in good}

    # The grouped report is the grouping of the rows, in SQL as in Python.
    assert outcomes.groups(db, run_id) == [g.as_dict() for g in oc.group(rows)]
    assert outcomes.counts(db, [run_id])[run_id] == {"errors": len(errors), "warnings": len(warnings)}
    only_errors = outcomes.groups(db, run_id, severity="error")
    assert [g["code"] for g in only_errors] == sorted(["no-identifier", "bad-date"],
                                                    key=lambda c: (-_by_code(errors)[c], c))


def test_a_retried_step_and_a_second_run_do_not_duplicate_rows(db, reader, portal, portal_server, samples,
                                                                provider):
    good = samples(BIRMINGHAM)
    portal_server.set_records(good + _broken(good))
    source = pipeline.source_for(portal)
    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, source)
    after_fetch = _rows(db, run_id)
    assert {r["severity"] for r in after_fetch} == {"error"} and len(after_fetch) == 2  # warnings wait for classify
    pipeline.fetch_modified(db, portal, run_id, source)  # the task's retry
    assert len(_rows(db, run_id)) == 2
    pipeline.hash_compare(db, reader, portal, run_id, provider.model)
    first = _rows(db, run_id)
    pipeline.hash_compare(db, reader, portal, run_id, provider.model)  # retried
    assert _rows(db, run_id) == first
    pipeline.embed_changed(db, reader, portal, run_id, provider)
    pipeline.upsert(db, portal, run_id, provider.model)
    after = _rows(db, run_id)
    assert after == first, [(a, b) for a, b in zip(after, first) if a != b][:2]

    # The same catalogue again: the failed records are reported again (still not stored); the
    # unchanged records' warnings are not; the first run's rows are as they were.
    second = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider, full_sync=True)
    rows2 = _rows(db, second["run_id"])
    assert _by_code(rows2) == {"no-identifier": 1, "bad-date": 1}
    assert _rows(db, run_id) == first


def test_a_catalogue_whose_records_all_fail_fails_the_run_and_keeps_its_report(db, reader, portal, portal_server,
                                                                               samples, provider):
    good = samples(BIRMINGHAM)[:5]
    broken = []
    for r in good:
        r = copy.deepcopy(r)
        r.pop("id")
        broken.append(r)
    portal_server.set_records(broken)
    with pytest.raises(pipeline.NothingUsable, match=r"all 5 records p listed failed \(5 no-identifier\)"):
        pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider, full_sync=True)
    run = db.execute("SELECT run_id, status, error FROM sync_runs").fetchone()
    assert run[1] == "failed" and "harvester report" in run[2]
    assert _by_code(_rows(db, run[0])) == {"no-identifier": 5}
    assert runs.status(db, portal.url).watermark is None  # nothing committed
    assert not pipeline.NothingUsable("x").transient


def test_deferred_embeddings_and_withheld_removals_are_rows_of_the_run(db, reader, portal, portal_server, samples,
                                                                     provider):
    good = samples(BIRMINGHAM)
    portal_server.set_records(good)
    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, pipeline.source_for(portal))
    pipeline.hash_compare(db, reader, portal, run_id, provider.model)
    stats = pipeline.upsert(db, portal, run_id, provider.model)  # no embed_changed: every text is left pending
    deferred = [r for r in _rows(db, run_id) if r["code"] == "embedding-deferred"]
    assert stats["skipped"] == len(good) == len(deferred)
    assert {r["source_id"] for r in deferred} == {r["id"] for r in good}
    assert {(r["stage"], r["severity"]) for r in deferred} == {("embed", "warning")}

    portal_server.set_records(good[:2])  # most of the portal gone at once: the guard withholds
    stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider, full_sync=True)
    withheld = [r for r in _rows(db, stats["run_id"]) if r["code"] == "removal-withheld"]
    assert stats["removals_withheld"] == len(good) - 2 == len(withheld)
    assert {r["source_id"] for r in withheld} == {r["id"] for r in good[2:]}
    assert "removal guard" in withheld[0]["message"]


def test_a_record_a_reconciliation_fetches_and_fails_is_reported(db, reader, portal, portal_server, samples,
                                                                  provider):
    # A record an incremental listing never shows (its date is not one: no range filter matches it),
    # found missing by the reconciliation, fetched by id, and refused: its error is a row of the run.
    good = samples(BIRMINGHAM)
    portal_server.set_records(good)
    pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider, full_sync=True)
    portal_server.upsert_record({**good[0], "id": "undated-1", "name": "undated-1", "metadata_modified": "soon"})
    stats = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider, reconcile=True)
    assert (stats["reconcile_missing"], stats["reconcile_fetched"], stats["failed"]) == (1, 1, 1)
    (row,) = [r for r in _rows(db, stats["run_id"]) if r["severity"] == "error"]
    assert (row["source_id"], row["code"], row["value"]) == ("undated-1", "bad-date", "soon")


def test_the_purge_prunes_rows_older_than_the_retention(db, reader, portal, portal_server, samples, provider):
    good = samples(UK)
    portal_server.set_records(good + _broken(good))
    run_id = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider, full_sync=True)["run_id"]
    held = len(_rows(db, run_id))
    assert held > 2
    far_past = datetime.now(timezone.utc) - timedelta(days=3650)
    kept = history.purge(db, portal.url, far_past, outcomes_before=datetime.now(timezone.utc) - timedelta(days=1))
    assert kept["outcomes"] == 0 and len(_rows(db, run_id)) == held
    later = datetime.now(timezone.utc) + timedelta(seconds=1)
    assert history.purge(db, portal.url, far_past, dry_run=True, outcomes_before=later)["outcomes"] == held
    assert len(_rows(db, run_id)) == held
    assert history.purge(db, portal.url, far_past, outcomes_before=later)["outcomes"] == held
    assert _rows(db, run_id) == []


def test_the_task_log_names_the_first_failed_records_and_counts_the_rest(db, reader, portal, portal_server, samples,
                                                                        provider, caplog):
    good = samples(BIRMINGHAM)
    broken = [{**{k: v for k, v in good[i % len(good)].items() if k != "id"}, "name": f"no-id-{i}",
               "metadata_modified": f"2021-01-01T00:00:{i:02d}"} for i in range(pipeline.LOGGED_FAILURES + 15)]
    portal_server.set_records(good + broken)
    with caplog.at_level("WARNING", logger="harvester.pipeline.steps"):
        run_id = pipeline.harvest(db, reader, portal, pipeline.source_for(portal), provider, full_sync=True)["run_id"]
    named = [r for r in caplog.records if r.getMessage().startswith("record failed:")]
    assert len(named) == pipeline.LOGGED_FAILURES
    assert any(r.getMessage().startswith("more records failed") and f"harvester report {run_id}" in r.getMessage()
               for r in caplog.records)
    assert outcomes.counts(db, [run_id])[run_id]["errors"] == len(broken)  # every one reported all the same


def test_bad_filters_name_the_bad_value(db):
    with pytest.raises(ValueError, match="severity 'fatal'"):
        outcomes.page(db, 1, severity="fatal")
    with pytest.raises(ValueError, match="'no-such-code' is not a reason code"):
        outcomes.groups(db, 1) or outcomes.page(db, 1, code="no-such-code")
