"""A record holding what PostgreSQL or UTF-8 cannot take (issue 36): NaN and ±Infinity, lone
surrogates, U+0000, absurd nesting or size, planted in real portals' records and harvested through
a real run (the local CKAN portal and the local ArcGIS Hub, real HTTP, real PostgreSQL). Such a
record used to fail its page's COPY (or the hashing of its text) on every run; now it is that
record's coded outcome, the other records land, and the next run commits too.

Expectations come from the planted values, not from the code under test."""
from __future__ import annotations

import copy
import xml.etree.ElementTree as ET
import json
from pathlib import Path

import pytest

from harvester.config.portals import Portal
from harvester.pipeline import steps as pipeline
from harvester.store import outcomes, runs

UK = "data-gov-uk.jsonl"
HUB_DATA = Path(__file__).resolve().parents[1] / "data" / "arcgis-hub"


def _nested(levels: int):
    value: object = "bottom"
    for _ in range(levels - 1):
        value = {"in": value}
    return value


def _run(db, reader, portal: Portal, *, full_sync: bool = True) -> tuple[int, dict]:
    """One run through the pipeline's steps (without embeddings: datasets are stored without vectors)."""
    run_id = pipeline.begin(db, portal, full_sync=full_sync)["run_id"]
    fetched = pipeline.fetch_modified(db, portal, run_id, pipeline.source_for(portal))
    pipeline.hash_compare(db, reader, portal, run_id)
    stats = pipeline.upsert(db, portal, run_id, "no-model")
    assert runs.get(db, run_id).status == "committed"
    return run_id, {**fetched, **stats}


def _rows(db, run_id: int, severity: str) -> dict[tuple[str, str], dict]:
    rows, _ = outcomes.page(db, run_id, severity=severity, limit=1000)
    return {(r["source_id"], r["code"]): r for r in rows}


def _stored(db, portal_url: str, source_id: str):
    return db.execute("SELECT title, description, raw FROM datasets WHERE portal_url = %s AND source_id = %s",
                      (portal_url, source_id)).fetchone()


def _planted_ckan(good: list[dict]) -> list[dict]:
    def like(i: int, ident: str) -> dict:
        rec = copy.deepcopy(good[i % len(good)])
        rec["id"] = rec["name"] = ident
        return rec

    nan = like(0, "planted-nan")
    nan["resources"] = nan.get("resources") or [{"url": "https://example.org/file.csv", "format": "CSV"}]
    nan["resources"][0]["size"] = float("nan")
    nan["custom_bounds"] = {"range": [-float("inf"), float("inf")]}
    surrogate = like(1, "planted-surrogate")
    surrogate["title"] = "Broken \ud800 title"
    surrogate["odd key \udc00"] = "a value"
    nul = like(2, "planted-nul")
    nul["notes"] = "Before\x00after"
    nul["tags"] = [{"name": "t\x00ag"}]
    deep = like(3, "planted-deep")
    deep["spatial_tree"] = _nested(100)
    large = like(4, "planted-large")
    large["notes"] = "x" * (11 * 1024 * 1024)
    return [nan, surrogate, nul, deep, large]


def test_a_ckan_portals_bad_values_are_their_records_outcomes_and_the_rest_commits(db, reader, portal_server,
                                                                                    samples):
    good = samples(UK)
    portal_server.set_records(good + _planted_ckan(good))
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0, max_retries=0)

    run_id, stats = _run(db, reader, portal)
    assert (stats["fetched"], stats["failed"], stats["created"]) == (len(good) + 3, 2, len(good) + 3)

    errors = _rows(db, run_id, "error")
    assert set(errors) == {("planted-deep", "record-too-deep"), ("planted-large", "record-too-large")}
    deep = errors["planted-deep", "record-too-deep"]
    assert deep["field"].startswith("spatial_tree.in.in") and "more than 64 levels deep" in deep["message"]
    assert "'planted-deep'" in deep["message"]
    large = errors["planted-large", "record-too-large"]
    assert "'planted-large'" in large["message"] and "more than the 10,485,760" in large["message"]
    assert _stored(db, portal.url, "planted-deep") is None and _stored(db, portal.url, "planted-large") is None

    warnings = _rows(db, run_id, "warning")
    nan = warnings["planted-nan", "non-finite-number"]
    assert (nan["field"], nan["value"]) == ("resources[0].size", "NaN")
    assert "'planted-nan'" in nan["message"] and "(3 values in all)" in nan["message"]
    surrogate = warnings["planted-surrogate", "lone-surrogate"]
    assert (surrogate["field"], surrogate["value"]) == ("title", "Broken \ufffd title")
    assert "(2 values in all)" in surrogate["message"]
    nul = warnings["planted-nul", "nul-character"]
    assert (nul["field"], nul["value"]) == ("notes", "Beforeafter")
    assert not any(code in ("non-finite-number", "lone-surrogate", "nul-character") for _, code in warnings
                   if _ not in ("planted-nan", "planted-surrogate", "planted-nul"))

    _, _, raw = _stored(db, portal.url, "planted-nan")
    assert raw["resources"][0]["size"] is None and raw["custom_bounds"] == {"range": [None, None]}
    title, _, raw = _stored(db, portal.url, "planted-surrogate")
    assert title == "Broken \ufffd title" and raw["odd key \ufffd"] == "a value"
    _, description, raw = _stored(db, portal.url, "planted-nul")
    assert description == "Beforeafter" and raw["tags"] == [{"name": "tag"}]

    # The portal has not fixed its records: the next run commits all the same, the stored records
    # unchanged (their hashes are of what was stored), the two others failing again.
    run_id, stats = _run(db, reader, portal)
    assert (stats["failed"], stats["created"], stats["updated"]) == (2, 0, 0)
    assert set(_rows(db, run_id, "error")) == set(errors)
    assert not _rows(db, run_id, "warning")


@pytest.fixture
def hub():
    from harvester.testing.arcgis_hub_portal import ArcGisHubServer

    with ArcGisHubServer() as server:
        yield server


