"""POST /harvester/api/validate against hostile catalogues, served by a REAL Airflow api-server
process (harvester.testing.airflow_cluster): issue 35, finding 2. Thread-pool starvation only shows
in a real server, so nothing here runs in-process.

Each hostile case ends within the validation's time plus SLACK from its start, with a clear answer,
and the child process that validated it says its peak memory (X-Validation-Peak-Memory), under
HARVESTER_VALIDATE_MAX_MEMORY (1GB, the default): contexts to a loopback server and to file://
(refused, the server never asked), a server dripping a byte every 2 s, an endless answer, a context
server that accepts and never answers, a quadratic RDF/XML literal, nested XML entities, 5 MB of
broken data.json entries. And 40 hostile requests at once while Airflow's own /api/v2/version keeps
answering: over HARVESTER_VALIDATE_CONCURRENCY they are answered 429 at once.

The hostile servers listen on 127.0.0.1; the one the validations may reach is let through by
HARVESTER_VALIDATE_ALLOWED_ADDRESSES (its address and port), the trap is not.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
import requests

from harvester.testing.airflow_cluster import AirflowCluster
from harvester.testing.hostile_documents import (broken_data_json, jsonld_with_context, nested_entities_rdfxml,
                                                 quadratic_rdfxml)
from harvester.testing.hostile_http import Document, Drip, Endless, HostileServer, Silent
from harvester.testing.samples import dcat_samples_dir

pytestmark = pytest.mark.slow  # a real Airflow: api-server, scheduler, dag-processor

PATH = "/harvester/api/validate"
DEADLINE = 3.0  # HARVESTER_VALIDATE_TIMEOUT_SECS of the cluster
SLACK = 2.0  # a request ends within DEADLINE + SLACK of its start
CONCURRENCY = 2  # HARVESTER_VALIDATE_CONCURRENCY of the cluster
MEMORY_BOUND = 1024 ** 3  # HARVESTER_VALIDATE_MAX_MEMORY's default: what a child may peak at
VERSION_BOUND = 2.0  # seconds /api/v2/version may take while the 40 hostile requests run
SAMPLE = dcat_samples_dir() / "dcat-us" / "dcatus3_0.json"


class Api:
    def __init__(self, base_url: str, token: str):
        self.base_url, self.token = base_url, token

    def post(self, **kwargs) -> tuple[requests.Response, float]:
        """(the answer, seconds from sending to the whole answer)."""
        started = time.monotonic()
        response = requests.post(self.base_url + PATH, headers={"Authorization": f"Bearer {self.token}"},
                                 timeout=60, **kwargs)
        return response, time.monotonic() - started

    def upload(self, name: str, body: bytes, media: str, **data) -> tuple[requests.Response, float]:
        return self.post(files={"file": (name, body, media)}, data=data)

    def version(self) -> float:
        """Seconds /api/v2/version took to answer (raises past 30 s)."""
        started = time.monotonic()
        response = requests.get(self.base_url + "/api/v2/version", timeout=30,
                                headers={"Authorization": f"Bearer {self.token}"})
        assert response.status_code == 200, response.text
        return time.monotonic() - started


@pytest.fixture(scope="module")
def hostile():
    """The servers validations may reach (HARVESTER_VALIDATE_ALLOWED_ADDRESSES lets them through)."""
    with HostileServer() as server:
        server.serve("/drip.ttl", Drip(every=2.0))
        server.serve("/endless.json", Endless(chunk=b"{}," * 20000, prefix=b'{"dataset": ['))  # entries forever
        server.serve("/silent.jsonld", Silent())
        yield server


@pytest.fixture(scope="module")
def trap():
    """A loopback server no validation may reach."""
    with HostileServer() as server:
        server.serve("/context.jsonld", Document(b'{"@context": {"x": "http://example.org/x"}}',
                                                 "application/ld+json"))
        yield server


@pytest.fixture(scope="module")
def api(pg_server, hostile, tmp_path_factory):
    home = tmp_path_factory.mktemp("validate-limits")
    (home / "dags").mkdir()
    metadata = f"airflow_validate_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{metadata}"')
    port = hostile.base_url.rsplit(":", 1)[1]
    env = {"HARVESTER_VALIDATE_TIMEOUT_SECS": str(DEADLINE), "HARVESTER_VALIDATE_CONCURRENCY": str(CONCURRENCY),
           "HARVESTER_VALIDATE_ALLOWED_ADDRESSES": f"127.0.0.1:{port}", "HARVESTER_EMBEDDED_DB": "off"}
    try:
        with AirflowCluster(home / "airflow", pg_server.url(metadata), env, dags_folder=home / "dags") as cluster:
            answer = requests.get(cluster.base_url + "/auth/token", timeout=30)  # (all admins: no password)
            assert answer.status_code == 201, answer.text
            yield Api(cluster.base_url, answer.json()["access_token"])
    finally:
        with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{metadata}" WITH (FORCE)')


def detail(response) -> str:
    return json.dumps(response.json()["detail"])


def check_bounded(response, seconds: float) -> None:
    """Ended within the validation's time and SLACK, its child under the memory bound."""
    assert seconds <= DEADLINE + SLACK, f"answered {response.status_code} after {seconds:.1f} s: {response.text[:300]}"
    peak = response.headers.get("X-Validation-Peak-Memory")
    assert peak is not None, f"no peak memory said: {response.status_code} {response.text[:300]}"
    assert int(peak) < MEMORY_BOUND, f"the validation's child peaked at {int(peak) / 2 ** 20:.0f} MB"
    print(f"\n  {response.status_code} after {seconds:.2f} s (deadline {DEADLINE:g} s), child's peak memory "
          f"{int(peak) / 2 ** 20:.0f} MB: {response.text[:160]}")


