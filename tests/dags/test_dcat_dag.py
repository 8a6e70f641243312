"""DCAT catalogues through real Airflow (dag.test()), real HTTP to a local catalogue server and a
real PostgreSQL: the five real datos.gob.ar data.json snapshots as five runs (counts checked against
an independent count from the files themselves, the re-keyed identifiers recognised), an unchanged
catalogue answered 304, broken DCAT-US entries, and Hydra-paged, looping and multilingual DCAT-AP
RDF catalogues."""
from __future__ import annotations

import gzip
import json
import logging
from collections import Counter
from pathlib import Path

from harvester.testing.samples import ROOT

DCAT = Path(ROOT.parent / "shared" / "dcat-samples")
AR = DCAT / "datos-gob-ar"
SNAPSHOTS = ["2018-04-16", "2018-06-26", "2018-07-04", "2018-07-05", "2018-07-10"]


def snapshot(day: str) -> tuple[bytes, list[dict]]:
    body = gzip.decompress((AR / f"data.json-{day}.json.gz").read_bytes())
    return body, json.loads(body)["dataset"]


def expected_counts(before: list[dict], after: list[dict]) -> dict[str, int]:
    """What changed between two snapshots, from the JSON alone: ids that vanished and ids that
    appeared with the same title and description (whitespace aside) pair up one to one as
    re-identified; the rest are created and removed; an entry kept under its id is updated when
    anything but its `modified` date differs."""
    def text(entry):
        return tuple(" ".join((entry.get(key) or "").split()) for key in ("title", "description"))

    old = {e["identifier"]: e for e in before}
    new = {e["identifier"]: e for e in after}
    gone, came = set(old) - set(new), set(new) - set(old)
    gone_texts, came_texts = Counter(text(old[i]) for i in gone), Counter(text(new[i]) for i in came)
    pairs = sum(min(n, gone_texts[key]) for key, n in came_texts.items())

    def body(entry):
        return {k: v for k, v in entry.items() if k != "modified"}

    updated = sum(1 for i in set(old) & set(new) if body(old[i]) != body(new[i]))
    return {"created": len(came) - pairs, "reidentified": pairs, "removed": len(gone) - pairs, "updated": updated}


def last_run(db):
    return db.execute("SELECT run_id, mode, status, stats FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def live_ids(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE removed_at IS NULL").fetchall()}


def test_five_real_daily_snapshots_report_the_real_changes_and_recognise_re_keyed_datasets(
        harvest, catalogue, db, gemini):
    harvest.configure(catalogue.url("/data.json"), type="dcat-json")
    previous: list[dict] = []
    for day in SNAPSHOTS:
        body, entries = snapshot(day)
        catalogue.set_document("/data.json", body)
        catalogue.requests.clear()
        assert harvest.run().state == "success", day
        run_id, mode, status, stats = last_run(db)
        assert (mode, status) == ("full", "committed"), day    # a data.json is read whole: a full sync
        assert live_ids(db) == {e["identifier"] for e in entries}, day
        want = expected_counts(previous, entries)
        got = {key: stats.get(key, 0) for key in want}
        assert got == want, day
        assert stats["failed"] == 0 and "removals_withheld" not in stats, day
        assert stats["portal_requests"] == len(catalogue.requests) == 1, day
        if day == "2018-06-26":
            # The re-keying run: 614 ids vanished, 629 appeared; 522 are the same datasets.
            assert (want["reidentified"], want["created"], want["removed"]) == (522, 107, 92)
            rows = db.execute(
                "SELECT c.changed_fields -> 'source_id', d.source_id, d.first_seen_at < r.started_at,"
                " (SELECT count(*) FROM dataset_versions v WHERE v.dataset_id = d.id)"
                " FROM dataset_changes c JOIN datasets d ON d.id = c.dataset_id JOIN sync_runs r ON r.run_id = c.run_id"
                " WHERE c.run_id = %s AND c.change_type = 'reidentified'", (run_id,)).fetchall()
            assert len(rows) == 522
            old_ids = {e["identifier"] for e in previous}
            for ids, source_id, older, versions in rows:
                assert ids["new"] == source_id and ids["old"] in old_ids and older and versions >= 1
            # Their text was embedded by the first run: nothing of it is embedded again.
            assert stats["embedded"] <= want["created"] + want["updated"]
            assert db.execute("SELECT count(*) FROM dataset_changes WHERE run_id = %s AND change_type = 'removed'",
                              (run_id,)).fetchone()[0] == 92
        previous = entries

    # The same catalogue again: one conditional request answered 304, nothing processed or removed.
    catalogue.requests.clear()
    assert harvest.run().state == "success"
    run_id, mode, status, stats = last_run(db)
    assert len(catalogue.requests) == 1 and catalogue.requests[0][1].get("If-None-Match")
    assert (mode, stats["portal_requests"], stats["fetched"], stats["failed"]) == ("incremental", 1, 0, 0)
    assert (stats["created"], stats["updated"], stats["removed"]) == (0, 0, 0)
    assert live_ids(db) == {e["identifier"] for e in previous}