def test_an_arcgis_hubs_bad_values_are_their_records_outcomes_and_the_rest_commits(db, reader, hub):
    from harvester.testing.arcgis_hub_portal import features_from_dcat

    feed = json.loads((HUB_DATA / "sce-drpep-hub-dcat-us-1.1.json").read_text())
    template = json.loads((HUB_DATA / "ogcItemsResponse.json").read_text())["features"][0]
    features = features_from_dcat(feed, template)
    nan, surrogate, nul, deep = (features[i]["id"] for i in range(4))
    features[0]["properties"]["size"] = float("nan")
    features[1]["properties"]["title"] = "Hub \udbff title"
    features[2]["properties"]["description"] = "Hub\x00 description"
    features[3]["properties"]["extent"] = {"coordinates": _nested(70)}
    hub.set_features(features)
    portal = Portal(name="hub", type="arcgis-hub", url=hub.url, politeness_delay=0, max_retries=0)

    run_id, stats = _run(db, reader, portal)
    assert (stats["failed"], stats["created"]) == (1, len(features) - 1)
    assert set(_rows(db, run_id, "error")) == {(deep, "record-too-deep")}
    warnings = _rows(db, run_id, "warning")
    assert warnings[nan, "non-finite-number"]["value"] == "NaN"
    assert warnings[surrogate, "lone-surrogate"]["value"] == "Hub \ufffd title"
    assert warnings[nul, "nul-character"]["value"] == "Hub description"
    assert _stored(db, portal.url, surrogate)[0] == "Hub \ufffd title"
    assert _stored(db, portal.url, nul)[1] == "Hub description"

    run_id, stats = _run(db, reader, portal)
    assert (stats["failed"], stats["created"], stats["updated"]) == (1, 0, 0)
    assert set(_rows(db, run_id, "error")) == {(deep, "record-too-deep")}


# -- a data.json with bare NaN / ±Infinity, and identifiers no screening may alter ---------------------
def _ids(db, portal_url: str) -> set[str]:
    return {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE portal_url = %s AND removed_at IS NULL",
                                     (portal_url,)).fetchall()}


def test_a_data_json_with_bare_nan_infinity_and_lone_surrogates_stores_every_dataset(db, reader, samples):
    """A real DCAT-US catalogue as Python's json.dumps writes it, one dataset holding NaN,
    Infinity and -Infinity, another the words in its texts, one a lone surrogate in its identifier.
    Before, the bare NaN failed the whole document: nothing was stored."""
    from harvester.testing.dcat_portal import DcatServer
    from harvester.testing.samples import dcat_samples_dir, load_json

    catalogue = load_json(dcat_samples_dir() / "dcat-us" / "dcatus.json")
    good = catalogue["dataset"]
    numbers = copy.deepcopy(good[0])
    numbers.update(identifier="planted-numbers", size=float("nan"), spatial={"bbox": [-float("inf"), float("inf")]})
    words = copy.deepcopy(good[1])
    words.update(identifier="planted-words", title='"NaN", Infinity and -Infinity', keyword=["NaN", "-Infinity"])
    surrogate = copy.deepcopy(good[2])
    surrogate.update(identifier="planted-\ud800", title="Identifier with a lone surrogate")
    catalogue["dataset"] = good + [numbers, words, surrogate]
    body = json.dumps(catalogue).encode()
    assert b"\"size\": NaN" in body and b"[-Infinity, Infinity]" in body

    with DcatServer() as server:
        server.set_document("/data.json", body)
        portal = Portal(name="d", type="dcat-json", url=server.url("/data.json"), politeness_delay=0, max_retries=0)
        run_id, stats = _run(db, reader, portal)
    assert (stats["failed"], stats["created"]) == (1, len(good) + 2)
    assert _ids(db, portal.url) == {e["identifier"] for e in good} | {"planted-numbers", "planted-words"}

    assert set(_rows(db, run_id, "error")) == {("planted-\\ud800", "unstorable-identifier")}
    error = _rows(db, run_id, "error")["planted-\\ud800", "unstorable-identifier"]
    assert error["value"] == "planted-\\ud800" and error["stage"] == "parse"
    assert error["message"].startswith("record 'planted-\\ud800': its identifier holds a lone surrogate (\\ud800")

    warnings = _rows(db, run_id, "warning")
    nan = warnings["planted-numbers", "non-finite-number"]
    first = ("size", "NaN") if list(numbers).index("size") < list(numbers).index("spatial") else \
        ("spatial.bbox[0]", "-Infinity")  # the first of the entry's keys (the sample has a spatial)
    assert (nan["field"], nan["value"]) == first and "(3 values in all)" in nan["message"]
    assert not any(code == "non-finite-number" for ident, code in warnings if ident != "planted-numbers")
    extras = {e["key"]: e["value"] for e in _stored(db, portal.url, "planted-numbers")[2]["extras"]}
    assert extras["size"] == "null" and extras["spatial"] == '{"bbox":[null,null]}'
    title, _, raw = _stored(db, portal.url, "planted-words")
    assert title == '"NaN", Infinity and -Infinity' and sorted(t["name"] for t in raw["tags"]) == ["-Infinity", "NaN"]


def test_identifiers_holding_a_lone_surrogate_or_a_nul_fail_their_records_and_the_rest_commits(db, reader,
                                                                                               portal_server, samples):
    """Neutralised, "planted-\\ud800" would be "planted-\\ufffd" and "planted-\\x00nul" would be
    "planted-nul": another dataset's identifier, planted here too, whose row the record would take."""
    good = samples(UK)[:20]
    planted = []
    for ident in ("planted-\ud800", "planted-\x00nul", "planted-\ufffd", "planted-nul"):
        rec = copy.deepcopy(good[len(planted)])
        rec["id"], rec["name"], rec["title"] = ident, f"planted-{len(planted)}", f"Planted {len(planted)}"
        planted.append(rec)
    portal_server.set_records(good + planted)
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0, max_retries=0)

    run_id, stats = _run(db, reader, portal)
    assert (stats["failed"], stats["created"]) == (2, len(good) + 2)
    assert _ids(db, portal.url) == {r["id"] for r in good} | {"planted-\ufffd", "planted-nul"}
    assert _stored(db, portal.url, "planted-\ufffd")[0] == "Planted 2"
    assert _stored(db, portal.url, "planted-nul")[0] == "Planted 3"
    errors = _rows(db, run_id, "error")
    assert set(errors) == {("planted-\\ud800", "unstorable-identifier"), ("planted-\\x00nul", "unstorable-identifier")}
    assert "a NUL character (U+0000)" in errors["planted-\\x00nul", "unstorable-identifier"]["message"]

    # A reconciliation lists the identifiers too: they are staged escaped, and the run commits.
    run_id = pipeline.begin(db, portal, reconcile=True)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, pipeline.source_for(portal))
    pipeline.reconcile(db, portal, run_id, pipeline.source_for(portal))
    listed = {r[0] for r in db.execute("SELECT source_id FROM staging_listing WHERE run_id = %s", (run_id,))}
    assert {"planted-\\ud800", "planted-\\x00nul", "planted-\ufffd", "planted-nul"} <= listed
    pipeline.hash_compare(db, reader, portal, run_id)
    stats = pipeline.upsert(db, portal, run_id, "no-model")
    assert runs.get(db, run_id).status == "committed" and stats["removed"] == 0
    assert _ids(db, portal.url) == {r["id"] for r in good} | {"planted-\ufffd", "planted-nul"}


