"""The one retrying HTTP path (http.py) over real HTTP, against the demo CKAN portal: backoff and
Retry-After bounds, politeness, counters, auth, ``parse``/``Retryable``, scrubbed failures.
``sleep`` is given a list's append: the waits are read, not waited."""
from __future__ import annotations

import base64
import logging
import socket

import pytest
import requests

from harvester.http import USER_AGENT, HttpFetcher, RetriesExhausted, Retryable
from harvester.sources.base import SourceUnavailable
from harvester.testing.ckan_portal import DemoPortal


@pytest.fixture(scope="module")
def portal():
    with DemoPortal(records=[]) as p:
        yield p


@pytest.fixture(autouse=True)
def clean(portal):
    portal.clear_faults()
    portal.requests.clear()
    portal.request_headers.clear()


def status_url(portal) -> str:
    return f"{portal.base_url}/api/3/action/status_show"


def fetcher(portal, waits: list, **kw) -> HttpFetcher:
    return HttpFetcher(portal.base_url, **{"max_retries": 3, "sleep": waits.append, **kw})


def test_backoff_doubles_with_equal_jitter_up_to_max_backoff(portal):
    waits = []
    portal.fail_next(4, 503)
    resp = fetcher(portal, waits, max_retries=4, backoff=1.0, max_backoff=3.0).get(status_url(portal))
    assert resp.status_code == 200
    bounds = [(0.5, 1.0), (1.0, 2.0), (1.5, 3.0), (1.5, 3.0)]  # base 1, 2, 4 -> 3, 8 -> 3; each in [base/2, base]
    assert len(waits) == 4 and all(low <= w <= high for w, (low, high) in zip(waits, bounds)), waits


def test_retry_after_is_waited_and_capped_by_max_backoff(portal):
    waits = []
    portal.fail_next(1, 429, retry_after=7)
    assert fetcher(portal, waits, max_backoff=60).get(status_url(portal)).status_code == 200
    portal.fail_next(1, 429, retry_after=3600)
    assert fetcher(portal, waits, max_backoff=0.2).get(status_url(portal)).status_code == 200
    assert waits == [7.0, 0.2]
    # a 429 without a usable Retry-After backs off like a 5xx
    portal.fail_next(1, 429, retry_after="soon")
    fetcher(portal, waits, backoff=10, max_backoff=60).get(status_url(portal))
    assert 5.0 <= waits[-1] <= 10.0


def test_politeness_delay_between_requests(portal):
    waits = []
    http = fetcher(portal, waits, politeness_delay=1000)
    for _ in range(3):
        http.get(status_url(portal))
    assert len(waits) == 2 and all(990 < w <= 1000 for w in waits), waits  # none before the first request


def test_counters_count_retries_and_every_body_byte(portal):
    ok = requests.get(status_url(portal), timeout=10)
    portal.requests.clear()
    portal.fail_next(2, 503)
    http = fetcher(portal, [])
    assert http.get(status_url(portal)).json() == ok.json()
    assert http.requests_made == 3 == len(portal.requests)
    assert http.bytes_received == 2 * len(portal.error_page().encode()) + len(ok.content)
    # a 4xx goes back to the caller, not retried, its body counted
    missing = http.get(f"{portal.base_url}/api/3/action/package_show", params={"id": "nothing-here"})
    assert missing.status_code == 404 and http.requests_made == 4
    assert http.bytes_received == 2 * len(portal.error_page().encode()) + len(ok.content) + len(missing.content)
    # a streamed body is the reader's to count
    before = http.bytes_received
    streamed = http.get(status_url(portal), stream=True)
    assert http.bytes_received == before
    http.add_bytes(len(streamed.raw.read()))
    assert http.bytes_received == before + len(ok.content)


def test_parse_turns_answers_into_values_and_retryable_ones_into_retries(portal):
    def envelope(resp):
        try:
            return resp.json()["result"]
        except ValueError:
            raise Retryable(f"HTTP {resp.status_code}, not JSON") from None

    portal.fail_next(2, 200)  # a proxy's HTML page with status 200
    http = fetcher(portal, [])
    assert http.get(status_url(portal), parse=envelope)["ckan_version"] == "2.10.4"
    assert http.requests_made == 3
    portal.fail_next(3, 200)
    http = fetcher(portal, [], max_retries=2)
    with pytest.raises(RetriesExhausted) as info:
        http.get(status_url(portal), parse=envelope)
    exc = info.value
    assert isinstance(exc, SourceUnavailable) and exc.transient
    assert (exc.attempts, exc.last, exc.status) == (3, "HTTP 200, not JSON", 200)
    assert str(exc) == f"GET {status_url(portal)} failed after 3 attempts (last: HTTP 200, not JSON)"
    # any other exception from parse is the caller's: not retried
    portal.fail_next(1, 200)
    http = fetcher(portal, [])
    with pytest.raises(KeyError):
        http.get(status_url(portal), parse=lambda resp: {}["result"])
    assert http.requests_made == 1


def test_user_agent_and_headers_go_with_every_request(portal):
    http = fetcher(portal, [], headers={"Accept": "application/json"})
    http.get(status_url(portal))
    assert portal.request_headers[-1]["User-Agent"] == USER_AGENT
    assert portal.request_headers[-1]["Accept"] == "application/json"
    http.get(status_url(portal), headers={"Accept": "text/turtle"})
    assert portal.request_headers[-1]["Accept"] == "text/turtle"
    fetcher(portal, [], user_agent="harvester/0.1").get(status_url(portal))
    assert portal.request_headers[-1]["User-Agent"] == "harvester/0.1"


def test_basic_and_header_auth_are_sent_and_never_shown(portal):
    http = fetcher(portal, [], basic_auth=("robot", "Pw-9f8e7d"))
    http.get(status_url(portal))
    assert portal.request_headers[-1]["Authorization"] == "Basic " + base64.b64encode(b"robot:Pw-9f8e7d").decode()
    assert "Pw-9f8e7d" not in repr(http) + repr(vars(http))
    http = fetcher(portal, [], header_auth=("Authorization", "KEY-55aa"))
    http.get(status_url(portal))
    assert portal.request_headers[-1]["Authorization"] == "KEY-55aa"
    assert "KEY-55aa" not in repr(http) + repr(vars(http))
    with pytest.raises(ValueError, match=r"give basic_auth or header_auth \(Authorization\), not both"):
        fetcher(portal, [], basic_auth=("robot", "Pw-9f8e7d"), header_auth=("Authorization", "KEY-55aa"))


def test_connection_failures_are_retried_and_scrubbed(caplog):
    caplog.set_level(logging.DEBUG, logger="harvester")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://harvest:s3cret@127.0.0.1:{port}/data.json"
    http = HttpFetcher(url, max_retries=1, sleep=lambda _: None)
    with pytest.raises(RetriesExhausted) as info:
        http.get(url)
    assert str(info.value) == (f"GET http://***@127.0.0.1:{port}/data.json failed after 2 attempts "
                               "(last: connection refused)")
    assert info.value.status is None and http.requests_made == 2
    assert "retry 1 of 1" in caplog.text
    assert "s3cret" not in caplog.text + str(info.value) + repr(http)