def test_a_full_sync_reads_an_unchanged_catalogue_again(harvest, catalogue, db, gemini):
    body, entries = snapshot(SNAPSHOTS[-1])
    catalogue.set_document("/data.json", body)
    harvest.configure(catalogue.url("/data.json"), type="dcat-json")
    assert harvest.run().state == "success"
    catalogue.requests.clear()
    assert harvest.run(full_sync=True).state == "success"
    run_id, mode, status, stats = last_run(db)
    assert "If-None-Match" not in catalogue.requests[0][1]
    assert (mode, stats["fetched"], stats["unchanged"], stats["removed"]) == ("full", len(entries), len(entries), 0)


# -- DCAT-AP RDF ---------------------------------------------------------------------------------
AP = DCAT / "dcat-ap"
UDATA_PAGE = "http://data.test.org/catalog.jsonld?page="     # where the udata samples' page links point


def serve_udata_pages(catalogue, prefix: str, loop: bool = False) -> str:
    """The two udata sample pages, their links pointing at the local server; ``loop``: page 2 links
    back to page 1."""
    for page in (1, 2):
        text = (AP / "udata" / f"{prefix}-{page}.jsonld").read_text().replace(UDATA_PAGE, catalogue.url("/catalog?page="))
        if loop and page == 2:
            document = json.loads(text)
            view = next(n for n in document if any(t.endswith(("PartialCollectionView", "PagedCollection"))
                                                    for t in n.get("@type", [])))
            view["http://www.w3.org/ns/hydra/core#next"] = [{"@value": catalogue.url("/catalog?page=1")}]
            text = json.dumps(document)
        catalogue.set_document(f"/catalog?page={page}", text.encode(), "application/ld+json")
    return catalogue.url("/catalog?page=1")


def test_a_hydra_paged_rdf_catalogue_lands_whole(harvest, catalogue, db, gemini):
    harvest.configure(serve_udata_pages(catalogue, "paged-collection"), type="dcat-rdf")
    assert harvest.run().state == "success"
    run_id, mode, status, stats = last_run(db)
    assert (mode, status, stats["created"], stats["failed"]) == ("full", "committed", 4, 0)
    assert live_ids(db) == {f"http://data.test.org/datasets/{i}" for i in (1, 2, 3, 4)}
    assert [path for path, _ in catalogue.requests] == ["/catalog?page=1", "/catalog?page=2"]


def test_a_page_loop_is_cut_with_a_warning_and_removes_nothing(harvest, catalogue, db, gemini, caplog):
    harvest.configure(serve_udata_pages(catalogue, "partial-collection"), type="dcat-rdf")
    assert harvest.run().state == "success"
    serve_udata_pages(catalogue, "partial-collection", loop=True)
    db.execute("UPDATE datasets SET source_id = 'http://data.test.org/datasets/gone' WHERE source_id LIKE '%/1'")
    caplog.set_level(logging.WARNING, logger="harvester")
    catalogue.requests.clear()
    assert harvest.run().state == "success"
    run_id, mode, status, stats = last_run(db)
    assert [path for path, _ in catalogue.requests] == ["/catalog?page=1", "/catalog?page=2"]
    messages = [r.getMessage() for r in caplog.records]
    assert any(catalogue.url("/catalog?page=1") in m and "came round again" in m for m in messages), messages
    assert any("cut short" in m for m in messages), messages
    # the listing is not complete: the dataset it no longer shows is not removed
    assert (mode, stats["removed"], stats["created"]) == ("incremental", 0, 1)
    assert "http://data.test.org/datasets/gone" in live_ids(db)


def test_a_multilingual_catalogue_keeps_every_language(harvest, catalogue, db, gemini):
    body = (AP / "ckanext-dcatapchharvest" / "catalog.xml").read_bytes()
    catalogue.set_document("/catalog.xml", body, "application/rdf+xml")
    harvest.configure(catalogue.url("/catalog.xml"), type="dcat-rdf", language="fr")
    assert harvest.run().state == "success"
    rows = db.execute("SELECT title, raw -> 'translations' FROM datasets ORDER BY source_id").fetchall()
    assert len(rows) == 2
    for title, translations in rows:
        assert set(translations["keywords"]) == {"de", "fr", "it", "rm", "en"}
        assert title == translations["title"]["fr"]


def test_broken_dcat_us_entries_are_failed_with_their_reason_and_the_others_land(harvest, catalogue, db, gemini,
                                                                                   caplog):
    path = DCAT / "dcat-us" / "ckanext-datajson" / "missing-identifier-title.data.json"
    entries = json.loads(path.read_text())["dataset"]
    usable = [e for e in entries if e.get("identifier") and e.get("title")]
    assert (len(entries), len(usable)) == (3, 1)
    catalogue.set_document("/data.json", path.read_bytes())
    harvest.configure(catalogue.url("/data.json"), type="dcat-json")
    caplog.set_level(logging.WARNING, logger="harvester")
    assert harvest.run().state == "success"
    run_id, mode, status, stats = last_run(db)
    assert (status, stats["created"], stats["failed"]) == ("committed", 1, 2)
    assert live_ids(db) == {usable[0]["identifier"]}
    failures = [r.getMessage() for r in caplog.records if r.getMessage().startswith("record failed")]
    assert len(failures) == 2
    assert any("identifier" in m for m in failures) and any("title" in m for m in failures), failures