@pytest.fixture
def ods():
    from harvester.testing.opendatasoft_portal import OpenDataSoftPortal

    with OpenDataSoftPortal() as server:
        yield server


def test_an_opendatasoft_identifier_with_a_lone_surrogate_fails_its_record_on_a_page_and_in_the_export(db, reader,
                                                                                                      ods):
    """30 datasets, the API's window scaled down to 20: the first 20 come from the records
    endpoint (Python's json reads them), the rest from the streamed export (ijson), where a bare
    NaN failed the whole listing and a lone high half became '?'. Before, the one on a page failed
    as ``invalid-record`` with an encoding error for message."""
    from harvester.http import HttpFetcher
    from harvester.sources.opendatasoft import OpenDataSoftSource
    from harvester.testing.opendatasoft_portal import fixture_datasets

    template = fixture_datasets()[0]
    datasets = []
    for i in range(30):
        ds = copy.deepcopy(template)
        ds["dataset_id"] = f"ds-{i:05d}" + {5: "\ud800", 25: "\udbff"}.get(i, "")
        ds["metas"]["default"].update(title=f"Dataset {i}", modified="2024-01-01T00:00:00+00:00")
        datasets.append(ds)
    datasets[27]["metas"]["default"]["records_count"] = float("nan")
    for ds in datasets:
        ods.put(ds)
    ods.offset_cap = 20
    portal = Portal(name="o", type="opendatasoft", url=ods.base_url, politeness_delay=0, max_retries=0)
    source = OpenDataSoftSource(portal.url, fetcher=HttpFetcher(portal.url, max_retries=0, sleep=lambda s: None),
                                offset_cap=20)

    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, source)
    pipeline.hash_compare(db, reader, portal, run_id)
    stats = pipeline.upsert(db, portal, run_id, "no-model")
    assert runs.get(db, run_id).status == "committed"
    assert ods.export_requests(), "the listing went past the window through the export"
    assert (stats["failed"], stats["created"]) == (2, 28)
    assert _ids(db, portal.url) == {f"ds-{i:05d}" for i in range(30) if i not in (5, 25)}
    assert set(_rows(db, run_id, "error")) == {("ds-00005\\ud800", "unstorable-identifier"),
                                               ("ds-00025\\udbff", "unstorable-identifier")}


# -- nesting beyond what Python's json reads, NaN where a mapping writes texts ------------------------
# A record 100,000 levels deep in a page made Python's json raise RecursionError for the whole page:
# the run failed, on every run until the portal fixed it. Now the page is read again (by ijson,
# sources/json_stream.py), the record fails alone as record-too-deep, and the rest commits. A NaN
# in a field that a mapping wrote into extras as a text was stored as the text "NaN", unwarned: it
# is now null, with its non-finite-number warning, as anywhere else.
DEEP = 100_000


def _deep_field(errors: dict, ident: str) -> str:
    (row,) = [r for (i, code), r in errors.items() if i == ident and code == "record-too-deep"]
    assert f"record '{ident}' nests objects and arrays more than 64 levels deep" in row["message"]
    return row["field"]


def test_a_ckan_page_holding_a_record_100000_levels_deep_fails_that_record_and_the_rest_commits(db, reader,
                                                                                                portal_server,
                                                                                                samples):
    from harvester.testing.local_http import nested

    good = samples(UK)[:30]
    deep = copy.deepcopy(good[0])
    deep["id"] = deep["name"] = "planted-deep"
    deep["spatial_tree"] = nested(DEEP)
    portal_server.set_records(good + [deep])
    portal = Portal(name="p", url=portal_server.base_url, politeness_delay=0, max_retries=0)

    run_id, stats = _run(db, reader, portal)
    assert (stats["failed"], stats["created"]) == (1, len(good))
    errors = _rows(db, run_id, "error")
    assert set(errors) == {("planted-deep", "record-too-deep")}
    assert _deep_field(errors, "planted-deep") == "spatial_tree" + ".in" * 63
    assert _ids(db, portal.url) == {r["id"] for r in good}


def _socrata_results() -> list[dict]:
    data = Path(__file__).resolve().parents[1] / "data" / "socrata" / "chicago_transportation.json"
    return json.loads(data.read_text())["results"]


def _socrata_run(db, reader, results: list[dict]) -> tuple[Portal, int, dict]:
    from harvester.testing.socrata_portal import SocrataServer

    with SocrataServer(results) as server:
        portal = Portal(name="s", type="socrata", url=server.base_url, politeness_delay=0, max_retries=0)
        run_id, stats = _run(db, reader, portal)
    return portal, run_id, stats


def test_a_socrata_page_with_a_record_100000_levels_deep_fails_that_record_and_the_rest_commits(db, reader):
    from harvester.testing.local_http import nested

    results = _socrata_results()
    deep = results[1]["resource"]["id"]
    results[1]["resource"]["tree"] = nested(DEEP)
    portal, run_id, stats = _socrata_run(db, reader, results)
    assert (stats["failed"], stats["created"]) == (1, len(results) - 1)
    errors = _rows(db, run_id, "error")
    assert set(errors) == {(deep, "record-too-deep")}
    assert _deep_field(errors, deep) == "resource.tree" + ".in" * 62


def test_socrata_nan_and_infinity_that_the_mapping_writes_into_extras_are_null_and_warned(db, reader):
    results = _socrata_results()
    numbers = results[2]["resource"]["id"]
    results[2]["resource"]["hide_from_data_json"] = float("inf")
    results[2]["classification"]["domain_metadata"][0]["value"] = float("nan")
    key = results[2]["classification"]["domain_metadata"][0]["key"]
    portal, run_id, stats = _socrata_run(db, reader, results)
    assert (stats["failed"], stats["created"]) == (0, len(results))
    warning = _rows(db, run_id, "warning")[numbers, "non-finite-number"]
    assert (warning["field"], warning["value"]) == ("resource.hide_from_data_json", "Infinity")
    assert "(2 values in all)" in warning["message"]
    extras = {e["key"]: e["value"] for e in _stored(db, portal.url, numbers)[2]["extras"]}
    assert extras[f"domain_metadata.{key}"] == "null"  # was the text "NaN"
    assert "resource.hide_from_data_json" not in extras  # a null is no extra (was the text "Infinity")
    assert not any(v in ("NaN", "Infinity") for v in extras.values())


