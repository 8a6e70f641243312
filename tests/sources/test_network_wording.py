"""A network failure is one line naming the URL once and the cause, in words (issue 38, finding 5):
``http://127.0.0.1:9/data.json: connection refused``, not urllib3's ``GuardedHTTPPool(host=...):
Max retries exceeded with url: ... (Caused by NewConnectionError(...))``. One home words them
(harvester.http.guard.failure_text, raised by the guarded session itself); validation (the
command line and the API's worker) and harvests (HttpFetcher's retries, the sources) say them.
Every failure here is real, on loopback (harvester.testing.network_failures)."""
from __future__ import annotations

import asyncio
import json
import logging
import re

import pytest
import requests

from harvester.cli.main import main
from harvester.config.portals import CKAN, DCAT_JSON, Portal
from harvester.http import HttpFetcher, RetriesExhausted
from harvester.http.guard import FetchPolicy
from harvester.pipeline import validate as v
from harvester.sources import Listing, SourceError, source_for
from harvester.sources.base import SourceUnavailable
from harvester.testing.hostile_http import HostileServer, Silent
from harvester.testing.network_failures import (full_queue, hang_up, plain_http_on_a_tls_url, refused_url,
                                                self_signed_https)

# What a message for people never holds: urllib3's retry wrapper, pool and connection reprs, class names.
SOUP = re.compile(r"Max retries|Caused by|Guarded|HTTPConnection|HTTPSConnection|Pool\(|urllib3|Error\(|"
                  r"ConnectionError|Timeout\b|\[Errno")


def clean(message: str, url: str) -> None:
    assert "\n" not in message, message
    assert not SOUP.search(message), message
    assert message.count(url) <= 1, message


def failure(url: str, timeout: float = 5.0) -> requests.RequestException:
    session = FetchPolicy().session()
    with pytest.raises(requests.RequestException) as info:
        session.get(url, timeout=timeout)
    return info.value


# -- the guarded session's own words --------------------------------------------------------------
def test_connection_refused():
    url = refused_url()
    exc = failure(url)
    assert isinstance(exc, requests.ConnectionError)  # (the class a retry looks at, as before)
    assert str(exc) == "connection refused"


def test_a_host_name_that_does_not_resolve():
    exc = failure("http://no-such-host.invalid/data.json")
    assert isinstance(exc, requests.ConnectionError)
    assert str(exc).startswith("DNS: the host name does not resolve (")
    clean(str(exc), "no-such-host.invalid")


def test_a_connect_that_times_out():
    with full_queue() as url:
        exc = failure(url, timeout=0.5)
    assert isinstance(exc, requests.ConnectTimeout)
    assert str(exc) == "timed out: no connection within 0.5 s"


def test_an_answer_that_never_comes():
    with HostileServer() as server:
        exc = failure(server.serve("/data.json", Silent(5)), timeout=0.5)
    assert isinstance(exc, requests.ReadTimeout)
    assert str(exc) == "timed out: nothing received for 0.5 s"


def test_a_server_that_hangs_up():
    with hang_up() as server:
        exc = failure(server.url())
    assert isinstance(exc, requests.ConnectionError)
    assert str(exc) == "the server closed the connection without answering"


def test_tls_a_self_signed_certificate():
    with self_signed_https() as server:
        exc = failure(server.url())
    assert isinstance(exc, requests.exceptions.SSLError)
    assert str(exc).startswith("TLS: the server's certificate is not trusted (self")
    clean(str(exc), server.url())


def test_tls_a_handshake_with_a_plain_http_server():
    with plain_http_on_a_tls_url() as server:
        exc = failure(server.url())
    assert isinstance(exc, requests.exceptions.SSLError)
    assert str(exc).startswith("TLS: the handshake failed (")
    clean(str(exc), server.url())


# -- validation --------------------------------------------------------------------------------------
def test_validating_a_url_names_it_once_with_the_cause():
    url = refused_url()
    with pytest.raises(SourceUnavailable) as info:  # (transient: the site failed, not the catalogue)
        v.validate_url(url)
    assert str(info.value) == f"{url}: connection refused"


