"""ISO WAFs (type: iso-waf) through real Airflow (dag.test()), real HTTP to the local WAF
(testing/iso_waf_portal.py) and a real PostgreSQL. The WAF holds 200 files derived from the five
real records of ../shared/portal-samples/iso-waf/ in nested folders listed in five dated styles
(Apache table and <pre>, nginx, IIS short and long dates) and a folder of undated ones (the Census
<ul>); the ids expected are the files' URLs, as the server holds them."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from harvester.testing.iso_waf_portal import (RECORDS, WafFile, WafServer, catalogue, derive, folder_of, real_record)

FILES, PER_FOLDER = 200, 20
UNDATED = "undated/"


@pytest.fixture(autouse=True)
def task_retries(monkeypatch):
    monkeypatch.setenv("HARVESTER_TASK_RETRIES", "2")
    monkeypatch.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "0")


def make_files() -> dict[str, WafFile]:
    files = catalogue(FILES, per_folder=PER_FOLDER)
    for i in range(4):
        files[f"{UNDATED}u{i}.xml"] = WafFile(derive(real_record(RECORDS[i]), title=f"Undated {i}",
                                                     file_id=f"u{i}"), datetime(2024, 6, 1))
    return files


@pytest.fixture
def waf():
    files = make_files()
    folders = {p.rsplit("/", 1)[0] + "/" for p in files} | {"", "g0/", "g1/", "g2/", "g3/", "g4/", "g5/"}
    dated = ("apache", "nginx", "iis", "iis-long", "apache-pre")
    styles = {f: dated[i % len(dated)] for i, f in enumerate(sorted(folders))}
    styles[UNDATED] = "apache-nodates"
    with WafServer(files, styles=styles) as server:
        yield server


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats, error FROM sync_runs"
                      " ORDER BY run_id DESC LIMIT 1").fetchone()


def live(db) -> dict[str, tuple]:
    return {r[0]: r[1:] for r in db.execute("SELECT source_id, title, metadata_modified FROM datasets"
                                            " WHERE removed_at IS NULL").fetchall()}


def fetched(waf) -> list[str]:
    return sorted(path.rsplit("/", 1)[-1] for path, _, status in waf.file_requests() if status == 200)


def run(harvest, db, **conf):
    dag_run = harvest.run(**conf)
    return dag_run, last_run(db)


def now_local() -> datetime:
    """The WAF server's local time (its clock says UTC) to the minute."""
    return datetime.now(timezone.utc).replace(tzinfo=None, second=0, microsecond=0)