def _ods_run(db, reader, ods, plant) -> tuple[Portal, int, dict]:
    """30 datasets, the API's window scaled down to 20: the first 20 come from the records
    endpoint (Python's json), the rest from the streamed export (ijson). ``plant(i, ds)`` changes
    dataset i."""
    from harvester.http import HttpFetcher
    from harvester.sources.opendatasoft import OpenDataSoftSource
    from harvester.testing.opendatasoft_portal import fixture_datasets

    template = fixture_datasets()[0]
    for i in range(30):
        ds = copy.deepcopy(template)
        ds["dataset_id"] = f"ds-{i:05d}"
        ds["metas"]["default"].update(title=f"Dataset {i}", modified="2024-01-01T00:00:00+00:00")
        plant(i, ds)
        ods.put(ds)
    ods.offset_cap = 20
    portal = Portal(name="o", type="opendatasoft", url=ods.base_url, politeness_delay=0, max_retries=0)
    source = OpenDataSoftSource(portal.url, fetcher=HttpFetcher(portal.url, max_retries=0, sleep=lambda s: None),
                                offset_cap=20)
    run_id = pipeline.begin(db, portal, full_sync=True)["run_id"]
    pipeline.fetch_modified(db, portal, run_id, source)
    pipeline.hash_compare(db, reader, portal, run_id)
    stats = pipeline.upsert(db, portal, run_id, "no-model")
    assert runs.get(db, run_id).status == "committed" and ods.export_requests()
    return portal, run_id, stats


def test_opendatasoft_records_100000_levels_deep_on_a_page_and_in_the_export_fail_alone(db, reader, ods):
    from harvester.testing.local_http import nested

    def plant(i: int, ds: dict) -> None:
        if i in (3, 24):
            ds["metas"]["default"]["tree"] = nested(DEEP)

    portal, run_id, stats = _ods_run(db, reader, ods, plant)
    assert (stats["failed"], stats["created"]) == (2, 28)
    errors = _rows(db, run_id, "error")
    assert set(errors) == {("ds-00003", "record-too-deep"), ("ds-00024", "record-too-deep")}
    assert _deep_field(errors, "ds-00003") == _deep_field(errors, "ds-00024") == "metas.default.tree" + ".in" * 61


def test_opendatasoft_nan_that_the_mapping_writes_into_extras_is_null_and_warned_on_a_page_and_in_the_export(
        db, reader, ods):
    def plant(i: int, ds: dict) -> None:
        if i in (4, 27):
            ds["metas"]["default"]["records_count"] = float("nan")

    portal, run_id, stats = _ods_run(db, reader, ods, plant)
    assert (stats["failed"], stats["created"]) == (0, 30)
    warnings = _rows(db, run_id, "warning")
    assert {i for i, code in warnings if code == "non-finite-number"} == {"ds-00004", "ds-00027"}
    for ident in ("ds-00004", "ds-00027"):
        warning = warnings[ident, "non-finite-number"]
        assert (warning["field"], warning["value"]) == ("metas.default.records_count", "NaN")
        extras = {e["key"]: e["value"] for e in _stored(db, portal.url, ident)[2]["extras"]}
        assert extras["records_count"] == "null"  # was the text "NaN"


def _hub_features() -> list[dict]:
    from harvester.testing.arcgis_hub_portal import features_from_dcat

    feed = json.loads((HUB_DATA / "sce-drpep-hub-dcat-us-1.1.json").read_text())
    template = json.loads((HUB_DATA / "ogcItemsResponse.json").read_text())["features"][0]
    return features_from_dcat(feed, template)


def test_an_arcgis_hub_page_with_a_feature_100000_levels_deep_fails_that_feature_and_the_rest_commits(db, reader,
                                                                                                     hub):
    from harvester.testing.local_http import nested

    features = _hub_features()
    deep = features[0]["id"]
    features[0]["properties"]["extent"] = {"coordinates": nested(DEEP)}
    hub.set_features(features)
    portal = Portal(name="hub", type="arcgis-hub", url=hub.url, politeness_delay=0, max_retries=0)
    run_id, stats = _run(db, reader, portal)
    assert (stats["failed"], stats["created"]) == (1, len(features) - 1)
    errors = _rows(db, run_id, "error")
    assert set(errors) == {(deep, "record-too-deep")}
    assert _deep_field(errors, deep) == "properties.extent.coordinates" + ".in" * 61


def test_an_arcgis_hub_feature_with_an_infinite_or_nan_date_is_stored_with_its_warning(db, reader, hub):
    """The mapping reads the dates as epoch milliseconds: an infinite ``created`` raised
    OverflowError, which failed the run; a NaN ``modified`` failed its record as invalid-record."""
    features = _hub_features()
    infinite, nan = features[1]["id"], features[2]["id"]
    features[1]["properties"]["created"] = float("inf")
    features[2]["properties"]["modified"] = float("nan")
    hub.set_features(features)
    portal = Portal(name="hub", type="arcgis-hub", url=hub.url, politeness_delay=0, max_retries=0)
    run_id, stats = _run(db, reader, portal)
    assert (stats["failed"], stats["created"]) == (0, len(features))
    warnings = _rows(db, run_id, "warning")
    assert (warnings[infinite, "non-finite-number"]["field"], warnings[infinite, "non-finite-number"]["value"]) == (
        "properties.created", "Infinity")
    assert (warnings[nan, "non-finite-number"]["field"], warnings[nan, "non-finite-number"]["value"]) == (
        "properties.modified", "NaN")


def test_an_arcgis_hub_feature_with_a_date_past_any_calendar_is_its_records_outcome(db, reader, hub):
    """A finite epoch-milliseconds date no calendar holds (1e300, -1e20) raised OverflowError or
    ValueError in the mapping, which failed the whole run."""
    features = _hub_features()
    created, modified = features[1]["id"], features[2]["id"]
    features[1]["properties"]["created"] = 1e300
    features[2]["properties"]["modified"] = -1e20
    hub.set_features(features)
    portal = Portal(name="hub", type="arcgis-hub", url=hub.url, politeness_delay=0, max_retries=0)
    run_id, stats = _run(db, reader, portal)
    assert (stats["failed"], stats["created"]) == (1, len(features) - 1)
    errors, warnings = _rows(db, run_id, "error"), _rows(db, run_id, "warning")
    assert set(errors) == {(modified, "bad-date")}
    assert (errors[modified, "bad-date"]["field"], errors[modified, "bad-date"]["value"]) == ("properties.modified",
                                                                                           "-1e+20")
    assert (warnings[created, "bad-optional-date"]["field"], warnings[created, "bad-optional-date"]["value"]) == (
        "properties.created", "1e+300")
    stored = {r[0] for r in db.execute("SELECT source_id FROM datasets WHERE portal_url = %s", (portal.url,))}
    assert created in stored and modified not in stored


