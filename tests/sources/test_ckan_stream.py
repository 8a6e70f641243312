"""A CKAN listing page is read as it streams and handed on in slices (issue 40): real data.gov
records (their resources lists as they are) over real HTTP from the local CKAN portal."""
from __future__ import annotations

import json
import re

import pytest

from harvester.sources.ckan import CkanClient, PortalUnavailable
from harvester.testing.ckan_portal import DemoPortal, load_jsonl
from harvester.testing.samples import sample_path

PAGE = 500
SLICE = 256 * 1024


@pytest.fixture(scope="module")
def us_records():
    return load_jsonl(sample_path("catalog-data-gov.jsonl"))


@pytest.fixture
def us_portal(us_records):
    with DemoPortal(records=us_records) as server:
        yield server


def make_client(base_url, **kw):
    client = CkanClient(base_url, **{"politeness_delay": 0, "backoff": 0.01, "max_backoff": 0.05,
                                     "max_retries": 2, "timeout": 10, **kw})
    client.slice_bytes = SLICE
    return client


def test_a_page_of_real_records_comes_in_slices(us_portal, us_records):
    client = make_client(us_portal.base_url)
    slices = list(client.iter_pages(None, page_size=PAGE))
    ids = [rec["id"] for part in slices for rec in part]
    assert sorted(ids) == sorted(r["id"] for r in us_records)  # every record once
    requests = sum(1 for action, params in us_portal.requests if action == "package_search")
    assert requests == 3  # 1,235 records: three pages...
    assert len(slices) > 2 * requests  # ...each handed on in several slices, none a whole page
    assert max(len(part) for part in slices) < PAGE
    # a slice holds about SLICE bytes of the answer (read half a slice at a time)
    assert max(len(json.dumps(part)) for part in slices) < 2 * SLICE
    assert client.total == len(us_records)


def test_a_page_broken_mid_stream_is_refused_by_name_and_what_came_before_stays(us_portal, us_records):
    seen = {"searches": 0}

    def break_the_second_page(action, params):
        if action != "package_search" or params.get("rows") == "0":
            return
        seen["searches"] += 1
        if seen["searches"] == 2:  # the second page: its real answer, cut two thirds in, then garbage
            result = us_portal.package_search(dict(params))
            body = '{"help": "x", "success": true, "result": %s}' % result
            broken = body[: len(body) * 2 // 3] + '"}]}}} not JSON'
            us_portal.fail_next(3, 200, body=broken, action="package_search")  # streamed, then read whole twice

    us_portal.on_request = break_the_second_page
    client = make_client(us_portal.base_url, max_retries=1)
    got = []
    with pytest.raises(PortalUnavailable) as info:
        for part in client.iter_pages(None, page_size=PAGE):
            got.append(part)
    message = str(info.value)
    assert re.match(re.escape(f"{us_portal.base_url} package_search start=") + r"\d+ rows=501 fq='metadata_modified:",
                    message)  # the page, named
    assert "the answer broke off after" in message and "which were kept" in message
    ids = [rec["id"] for part in got for rec in part]
    assert len(ids) == len(set(ids))
    order = [r["id"] for r in sorted(us_records, key=lambda r: (r["metadata_modified"], r["id"]))]
    # the first page, and the records of the second that streamed before the break, were handed on
    assert ids == order[:len(ids)]
    assert PAGE + 100 < len(ids) < 2 * PAGE
    assert sum(1 for action, _ in us_portal.requests if action == "package_search") == 4