# -- contexts: refused before any request -------------------------------------------------------------------
@pytest.mark.parametrize("where", ["top", "nested", "import", "scoped"])
def test_contexts_to_loopback_and_to_files_are_refused(api, trap, where):
    for ref, named in ((trap.url("/context.jsonld"), ("127.0.0.1", "loopback")), ("file:///etc/passwd", ("file:",))):
        response, seconds = api.upload("catalog.jsonld", jsonld_with_context(ref, where), "application/ld+json")
        assert response.status_code == 422, (ref, response.text)
        assert all(word in detail(response) for word in named), (ref, detail(response))
        check_bounded(response, seconds)
    assert trap.seen() == []


# -- hostile servers -----------------------------------------------------------------------------------------
def test_a_server_dripping_a_byte_every_2_s_is_cut_at_the_deadline(api, hostile):
    response, seconds = api.post(json={"url": hostile.url("/drip.ttl"), "type": "dcat-rdf"})
    assert response.status_code == 504, response.text
    assert f"HARVESTER_VALIDATE_TIMEOUT_SECS={DEADLINE:g}" in detail(response)
    assert "/drip.ttl" in detail(response)
    check_bounded(response, seconds)


def test_an_endless_answer_is_cut(api, hostile):
    response, seconds = api.post(json={"url": hostile.url("/endless.json"), "type": "dcat-json"})
    assert response.status_code in (413, 504), response.text
    assert "HARVESTER_VALIDATE_MAX_BYTES" in detail(response) or "HARVESTER_VALIDATE_TIMEOUT_SECS" in detail(response)
    check_bounded(response, seconds)


def test_a_context_server_that_never_answers_is_cut_at_the_deadline(api, hostile):
    document = jsonld_with_context(hostile.url("/silent.jsonld"), "top")
    response, seconds = api.upload("catalog.jsonld", document, "application/ld+json")
    assert response.status_code == 504, response.text
    assert f"HARVESTER_VALIDATE_TIMEOUT_SECS={DEADLINE:g}" in detail(response)
    check_bounded(response, seconds)


# -- hostile documents ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,make", [("quadratic.rdf", quadratic_rdfxml), ("entities.rdf", nested_entities_rdfxml)],
                         ids=["quadratic-literal", "nested-entities"])
def test_costly_rdf_xml_ends_in_time(api, name, make):
    """A literal of a million lines (2 MB), nested entities (under 1 kB): each took minutes."""
    response, seconds = api.upload(name, make(), "application/rdf+xml")
    assert response.status_code in (200, 422, 504), response.text
    if response.status_code == 504:
        assert f"HARVESTER_VALIDATE_TIMEOUT_SECS={DEADLINE:g}" in detail(response)
    check_bounded(response, seconds)


def test_5_mb_of_broken_data_json_entries_ends_in_time_in_bounded_memory(api):
    """1.7 M entries, 3.5 M rows: more than the validation's time (the exact counts of a smaller
    one: tests/ui/test_validate_api.py); cut at the deadline, the child under the bound."""
    response, seconds = api.upload("data.json", broken_data_json(5 * 1024 * 1024), "application/json")
    assert response.status_code in (200, 504), response.text
    if response.status_code == 200:
        assert response.json()["rows_total"] == 2 * response.json()["records"]
        assert len(response.json()["rows"]) == 1000
    check_bounded(response, seconds)


# -- many at once ---------------------------------------------------------------------------------------------
def test_40_hostile_requests_at_once_leave_the_api_server_answering(api, hostile):
    """40 uploads whose context server never answers, sent at the same moment: CONCURRENCY of them
    run until their deadline, the others are answered 429 with Retry-After at once; Airflow's own
    /api/v2/version (a sync route: the thread pool's) answers within VERSION_BOUND throughout."""
    document = jsonld_with_context(hostile.url("/silent.jsonld"), "top")
    barrier = threading.Barrier(41)
    results: list[tuple[int, float, Any]] = []
    errors: list[BaseException] = []
    latencies: list[float] = []
    done = threading.Event()

    def hostile_request():
        try:
            barrier.wait(30)
            response, seconds = api.upload("catalog.jsonld", document, "application/ld+json")
            results.append((response.status_code, seconds, response.headers))
        except BaseException as exc:  # reported below
            errors.append(exc)

    def poll_version():
        try:
            barrier.wait(30)
            while not done.is_set():
                latencies.append(api.version())
                time.sleep(0.2)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hostile_request) for _ in range(40)]
    poller = threading.Thread(target=poll_version)
    for thread in (*threads, poller):
        thread.start()
    for thread in threads:
        thread.join(120)
    latencies.append(api.version())
    done.set()
    poller.join(60)
    assert not errors, errors[:3]
    statuses = sorted(status for status, _, _ in results)
    slowest = max(seconds for _, seconds, _ in results)
    print(f"\n40 at once: {statuses.count(504)} ran to their deadline (504), {statuses.count(429)} answered 429; "
          f"slowest answer {slowest:.2f} s; /api/v2/version: {len(latencies)} calls, slowest {max(latencies):.2f} s")
    assert len(results) == 40 and set(statuses) <= {429, 504}, statuses
    assert 1 <= statuses.count(504) <= 2 * CONCURRENCY
    assert slowest <= DEADLINE + SLACK
    assert all(int(headers["Retry-After"]) >= 1 for status, _, headers in results if status == 429)
    assert len(latencies) >= 10 and max(latencies) < VERSION_BOUND, latencies
    # the slots are given back: a plain validation runs
    response, _ = api.upload("data.json", SAMPLE.read_bytes(), "application/json")
    assert response.status_code == 200 and response.json()["records"] == 4, response.text