def test_a_data_json_with_entries_1500_and_100000_levels_deep_stores_every_other_dataset(db, reader, samples):
    """Before, the entry of 1,500 levels failed the whole document (RecursionError), the one of
    100,000 made the parser run out of memory."""
    from harvester.testing.dcat_portal import DcatServer
    from harvester.testing.local_http import dumps, nested
    from harvester.testing.samples import dcat_samples_dir, load_json

    catalogue = load_json(dcat_samples_dir() / "dcat-us" / "dcatus.json")
    good = catalogue["dataset"]
    planted = []
    for levels in (1500, DEEP):
        entry = copy.deepcopy(good[0])
        entry.update(identifier=f"planted-{levels}", tree=nested(levels))
        planted.append(entry)
    catalogue["dataset"] = good[:2] + planted + good[2:]
    with DcatServer() as server:
        server.set_document("/data.json", dumps(catalogue).encode())
        portal = Portal(name="d", type="dcat-json", url=server.url("/data.json"), politeness_delay=0, max_retries=0)
        run_id, stats = _run(db, reader, portal)
    assert (stats["failed"], stats["created"]) == (2, len(good))
    assert _ids(db, portal.url) == {e["identifier"] for e in good}
    errors = _rows(db, run_id, "error")
    assert set(errors) == {("planted-1500", "record-too-deep"), (f"planted-{DEEP}", "record-too-deep")}
    assert all(r["stage"] == "parse" and r["field"] == "tree" + ".in" * 63 for r in errors.values())


# -- the kinds of issue 39 ---------------------------------------------------------------------------
# Each new kind's local server, real HTTP, the pipeline's real steps: every planted value is its
# record's coded outcome (an error failing the record, or a warning storing it made storable), the
# other records land and the run commits.
def test_a_udata_portals_bad_values_are_their_records_outcomes_and_the_rest_commits(db, reader):
    """NaN/±Infinity, lone surrogates (in a title, in an id), U+0000, a dataset 100,000 levels
    deep, a last_modified of year 99999 and one that is a date only before it is read in UTC (the
    last minute of 9999 at -02:00)."""
    from harvester.testing.local_http import nested
    from harvester.testing.udata_portal import UdataPortal, catalogue

    datasets = catalogue(30)
    ids = [d["id"] for d in datasets]
    d = datasets
    d[0]["resources"][0]["filesize"] = float("nan")
    d[0]["spatial"] = {"zones": [], "bbox": [-float("inf"), float("inf")]}
    d[1]["title"] = "udata \ud800 title"
    d[2]["id"] = ids[2] = "b0" + "0" * 20 + "\udbff"
    d[3]["description"] = "Before\x00after"
    d[4]["harvest"] = {"remote_tree": nested(DEEP)}
    d[5]["last_modified"] = "99999-01-01T00:00:00+00:00"
    d[6]["last_modified"] = "9999-12-31T23:00:00-02:00"
    d[7]["created_at"] = "99999-01-01T00:00:00"
    with UdataPortal(datasets) as server:
        portal = Portal(name="u", type="udata", url=server.url, page_size=10, politeness_delay=0, max_retries=0)
        run_id, stats = _run(db, reader, portal)
        assert (stats["failed"], stats["created"]) == (4, 26)
        assert _ids(db, portal.url) == set(ids) - {ids[2], ids[4], ids[5], ids[6]}
        errors = _rows(db, run_id, "error")
        assert set(errors) == {(ids[2].replace("\udbff", "\\udbff"), "unstorable-identifier"),
                               (ids[4], "record-too-deep"), (ids[5], "bad-date"), (ids[6], "bad-date")}
        assert _deep_field(errors, ids[4]).startswith("harvest.remote_tree.in.in")
        assert (errors[ids[5], "bad-date"]["field"], errors[ids[5], "bad-date"]["value"]) == (
            "last_modified", "99999-01-01T00:00:00+00:00")
        assert errors[ids[6], "bad-date"]["value"] == "9999-12-31T23:00:00-02:00"
        warnings = _rows(db, run_id, "warning")
        nan = warnings[ids[0], "non-finite-number"]
        assert nan["value"] in ("NaN", "-Infinity") and "(3 values in all)" in nan["message"]
        assert warnings[ids[1], "lone-surrogate"]["value"] == "udata \ufffd title"
        assert warnings[ids[3], "nul-character"]["value"] == "Beforeafter"
        assert _stored(db, portal.url, ids[1])[0] == "udata \ufffd title"
        assert _stored(db, portal.url, ids[3])[1] == "Beforeafter"
        assert _stored(db, portal.url, ids[7]) is not None  # (a creation date past the calendar: stored all the same)

        run_id, stats = _run(db, reader, portal)
        assert (stats["failed"], stats["created"], stats["updated"]) == (4, 0, 0)


def test_a_stac_apis_bad_values_are_their_records_outcomes_and_the_rest_commits(db, reader):
    """Collections of a STAC API (/collections paged): NaN/±Infinity in summaries, lone surrogates
    (a title, an id), U+0000, one 100,000 levels deep, an ``updated`` of year 99999 and one past the
    calendar only in UTC (an optional date: warned, the collection kept)."""
    from harvester.testing.local_http import nested
    from harvester.testing.stac_portal import StacServer, derived_collections

    docs = derived_collections(30)
    ids = [d["id"] for d in docs]
    docs[0]["summaries"] = {"gsd": [float("nan")], "range": [-float("inf"), float("inf")]}
    docs[1]["title"] = "STAC \ud800 title"
    docs[2]["id"] = ids[2] = ids[2] + "\udbff"
    docs[3]["description"] = "Before\x00after"
    docs[4]["tree"] = nested(DEEP)
    docs[5]["updated"] = "99999-01-01T00:00:00Z"
    docs[6]["updated"] = "9999-12-31T23:00:00-02:00"
    with StacServer(docs) as server:
        portal = Portal(name="s", type="stac", url=server.url, page_size=10, politeness_delay=0, max_retries=0)
        run_id, stats = _run(db, reader, portal)
        assert (stats["failed"], stats["created"]) == (2, 28)
        assert _ids(db, portal.url) == set(ids) - {ids[2], ids[4]}
        errors = _rows(db, run_id, "error")
        assert set(errors) == {(ids[2].replace("\udbff", "\\udbff"), "unstorable-identifier"),
                               (ids[4], "record-too-deep")}
        assert _deep_field(errors, ids[4]).startswith("tree.in.in")
        warnings = _rows(db, run_id, "warning")
        nan = warnings[ids[0], "non-finite-number"]
        assert (nan["field"], nan["value"]) == ("summaries.gsd[0]", "NaN") and "(3 values in all)" in nan["message"]
        assert warnings[ids[1], "lone-surrogate"]["value"] == "STAC \ufffd title"
        assert warnings[ids[3], "nul-character"]["value"] == "Beforeafter"
        assert (warnings[ids[5], "bad-optional-date"]["field"], warnings[ids[5], "bad-optional-date"]["value"]) == (
            "updated", "99999-01-01T00:00:00Z")
        assert warnings[ids[6], "bad-optional-date"]["value"] == "9999-12-31T23:00:00-02:00"
        assert _stored(db, portal.url, ids[1])[0] == "STAC \ufffd title"
        assert _stored(db, portal.url, ids[3])[1] == "Beforeafter"
        assert _stored(db, portal.url, ids[0])[2]["extras"]["summaries"] == {"gsd": [None], "range": [None, None]}

        run_id, stats = _run(db, reader, portal)
        assert (stats["failed"], stats["created"], stats["updated"]) == (2, 0, 0)


