"""The scale portal (records made on demand) over real HTTP, read by the harvester's own CKAN client."""
from __future__ import annotations

import importlib.util
from datetime import datetime
from pathlib import Path

import pytest
import requests

from harvester.sources.ckan import CkanClient, FilterRejected
from harvester.testing.scale_portal import ScalePortal, bench_id

BENCH = Path(__file__).resolve().parents[2] / "bench" / "harvest_bench.py"


def _harvest_bench():
    spec = importlib.util.spec_from_file_location("harvest_bench_for_scale_portal", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_client(base_url):
    return CkanClient(base_url, politeness_delay=0, backoff=0.01, max_backoff=0.05, max_retries=2, timeout=20)


def listing(client, since=None, fields=None):
    return [rec for page in client.iter_pages(since, page_size=1000, fields=fields) for rec in page]


@pytest.fixture(scope="module")
def portal():
    with ScalePortal(2500) as p:
        yield p


def test_the_client_lists_every_record_once_in_order_as_harvest_bench_derives_them(portal):
    client = make_client(portal.base_url)
    assert client.count() == 2500
    got = listing(client)
    assert [r["id"] for r in got] == [bench_id(i) for i in range(2500)]
    assert client.total == 2500 and client.cut is None
    modified = [r["metadata_modified"] for r in got]
    assert modified[7] == "2020-01-01T00:00:07.000000"
    assert modified == sorted(modified) and len(set(modified)) == 2500
    expected = _harvest_bench().synthetic(2500)
    for rec, want in zip(got, expected):
        assert rec.pop("metadata_modified") and want.pop("metadata_modified")
        assert rec == want
    assert portal.requests_made >= 4


def test_edits_removals_and_additions_show_in_listings_and_fetches():
    with ScalePortal(2500) as portal:
        client = make_client(portal.base_url)
        boundary = datetime(2029, 1, 1)
        assert listing(client, since=boundary) == []
        before = portal.record(10)
        portal.edit([10, 1500, 2499])
        portal.remove([3, 1500, 2000])
        added = portal.add(5)
        assert added == [2500, 2501, 2502, 2503, 2504]
        assert portal.count == 2500 - 3 + 5
        assert portal.record(3) is None and portal.record(1500) is None
        assert portal.record(10)["title"] == before["title"] + " (revised)"
        assert portal.record(10)["metadata_modified"] > "2030"

        since = listing(client, since=boundary)
        assert [r["id"] for r in since] == [bench_id(i) for i in (10, 2499, *added)]
        assert since[0]["title"].endswith("(revised)")

        full = listing(client)
        live = [i for i in range(2500) if i not in (3, 1500, 2000, 10, 2499)] + [10, 2499, *added]
        assert [r["id"] for r in full] == [bench_id(i) for i in live]
        assert client.count() == len(live) == portal.count

        ids = [r["id"] for r in listing(client, fields=("id", "metadata_modified"))]
        assert ids == [bench_id(i) for i in live]
        raw = client.package_search(fl="id,metadata_modified", start=0, rows=3)["results"]
        assert [set(r) for r in raw] == [{"id", "metadata_modified"}] * 3
        assert raw[0] == {"id": bench_id(0), "metadata_modified": "2020-01-01T00:00:00Z"}

        wanted = [bench_id(2501), bench_id(10), bench_id(3), bench_id(42)]
        fetched = [r for page in client.fetch_by_ids(wanted) for r in page]
        assert sorted(r["id"] for r in fetched) == sorted([bench_id(2501), bench_id(10), bench_id(42)])
        assert next(r for r in fetched if r["id"] == bench_id(42)) == portal.record(42)

        # re-editing moves a record again; an edit published late with an old timestamp is found
        # by a listing from before that timestamp
        portal.edit([10])
        assert portal.record(10)["title"] == before["title"] + " (revised) (revised)"
        assert listing(client, since=boundary)[-1]["id"] == bench_id(10)
        portal.add(1, modified="2020-01-01T00:00:05.500000")
        early = listing(client, since=datetime(2020, 1, 1, 0, 0, 5))
        assert [r["id"] for r in early[:3]] == [bench_id(5), bench_id(2505), bench_id(6)]


def test_package_show_and_ckan_errors(portal):
    client = make_client(portal.base_url)
    assert client.status()["ckan_version"]
    assert client.package_show(bench_id(12)) == portal.record(12)
    assert client.package_show(portal.record(12)["name"])["id"] == bench_id(12)
    url = f"{portal.base_url}/api/3/action/"
    missing = requests.get(url + "package_show", params={"id": bench_id(99999)}, timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["__type"] == "Not Found Error"
    bad_sort = requests.get(url + "package_search", params={"sort": "title asc"}, timeout=10)
    assert bad_sort.status_code == 409 and bad_sort.json()["error"]["__type"] == "Search Error"
    with pytest.raises(FilterRejected):
        client.package_search(fq="title:x")
    unknown = requests.get(url + "package_list", timeout=10)
    assert unknown.status_code == 400 and "not known" in unknown.json()


def test_a_page_near_the_end_of_a_million_records_is_computed_not_materialised():
    with ScalePortal(1_000_000) as portal:
        portal.edit(range(0, 1_000_000, 1000))
        portal.remove([999_999, 998_001])
        added = portal.add(3)
        client = make_client(portal.base_url)
        result = client.package_search(start=998_000, rows=1000)
        live_main = [i for i in range(1_000_000) if i % 1000 and i not in (999_999, 998_001)]
        tail = live_main + list(range(0, 1_000_000, 1000)) + added
        assert result["count"] == len(tail) == portal.count
        assert [r["id"] for r in result["results"]] == [bench_id(i) for i in tail[998_000:999_000]]
        late = client.package_search(fq="metadata_modified:[2020-01-12T13:46:00Z TO *]", start=1, rows=5)
        first = (datetime(2020, 1, 12, 13, 46) - datetime(2020, 1, 1)).total_seconds()
        assert [r["id"] for r in late["results"]] == [bench_id(int(first) + k) for k in (1, 2, 3, 4, 5)]