def test_a_waf_synced_exactly_then_incrementally_with_removals_and_a_resumed_fault(harvest, waf, db, gemini):
    harvest.configure(waf.url, type="iso-waf", reconcile_every="0", max_retries=1)
    files = dict(waf.files)
    # -- the first sync: every file, exactly
    dag_run, (_, mode, status, stats, _) = run(harvest, db)
    assert (dag_run.state, mode, status) == ("success", "full", "committed")
    held = live(db)
    assert set(held) == {waf.url + p for p in files}
    assert (stats["created"], stats["failed"], stats["fetched"]) == (FILES + 4, 0, FILES + 4)
    assert held[waf.url + "g1/s0/record-000031.xml"][0] == "Record 31"
    assert held[waf.url + "g1/s0/record-000031.xml"][1] == datetime(2024, 1, 1, 0, 31, tzinfo=timezone.utc)
    assert held[waf.url + UNDATED + "u2.xml"][1] is None
    folders = len(waf.listing_requests())
    assert stats["portal_requests"] == folders + FILES + 4

    # -- an incremental: two files edited and one added now, one edited with an old date (only a
    # reconciliation sees it), one removed; the undated ones answer 304
    edited = [f"{folder_of(i, PER_FOLDER)}record-{i:06d}.xml" for i in (7, 130)]
    for path in edited:
        files[path] = WafFile(derive(files[path].data(), title=f"Edited {path}"), now_local())
    files["g3/new/new.xml"] = WafFile(derive(real_record(RECORDS[3]), title="New file"), now_local())
    late = f"{folder_of(180, PER_FOLDER)}record-000180.xml"
    files[late] = WafFile(derive(files[late].data(), title="Edited late"), datetime(2024, 3, 1))
    touched = f"{folder_of(181, PER_FOLDER)}record-000181.xml"
    files[touched] = WafFile(files[touched].body, datetime(2024, 3, 2))  # a new date, the same content
    gone = f"{folder_of(42, PER_FOLDER)}record-000042.xml"
    del files[gone]
    waf.set_files(files)
    waf.requests.clear()
    dag_run, (_, mode, status, stats, _) = run(harvest, db)
    assert (dag_run.state, mode, status) == ("success", "incremental", "committed")
    # fetch_modified: the three dated now (the 14 h margin); reconcile: the two its dates show changed
    assert fetched(waf) == sorted(p.rsplit("/", 1)[-1] for p in edited + ["new.xml", late, touched])
    assert sorted(s for _, _, s in waf.file_requests()) == [200] * 5 + [304] * 4
    # two walks (fetch_modified's, the reconciliation's) of every folder, the new one included
    assert len(waf.listing_requests()) == 2 * (folders + 1)
    assert stats["portal_requests"] == len(waf.requests) == 2 * (folders + 1) + 9
    assert (stats["created"], stats["updated"], stats["removed"], stats["unchanged"]) == (1, 3, 1, 1)
    assert (stats["reconcile_stale"], stats["reconcile_missing"]) == (2, 0)
    held = live(db)
    assert set(held) == {waf.url + p for p in files}
    assert held[waf.url + late][0] == "Edited late" and held[waf.url + edited[0]][0] == f"Edited {edited[0]}"
    # the touched file's new date is held, so the next reconciliation does not fetch it again
    assert held[waf.url + touched][1] == datetime(2024, 3, 2, tzinfo=timezone.utc)

    # -- a removal is not applied while a sub-listing fails: the reconciliation refuses the walk
    del files[f"{folder_of(100, PER_FOLDER)}record-000100.xml"]
    waf.set_files(files)
    waf.forbidden = {folder_of(190, PER_FOLDER)}
    waf.requests.clear()
    dag_run, (_, mode, status, stats, error) = run(harvest, db)
    assert dag_run.state == "failed" and status == "failed"
    assert "the walk of the folders was incomplete" in error
    assert set(live(db)) == set(held)  # nothing removed
    # the files dated now were fetched again (within the margin); the touched and late ones not
    assert fetched(waf) == sorted(p.rsplit("/", 1)[-1] for p in edited + ["new.xml"])

    # -- a fault retried: file 120 of a full sync answers 500 to both tries of the first attempt;
    # the task's retry resumes after what the attempt staged (every file fetched once in all)
    waf.forbidden = set()
    waf.requests.clear()
    waf.fail_files(after=120, times=2)
    dag_run, (_, mode, status, stats, _) = run(harvest, db, full_sync=True)
    assert (dag_run.state, mode, status) == ("success", "full", "committed")
    tries = {ti.task_id: ti.try_number for ti in dag_run.get_task_instances()}
    assert tries["fetch_modified"] == 2, tries
    assert [s for _, _, s in waf.file_requests()].count(500) == 2
    assert len(fetched(waf)) == len(files) and len(set(fetched(waf))) == len(files)
    assert stats["removed"] == 1 and stats["fetched"] == len(files)
    assert set(live(db)) == {waf.url + p for p in files}


def test_hostile_files_and_a_looping_folder_are_refused_and_nothing_is_lost(harvest, waf, db, gemini):
    harvest.configure(waf.url, type="iso-waf", reconcile_every="0", max_retries=0)
    from harvester.testing.hostile_documents import nested_entities_rdfxml

    files = dict(waf.files)
    hostile = {"g0/s0/bomb.xml": nested_entities_rdfxml(), "g0/s0/report.xml": b"%PDF-1.4 binary",
               "g0/s0/endless.xml": b""}
    for path, body in hostile.items():
        files[path] = WafFile(body, datetime(2024, 5, 1))
    waf.set_files(files)
    waf.endless = {"g0/s0/endless.xml"}
    waf.aliases = {"g2/s0/loop/": "g2/"}  # a folder linking back to its parent under another name
    dag_run, (run_id, mode, status, stats, _) = run(harvest, db)
    assert (dag_run.state, mode, status) == ("success", "full", "committed")  # the loop cut nothing
    assert (stats["created"], stats["failed"]) == (FILES + 4, 3)
    codes = dict(db.execute("SELECT source_id, code FROM record_outcomes WHERE run_id = %s AND severity = 'error'",
                            (run_id,)).fetchall())
    assert codes == {waf.url + "g0/s0/bomb.xml": "unsafe-xml", waf.url + "g0/s0/report.xml": "not-iso-metadata",
                     waf.url + "g0/s0/endless.xml": "file-too-large"}
    assert not any("/loop/loop/" in path for path, _, _ in waf.requests)
    # a proxy's error page (HTTP 200) where a sub-listing should be: retried, then the run fails, nothing lost
    waf.error_pages = {"g4/"}
    del files["g0/s0/record-000003.xml"]
    waf.set_files(files)
    dag_run, (_, _, status, _, error) = run(harvest, db, full_sync=True)
    assert dag_run.state == "failed" and status == "failed" and "not a directory listing" in error
    assert len(live(db)) == FILES + 4