def _planted_xml(server_class, plants: dict[bytes, bytes]):
    """``server_class`` whose answers have each placeholder of ``plants`` replaced by its bytes as
    they go out: what no XML writer would write (``&#x1;``, a raw control character)."""

    class Planted(server_class):
        def answer(self, *args):
            status, body, *rest = super().answer(*args)
            for placeholder, planted in plants.items():
                body = body.replace(placeholder, planted)
            return (status, body, *rest)

    return Planted


def test_an_oai_pmh_repositorys_bad_values_are_their_records_outcomes_and_the_rest_commits(db, reader):
    """Character references XML 1.0 forbids (&#0;, &#x1;, &#xD800; as DNB's repository wrote one),
    a raw control character (TreeBASE's 0x1A, Dataverse's U+0003), a huge description, a datestamp
    of year 99999, an identifier of only whitespace and one holding &#x1;. Before, one such
    character failed its page's parse, so every run, until the repository fixed it."""
    from datetime import datetime, timezone

    from harvester.testing.oai_pmh_portal import OaiPmhServer, catalogue

    records = catalogue(30, datetime(2024, 1, 1, tzinfo=timezone.utc))
    ids = [r.identifier for r in records]
    dc = "{http://purl.org/dc/elements/1.1/}"

    def set_text(i: int, tag: str, text: str) -> None:
        node = records[i].metadata["oai_dc"].find(f"{dc}{tag}")
        if node is None:
            node = ET.SubElement(records[i].metadata["oai_dc"], f"{dc}{tag}")
        node.text = text

    set_text(0, "title", "Title PLANTED-NUL here")
    set_text(1, "description", "Description PLANTED-SOH here")
    set_text(2, "title", "Title PLANTED-SURROGATE here")
    set_text(3, "title", "Title \x1a raw")
    set_text(4, "description", "x" * (11 * 1024 * 1024))
    records[5].datestamp = datetime(2024, 5, 5, 5, 5, 5, tzinfo=timezone.utc)
    records[6].identifier = ids[6] = "   "
    records[7].identifier = "oai:localPLANTED-SOH:7"
    ids[7] = "oai:local\x01:7"
    Server = _planted_xml(OaiPmhServer, {b"PLANTED-NUL": b"&#0;", b"PLANTED-SOH": b"&#x1;",
                                         b"PLANTED-SURROGATE": b"&#xD800;",
                                         b"2024-05-05T05:05:05Z": b"99999-05-05T05:05:05Z"})
    with Server(records, page_size=10) as server:
        portal = Portal(name="o", type="oai-pmh", url=server.url, politeness_delay=0, max_retries=0)
        run_id, stats = _run(db, reader, portal)
        # the repository has not fixed them: the next run commits as well, nothing changed
        _, again = _run(db, reader, portal)
    assert (again["failed"], again["created"], again["updated"]) == (4, 0, 0)
    assert (stats["failed"], stats["created"]) == (4, 26)
    assert _ids(db, portal.url) == set(ids) - {ids[4], ids[5], ids[6], ids[7]}
    errors = _rows(db, run_id, "error")
    assert {(i, code) for i, code in errors} == {(ids[4], "record-too-large"), (ids[5], "bad-date"),
                                                 (None, "no-identifier"), ("oai:local\\x01:7", "unstorable-identifier")}
    warnings = _rows(db, run_id, "warning")
    # each shown as Python escapes it, whether written as a reference or raw
    assert {i: warnings[i, "invalid-xml-character"]["value"] for i in ids[:4]} == {
        ids[0]: "\\x00", ids[1]: "\\x01", ids[2]: "\\ud800", ids[3]: "\\x1a"}
    assert "characters XML 1.0 forbids (\\x01)" in warnings[ids[1], "invalid-xml-character"]["message"]
    assert not any(code == "invalid-xml-character" for i, code in warnings if i not in ids[:4])
    assert _stored(db, portal.url, ids[0])[0] == "Title \ufffd here"
    assert _stored(db, portal.url, ids[2])[0] == "Title \ufffd here"
    assert _stored(db, portal.url, ids[3])[0] == "Title \ufffd raw"
    assert _stored(db, portal.url, ids[1])[1] == "Description \ufffd here"