@pytest.mark.parametrize("kind", [None, DCAT_JSON, CKAN])
def test_harvester_validate_says_one_line_naming_the_url_once(kind, capsys):
    url = refused_url()
    assert main(["validate", url, *(["--type", kind] if kind else [])]) == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith("harvester: error: cannot validate") and said.endswith("connection refused)"
                                                                                  if kind else "connection refused")
    clean(said, url)
    assert url.split("/data.json")[0] in said


def test_the_validation_api_says_the_portal_failed_in_words():
    """The API validates in a child process (validate_worker): its error is ``transient`` (the API
    answers 502 "the catalogue could not be fetched: ..."), worded the same."""
    from harvester.pipeline import validate_worker as worker

    url = refused_url()
    policy = FetchPolicy(allow_private=True, max_bytes=1024 ** 2, timeout=10, deadline=10)
    outcome = asyncio.run(worker.run({"url": url, "rows": 10, "policy": worker.policy_fields(policy)},
                                     deadline=10, memory=1024 ** 3))
    assert outcome.error == {"kind": "transient", "message": f"{url}: connection refused"}


# -- harvests --------------------------------------------------------------------------------------
def test_retries_exhausted_name_the_url_once_and_the_last_cause(caplog):
    caplog.set_level(logging.WARNING, logger="harvester")
    url = refused_url()
    fetcher = HttpFetcher(url, max_retries=1, sleep=lambda _: None)
    with pytest.raises(RetriesExhausted) as info:
        fetcher.get(url)
    assert str(info.value) == f"GET {url} failed after 2 attempts (last: connection refused)"
    assert info.value.last == "connection refused"
    retried, = caplog.messages
    assert retried.startswith(f"GET {url}: connection refused; retry 1 of 1 in ")
    with self_signed_https() as server:
        with pytest.raises(RetriesExhausted) as tls:
            HttpFetcher(server.url(), max_retries=0).get(server.url())
    assert str(tls.value).startswith(f"GET {server.url()} failed after 1 attempts (last: TLS: the server's "
                                     "certificate is not trusted (")


@pytest.mark.parametrize("kind", [DCAT_JSON, CKAN])
def test_a_harvests_listing_says_the_cause_in_words(kind):
    url = refused_url("/data.json" if kind == DCAT_JSON else "")
    source = source_for(Portal(name="down", url=url, type=kind, politeness_delay=0, max_retries=1))
    with pytest.raises(SourceError) as info:
        for _ in source.iter_records(None, 100, Listing()):
            pass
    said = str(info.value)
    assert said.endswith("(last: connection refused)"), said
    clean(said, url) if kind == DCAT_JSON else clean(said, url + "/api")
    assert json.dumps(said)  # (a plain line, fit for sync_runs.error)


def test_harvester_harvest_says_the_cause_in_one_line(database_url, tmp_path, monkeypatch, capsys):
    import yaml

    url = refused_url()
    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [{"name": "down", "url": url, "type": DCAT_JSON,
                                                 "politeness_delay": 0, "max_retries": 1}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
    assert main(["harvest", "down"]) == 2
    said = capsys.readouterr().err.strip()
    assert said == f"harvester: error: GET {url} failed after 2 attempts (last: connection refused)", said


@pytest.mark.parametrize("provider", ["ollama", "gemini"])
def test_an_embedding_provider_that_is_down_says_the_cause_in_words(provider):
    """A harvest's embed step: the provider's server refuses the connection."""
    from harvester.embeddings.base import EmbeddingError
    from harvester.embeddings.gemini import GeminiProvider
    from harvester.embeddings.ollama import OllamaProvider

    url = refused_url("")
    made = (OllamaProvider(url=url, dimension=768) if provider == "ollama"
            else GeminiProvider(api_key="not-a-key", base_url=url, timeout=2))
    with pytest.raises(EmbeddingError) as info:
        made.embed_documents(["a text"])
    name = "Ollama" if provider == "ollama" else "Gemini"
    assert str(info.value) == f"could not reach {name} at {url}: connection refused"
