"""The guarded client of harvests (harvester.http.HttpFetcher through harvester.http.guard), over real
HTTP on loopback: credentials only to the portal's own origin (redirects, JSON-LD contexts and Hydra
pages elsewhere get none), the address policy beyond the portal's own host, a whole-request deadline
kept while bytes trickle (headers or body), and a size cap while an answer streams."""
from __future__ import annotations

import json
import threading
import time

import pytest

from harvester.config.portals import DCAT_JSON, DCAT_RDF, Portal
from harvester.http import HttpFetcher
from harvester.http.guard import AddressRefused, FetchPolicy, FetchTimeout, Refused, TooLarge
from harvester.sources import Listing, source_for
from harvester.testing.hostile_http import Document, Drip, Endless, HostileServer, Redirect, Silent

BASIC = "Basic dXNlcjpzM2NyZXQ="  # user:s3cret


@pytest.fixture
def portal():
    with HostileServer() as server:
        yield server


@pytest.fixture
def elsewhere():
    """Another origin on the portal's own host (another port)."""
    with HostileServer() as server:
        yield server


@pytest.fixture
def inward():
    """A server on another loopback address: a host that is not the portal's."""
    with HostileServer(host="127.0.0.2") as server:
        yield server


def ended_within(seconds: float, call):
    """(what ``call()`` raised or returned, seconds it took); fails the test instead of hanging
    when it does not end within ``seconds``."""
    outcome: dict = {}

    def run():
        started = time.monotonic()
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001  (the test looks at it)
            outcome["value"] = exc
        outcome["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return outcome["value"], outcome["took"]


# -- credentials -------------------------------------------------------------------------------------
def test_jsonld_contexts_and_hydra_pages_on_other_origins_get_no_credentials(portal, elsewhere):
    ctx = elsewhere.serve("/context.jsonld", Document(json.dumps({"@context": {
        "dcat": "http://www.w3.org/ns/dcat#", "dct": "http://purl.org/dc/terms/",
        "hydra": "http://www.w3.org/ns/hydra/core#"}}).encode(), "application/ld+json"))
    page2 = elsewhere.serve("/page2.ttl", Document(
        b"@prefix dcat: <http://www.w3.org/ns/dcat#> . @prefix dct: <http://purl.org/dc/terms/> .\n"
        b"<http://example.org/ds/2> a dcat:Dataset ; dct:title \"Two\" ; dct:identifier \"2\" .\n",
        "text/turtle"))
    first = portal.url("/catalog.jsonld")
    portal.serve("/catalog.jsonld", Document(json.dumps({"@context": ctx, "@graph": [
        {"@id": "http://example.org/ds/1", "@type": "dcat:Dataset", "dct:title": "One", "dct:identifier": "1"},
        {"@id": first, "@type": "hydra:PartialCollectionView", "hydra:next": {"@id": page2}}]}).encode(),
        "application/ld+json"))
    source = source_for(Portal(name="guarded", url=first, type=DCAT_RDF, politeness_delay=0,
                               credentials=("user", "s3cret")))
    listing = Listing()
    ids = sorted(r.source_id for page in source.iter_records(None, 100, listing) for r in page)

    assert ids == ["http://example.org/ds/1", "http://example.org/ds/2"] and listing.complete
    assert [r.headers.get("authorization") for r in portal.seen()] == [BASIC]
    assert [(r.path, r.headers.get("authorization")) for r in elsewhere.seen()] == [
        ("/context.jsonld", None), ("/page2.ttl", None)]


def test_a_redirect_to_another_origin_drops_the_header_credential(portal, elsewhere):
    landing = elsewhere.serve("/landing", Document(b'{"ok": true}'))
    portal.serve("/away", Redirect(landing))
    portal.serve("/home", Document(b'{"ok": true}'))
    portal.serve("/here", Redirect("/home", 301))
    fetcher = HttpFetcher(portal.base_url, header_auth=("X-CKAN-API-Key", "s3cret-token"), politeness_delay=0)

    assert fetcher.get(portal.url("/away")).json() == {"ok": True}
    assert fetcher.get(portal.url("/here")).json() == {"ok": True}

    assert [(r.path, r.headers.get("x-ckan-api-key")) for r in portal.seen()] == [
        ("/away", "s3cret-token"), ("/here", "s3cret-token"), ("/home", "s3cret-token")]
    assert [(r.path, r.headers.get("x-ckan-api-key")) for r in elsewhere.seen()] == [("/landing", None)]
    assert fetcher.requests_made == 4  # each hop is a request


# -- addresses ---------------------------------------------------------------------------------------
def test_a_harvest_reaches_its_portals_host_but_no_other_inward_address(portal, inward, monkeypatch):
    target = inward.serve("/latest/meta-data/", Document(b'{"secret": "role"}'))
    portal.serve("/next", Redirect(target))
    portal.serve("/metadata", Redirect("http://169.254.169.254/latest/meta-data/"))
    portal.serve("/file", Redirect("file:///etc/passwd"))
    fetcher = HttpFetcher(portal.base_url, politeness_delay=0, max_retries=0)

    with pytest.raises(AddressRefused) as caught:
        fetcher.get(portal.url("/next"))
    assert str(caught.value) == ("127.0.0.2 is a loopback address: a harvest fetches only public addresses beyond "
                                 "its portal's own host (HARVESTER_FETCH_ALLOW_PRIVATE is off)")
    with pytest.raises(AddressRefused, match=r"^169\.254\.169\.254 is a link-local \(cloud metadata\) address"):
        fetcher.get(portal.url("/metadata"))
    with pytest.raises(Refused, match=r"^file:///etc/passwd: a harvest fetches only http\(s\) URLs, not file:$"):
        fetcher.get(portal.url("/file"))
    assert inward.seen() == []

    monkeypatch.setenv("HARVESTER_FETCH_ALLOW_PRIVATE", "true")
    opened = HttpFetcher(portal.base_url, politeness_delay=0, max_retries=0)
    assert opened.get(portal.url("/next")).json() == {"secret": "role"}
    assert len(inward.seen()) == 1


# -- deadline ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers"])
def test_a_request_ends_at_its_deadline_however_slowly_bytes_come(portal, monkeypatch, headers_too):
    monkeypatch.setenv("HARVESTER_FETCH_DEADLINE_SECS", "2")
    url = portal.serve("/catalog.ttl", Drip(every=0.2, headers_too=headers_too))
    fetcher = HttpFetcher(portal.base_url, politeness_delay=0, max_retries=0, timeout=1.5)

    raised, took = ended_within(30, lambda: fetcher.get(url))

    assert isinstance(raised, FetchTimeout), raised
    assert took < 2 + 2
    assert "2 s a request may take (HARVESTER_FETCH_DEADLINE_SECS)" in str(raised)
    assert raised.transient  # the task's retry may find the portal faster


def test_a_silent_server_is_bounded_by_the_read_timeout(portal):
    url = portal.serve("/silent", Silent())
    fetcher = HttpFetcher(portal.base_url, politeness_delay=0, max_retries=0, timeout=1)
    raised, took = ended_within(30, lambda: fetcher.get(url))
    assert "(last: timed out: nothing received for 1 s)" in str(raised) and took < 3


def test_validation_keeps_its_deadline_while_a_url_trickles(portal):
    from harvester.pipeline import validate as v

    url = portal.serve("/catalog.ttl", Drip(every=0.5))
    policy = FetchPolicy(allow_private=True, max_bytes=100 * 1024 * 1024, timeout=3, deadline=3)

    raised, took = ended_within(60, lambda: v.validate_url(url, fetcher=policy))

    assert isinstance(raised, FetchTimeout), raised
    assert took < 3 + 2
    assert "the validation's time (HARVESTER_VALIDATE_TIMEOUT_SECS) ran out" in str(raised)


# -- size --------------------------------------------------------------------------------------------
def test_an_endless_answer_stops_at_the_size_cap(portal, monkeypatch):
    monkeypatch.setenv("HARVESTER_FETCH_MAX_BYTES", "1MB")
    url = portal.serve("/endless", Endless(cap=64 * 1024 * 1024))
    fetcher = HttpFetcher(portal.base_url, politeness_delay=0, max_retries=0)

    raised, _ = ended_within(60, lambda: fetcher.get(url))

    assert isinstance(raised, TooLarge), raised
    assert str(raised) == f"{url}: the document is larger than 1MB (HARVESTER_FETCH_MAX_BYTES)"


def test_a_streamed_catalogue_has_its_own_larger_cap(portal, monkeypatch):
    monkeypatch.setenv("HARVESTER_FETCH_MAX_BYTES", "1MB")
    monkeypatch.setenv("HARVESTER_FETCH_MAX_STREAM_BYTES", "4MB")
    entries = [{"identifier": f"id-{i}", "title": f"Dataset {i}", "description": "x" * 1000,
                "modified": "2024-01-01"} for i in range(1500)]
    portal.serve("/data.json", Document(json.dumps({"dataset": entries}).encode()))  # 1.6 MB: over 1MB
    portal.serve("/huge.json", Endless(b'{"identifier": "same", "title": "Again"},' * 1000, prefix=b'{"dataset": [',
                                       cap=64 * 1024 * 1024))

    source = source_for(Portal(name="streamed", url=portal.url("/data.json"), type=DCAT_JSON, politeness_delay=0))
    assert sum(len(page) for page in source.iter_records(None, 500, Listing())) == 1500

    huge = source_for(Portal(name="huge", url=portal.url("/huge.json"), type=DCAT_JSON, politeness_delay=0))
    raised, _ = ended_within(60, lambda: [p for p in huge.iter_records(None, 500, Listing())])
    assert isinstance(raised, TooLarge) and "larger than 4MB" in str(raised), raised


# -- one client --------------------------------------------------------------------------------------
# Modules that may open a connection of their own, and why: the guard itself; a notifier posting to
# the webhook URL the operator configured; the embedding providers at the addresses the operator set
# (Ollama's, and Gemini's through google-genai).
OWN_CONNECTIONS = {"http/guard.py", "pipeline/notify.py", "embeddings/ollama.py", "embeddings/gemini.py"}
OPENERS = ("requests.get", "requests.post", "requests.head", "requests.request", "requests.Session",
           "urllib.request", "urlopen", "http.client", "urllib3.PoolManager", "httpx")


def test_no_runtime_module_opens_a_url_behind_the_guards_back():
    """Every other module reaches a stranger's server through HttpFetcher or a guarded session: a
    new ``requests.get`` or ``urlopen`` in a source or the pipeline fails here, naming the line."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "plugins" / "harvester"
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith("testing/") or relative in OWN_CONNECTIONS:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if any(opener in code for opener in OPENERS) and "requests.Session |" not in code \
                    and "session: requests.Session" not in code:
                found.append(f"{relative}:{number}: {line.strip()}")
    assert found == []