def test_a_csw_catalogues_bad_values_are_their_records_outcomes_and_the_rest_commits(db, reader):
    """Real ISO 19139 records (tests/data/csw/) on a local CSW's GetRecords pages, planted with
    character references XML 1.0 forbids (&#x1;, &#0;, &#xD800;) and a raw 0x1A in titles and an
    abstract, and &#x1; in one fileIdentifier and in one Dublin Core dc:identifier. Before, one such
    character failed its page's parse (retried as "not XML", then the run), on every run until the
    catalogue fixed it."""
    from harvester.testing.csw_portal import CswServer, derive, load_records

    data = Path(__file__).resolve().parents[1] / "data" / "csw"
    iso = load_records(data / "iso_getrecords_inspire.xml") + load_records(data / "iso_getrecords_pycsw.xml")
    dc = load_records(data / "dc_getrecords_pycsw.xml")
    ids = [f"csw-rec-{i:02d}" for i in range(25)]
    titles = {0: "Title PLANTED-SOH here", 1: "Title PLANTED-NUL here", 2: "Title PLANTED-SURROGATE here",
              3: "Title \x1a raw"}
    records = [derive(iso[i % len(iso)], ids[i], title=titles.get(i, f"Record {i}"),
                      modified=f"2024-02-{1 + i:02d}T00:00:00Z") for i in range(24)]
    abstract = records[4].find(".//{http://www.isotc211.org/2005/gmd}abstract/"
                               "{http://www.isotc211.org/2005/gco}CharacterString")
    abstract.text = "Abstract PLANTED-SOH here"
    records[5] = derive(records[5], "csw-rec-PLANTED-SOH-05")
    records.append(derive(dc[0], "dc-PLANTED-SOH-24", title="A Dublin Core record"))
    Server = _planted_xml(CswServer, {b"PLANTED-NUL": b"&#0;", b"PLANTED-SOH": b"&#x1;",
                                      b"PLANTED-SURROGATE": b"&#xD800;"})
    with Server(records) as server:
        portal = Portal(name="c", type="csw", url=server.url, politeness_delay=0, max_retries=0, page_size=10)
        run_id, stats = _run(db, reader, portal)
        # the catalogue has not fixed them: the next run commits as well, nothing changed
        _, again = _run(db, reader, portal)
    bad_ids = {"csw-rec-\\x01-05", "dc-\\x01-24"}
    assert (stats["failed"], stats["created"]) == (2, 23)
    assert (again["failed"], again["created"], again["updated"]) == (2, 0, 0)
    assert _ids(db, portal.url) == set(ids[:24]) - {ids[5]}
    errors = _rows(db, run_id, "error")
    assert set(errors) == {(i, "unstorable-identifier") for i in bad_ids}
    message = errors["dc-\\x01-24", "unstorable-identifier"]["message"]
    assert "its identifier holds a character XML 1.0 forbids (\\x01)" in message
    warnings = _rows(db, run_id, "warning")
    # each shown as Python escapes it, whether written as a reference or raw
    assert {i: r["value"] for (i, code), r in warnings.items() if code == "invalid-xml-character"} == {
        ids[0]: "\\x01", ids[1]: "\\x00", ids[2]: "\\ud800", ids[3]: "\\x1a", ids[4]: "\\x01"}
    assert _stored(db, portal.url, ids[0])[0] == "Title \ufffd here"
    assert _stored(db, portal.url, ids[1])[0] == "Title \ufffd here"
    assert _stored(db, portal.url, ids[2])[0] == "Title \ufffd here"
    assert _stored(db, portal.url, ids[3])[0] == "Title \ufffd raw"
    assert _stored(db, portal.url, ids[4])[1] == "Abstract \ufffd here"
    assert _stored(db, portal.url, ids[6])[0] == "Record 6"


def test_an_sdmx_services_bad_values_are_their_dataflows_outcomes_and_the_rest_commits(db, reader):
    """INSEE's real dataflows in one streamed structure message, planted: character references
    XML 1.0 forbids (&#0;, &#x1;, &#xD800;) and a raw control character in names, a dataflow of
    more than 10 MB, an UPDATE_DATA of year 99999, an id of only whitespace, an id holding &#x1;.
    Before, one such character failed the whole message: the run, every run."""
    from harvester.testing.sdmx_portal import NS, SdmxServer, derive, insee_dataflows

    flows = [derive(f, f"PLANTED-{i:02d}", names={"fr": f"Flux {i}", "en": f"Flow {i}"})
             for i, f in enumerate(insee_dataflows()[:30])]
    ids = [f"FR1:PLANTED-{i:02d}" for i in range(30)]
    com = "{%s}" % NS["com"]

    def rename(i: int, text: str) -> None:
        flows[i] = derive(flows[i], names={"fr": text, "en": f"Flow {i}"})

    rename(0, "Nom PLANTED-NUL ici")
    rename(1, "Nom PLANTED-SOH ici")
    rename(2, "Nom PLANTED-SURROGATE ici")
    rename(3, "Nom \x1a brut")
    ET.SubElement(flows[4], f"{com}Description").text = "x" * (11 * 1024 * 1024)
    flows[5] = derive(flows[5], updated="99999-01-01T00:00:00")
    flows[6] = derive(flows[6], "   ")
    flows[7] = derive(flows[7], "PLANTED-PLANTED-SOH07")
    ids[7] = "FR1:PLANTED-\x0107"
    Server = _planted_xml(SdmxServer, {b"PLANTED-NUL": b"&#0;", b"PLANTED-SOH": b"&#x1;",
                                       b"PLANTED-SURROGATE": b"&#xD800;"})
    with Server(flows) as server:
        portal = Portal(name="x", type="sdmx", url=server.url, politeness_delay=0, max_retries=0,
                        language="french")
        run_id, stats = _run(db, reader, portal)
        _, again = _run(db, reader, portal)
    assert (stats["failed"], stats["created"]) == (3, 27)
    assert (again["failed"], again["created"], again["updated"]) == (3, 0, 0)
    assert _ids(db, portal.url) == set(ids) - {ids[4], ids[6], ids[7]}
    errors = _rows(db, run_id, "error")
    assert set(errors) == {(ids[4], "record-too-large"), (None, "no-identifier"),
                           ("FR1:PLANTED-\\x0107", "unstorable-identifier")}
    warnings = _rows(db, run_id, "warning")
    assert {i: warnings[i, "invalid-xml-character"]["value"] for i in ids[:4]} == {
        ids[0]: "\\x00", ids[1]: "\\x01", ids[2]: "\\ud800", ids[3]: "\\x1a"}
    assert not any(code == "invalid-xml-character" for i, code in warnings if i not in ids[:4])
    assert warnings[ids[5], "bad-optional-date"]["value"] == "99999-01-01T00:00:00"
    assert [_stored(db, portal.url, i)[0] for i in ids[:4]] == ["Nom \ufffd ici"] * 3 + ["Nom \ufffd brut"]


def test_a_wafs_bad_values_are_their_files_outcomes_and_the_rest_commits(db, reader):
    """ISO files of a Web Accessible Folder (one record a file): character references XML 1.0
    forbids (&#x1;, &#0;) and a raw control character in titles, one that only looks like a
    reference (in a comment: left alone), a title of 11 MB, a dateStamp of year 99999, a
    fileIdentifier of only whitespace, a file past the size cap. Before, one forbidden character
    failed its whole file as not-iso-metadata: the record was lost for one character."""
    from datetime import datetime

    from harvester.sources.iso_waf import MAX_FILE_BYTES
    from harvester.testing.iso_waf_portal import WafFile, WafServer, catalogue

    files = catalogue(20, start=datetime(2024, 1, 1), per_folder=10)
    paths = sorted(files)
    body = {p: files[p].data() for p in paths}

    def plant(i: int, old: bytes, new: bytes) -> None:
        assert old in body[paths[i]]
        body[paths[i]] = body[paths[i]].replace(old, new, 1)

    plant(0, b"Record 0<", b"Record &#x1; 0<")
    plant(1, b"Record 1<", b"Record &#0; 1<")
    plant(2, b"Record 2<", b"Record \x1a 2<")
    plant(3, b"<gmd:abstract>", b"<gmd:abstract><!-- &#x110000; -->")
    plant(4, b"Record 4<", b"Record 4 " + b"x" * (11 * 1024 * 1024) + b"<")
    stamp = body[paths[5]].split(b"<gmd:dateStamp>", 1)[1].split(b"</gmd:dateStamp>", 1)[0]
    plant(5, stamp, b"<gco:DateTime>99999-01-01T00:00:00</gco:DateTime>")
    file_id = body[paths[6]].split(b"<gmd:fileIdentifier>", 1)[1].split(b"</gmd:fileIdentifier>", 1)[0]
    plant(6, file_id, b"<gco:CharacterString>   </gco:CharacterString>")
    plant(7, b"Record 7<", b"Record 7 " + b"y" * MAX_FILE_BYTES + b"<")
    with WafServer({p: WafFile(body[p], files[p].modified) for p in paths}, style="apache") as server:
        portal = Portal(name="w", type="iso-waf", url=server.url, politeness_delay=0, max_retries=0)
        run_id, stats = _run(db, reader, portal)
        urls = [server.url + p for p in paths]
        _, again = _run(db, reader, portal)
    assert (stats["failed"], stats["created"]) == (2, 18)
    assert (again["failed"], again["created"], again["updated"]) == (2, 0, 0)
    assert _ids(db, portal.url) == set(urls) - {urls[4], urls[7]}
    assert set(_rows(db, run_id, "error")) == {(urls[4], "record-too-large"), (urls[7], "file-too-large")}
    warnings = _rows(db, run_id, "warning")
    assert {i: warnings[urls[i], "invalid-xml-character"]["value"] for i in range(3)} == {
        0: "\\x01", 1: "\\x00", 2: "\\x1a"}
    assert not any(code == "invalid-xml-character" for u, code in warnings if u not in urls[:3])
    assert [_stored(db, portal.url, urls[i])[0] for i in range(3)] == [
        "Record \ufffd 0", "Record \ufffd 1", "Record \ufffd 2"]
    raw = _stored(db, portal.url, urls[5])[2]
    assert raw["date_stamp"] == "99999-01-01T00:00:00"  # kept as written (the listing dates the record)
    assert _stored(db, portal.url, urls[6])[2]["file_identifier"] is None


def test_a_sparql_endpoints_bad_values_are_their_datasets_outcomes_and_the_rest_commits(db, reader):
    """DCAT datasets of a SPARQL endpoint (real DCAT-AP, copied to 30): SPARQL JSON bindings of a
    title holding U+0000 and a description holding a lone surrogate, a dataset IRI with a space
    and one with a lone surrogate (neither can be written into the details query), a dct:modified
    of year 99999."""
    from rdflib import Literal, URIRef
    from rdflib.namespace import DCTERMS, XSD

    from harvester.testing.sparql_portal import SparqlServer, dataset_iris, derived_catalogue, sample_graph

    graph = derived_catalogue(sample_graph("dcat-ap/ckanext-dcatde/catalog-endpoint.rdf"), 30)
    iris = dataset_iris(graph)

    def rename(i: int, new: str) -> None:
        old = URIRef(iris[i])
        for s, p, o in list(graph.triples((old, None, None))):
            graph.remove((s, p, o))
            graph.add((URIRef(new), p, o))
        for s, p, o in list(graph.triples((None, None, old))):
            graph.remove((s, p, o))
            graph.add((s, p, URIRef(new)))
        iris[i] = new

    def put(i: int, prop, value) -> None:
        graph.remove((URIRef(iris[i]), prop, None))
        graph.add((URIRef(iris[i]), prop, value))

    put(0, DCTERMS.title, Literal("SPARQL\x00title", lang="de"))
    put(1, DCTERMS.description, Literal("Broken \ud800 description", lang="de"))
    rename(2, iris[2] + " x")
    rename(4, iris[4] + "\ud800")
    put(5, DCTERMS.modified, Literal("99999-01-01T00:00:00", datatype=XSD.dateTime))
    with SparqlServer(graph) as server:
        portal = Portal(name="q", type="dcat-sparql", url=server.url, page_size=10, politeness_delay=0,
                        max_retries=0, language="german")
        run_id, stats = _run(db, reader, portal)
        _, again = _run(db, reader, portal)
    assert (stats["failed"], stats["created"]) == (3, 27)
    assert (again["failed"], again["created"], again["updated"]) == (3, 0, 0)
    assert _ids(db, portal.url) == set(iris) - {iris[2], iris[4], iris[5]}
    errors = _rows(db, run_id, "error")
    assert set(errors) == {(iris[2], "no-identifier"), (None, "no-identifier"), (iris[5], "bad-range")}
    assert (errors[iris[5], "bad-range"]["field"], errors[iris[5], "bad-range"]["value"]) == (
        "dct:modified", "99999-01-01T00:00:00")
    warnings = _rows(db, run_id, "warning")
    assert warnings[iris[0], "nul-character"]["value"] == "SPARQLtitle"
    assert warnings[iris[1], "lone-surrogate"]["value"] == "Broken \ufffd description"
    assert _stored(db, portal.url, iris[0])[0] == "SPARQLtitle"
    assert _stored(db, portal.url, iris[1])[1] == "Broken \ufffd description"


def test_a_static_stac_catalogs_bad_values_are_their_collections_outcomes_and_the_rest_commits(db, reader):
    """The same collections as a static catalog, each its own document reached by a child link:
    NaN/±Infinity, a lone surrogate in a title, U+0000, one 100,000 levels deep (its document read
    by json_stream), an updated of year 99999."""
    from harvester.testing.local_http import nested
    from harvester.testing.stac_portal import StacServer, derived_collections

    docs = derived_collections(12)
    ids = [d["id"] for d in docs]
    docs[0]["summaries"] = {"gsd": [float("nan")], "range": [-float("inf"), float("inf")]}
    docs[1]["title"] = "STAC \ud800 title"
    docs[3]["description"] = "Before\x00after"
    docs[4]["tree"] = nested(DEEP)
    docs[5]["updated"] = "99999-01-01T00:00:00Z"
    with StacServer(docs) as server:
        portal = Portal(name="s", type="stac", url=server.static_url, politeness_delay=0, max_retries=0)
        run_id, stats = _run(db, reader, portal)
    assert (stats["failed"], stats["created"]) == (1, 11)
    assert _ids(db, portal.url) == set(ids) - {ids[4]}
    errors = _rows(db, run_id, "error")
    assert set(errors) == {(ids[4], "record-too-deep")}
    warnings = _rows(db, run_id, "warning")
    assert warnings[ids[0], "non-finite-number"]["value"] == "NaN"
    assert warnings[ids[1], "lone-surrogate"]["value"] == "STAC \ufffd title"
    assert warnings[ids[3], "nul-character"]["value"] == "Beforeafter"
    assert warnings[ids[5], "bad-optional-date"]["value"] == "99999-01-01T00:00:00Z"
