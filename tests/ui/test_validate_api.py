"""POST /harvester/api/validate, served by the real Airflow api-server app with the simple auth
manager (real users, real tokens): who may (whoever may edit a harvest DAG; readers too with
HARVESTER_VALIDATE_READERS, which the other tests set, as the viewer), the report of a catalogue,
and the guards of a URL a caller may name (schemes, inward addresses, redirects, sizes, media types)."""
from __future__ import annotations

import json
import uuid

import pytest

from harvester.pipeline.validate import validate_path
from harvester.testing.dcat_portal import DcatServer
from harvester.testing.samples import dcat_samples_dir

PATH = "/harvester/api/validate"
PASSWORDS = {"admin": "admin-pw-1", "viewer": "viewer-pw-2", "op": "op-pw-3", "editor": "editor-pw-4"}
SAMPLE = dcat_samples_dir() / "dcat-us" / "dcatus3_0.json"  # 4 datasets, 1 failed, 3 with warnings
TURTLE = dcat_samples_dir() / "dcat-ap" / "ckanext-dcat" / "dataset_gob_es.ttl"


@pytest.fixture(scope="module")
def client(airflow_db, tmp_path_factory):
    from fastapi.testclient import TestClient

    from airflow.api_fastapi.app import create_app, purge_cached_app

    mp = pytest.MonkeyPatch()
    passwords = tmp_path_factory.mktemp("validate-api") / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    mp.setenv("AIRFLOW__CORE__AUTH_MANAGER",
              "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,viewer:viewer,op:op,editor:user")
    portals = passwords.parent / "portals.yaml"  # who may validate: whoever may edit one of its DAGs
    portals.write_text("portals:\n  - {name: national, url: 'https://data.example.org'}\n")
    mp.setenv("HARVESTER_PORTALS_FILE", str(portals))
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", uuid.uuid4().hex * 2)
    purge_cached_app()
    try:
        with TestClient(create_app()) as test_client:
            yield test_client
    finally:
        purge_cached_app()
        mp.undo()


@pytest.fixture(scope="module")
def headers(client):
    response = client.post("/auth/token", json={"username": "viewer", "password": PASSWORDS["viewer"]})
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


@pytest.fixture
def catalogue():
    with DcatServer() as server:
        server.set_document("/data.json", SAMPLE.read_bytes())
        yield server


@pytest.fixture(autouse=True)
def readers_allowed(monkeypatch):
    """The viewer's requests below are let in by HARVESTER_VALIDATE_READERS (off by default)."""
    monkeypatch.setenv("HARVESTER_VALIDATE_READERS", "true")


@pytest.fixture
def private_allowed(monkeypatch):
    monkeypatch.setenv("HARVESTER_VALIDATE_ALLOW_PRIVATE", "true")


def detail(response) -> str:
    return json.dumps(response.json()["detail"])


# -- who may -------------------------------------------------------------------------------------------------
def test_no_token_401_and_a_user_without_the_view_403(client, catalogue):
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    response = client.post(PATH, json={"url": catalogue.url("/data.json")})
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="nobody", role=None))
    response = client.post(PATH, json={"url": catalogue.url("/data.json")},
                           headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 403 and "nobody may not read the Harvester view" in response.text
    response = client.post(PATH, files={"file": ("data.json", SAMPLE.read_bytes(), "application/json")},
                           headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 403
    assert catalogue.requests == []


def test_by_default_only_a_user_who_may_edit_a_harvest_dag_may_validate(client, tokens, catalogue, monkeypatch,
                                                                           tmp_path):
    """It makes the server fetch URLs of the caller's choosing: a viewer is refused (before the
    body is read, nothing fetched) unless HARVESTER_VALIDATE_READERS opens it to readers."""
    monkeypatch.delenv("HARVESTER_VALIDATE_READERS")
    upload = {"files": {"file": ("data.json", SAMPLE.read_bytes(), "application/json")}}
    refused = {"detail": "viewer may not edit any harvest DAG (harvest_national): the Harvester's write routes "
                         "need edit access (PUT) to at least one"}
    for request in ({"json": {"url": catalogue.url("/data.json")}}, upload, {"json": {}},
                    {"content": b"{not json", "headers": {"Content-Type": "application/json"}}):
        headers = {**request.get("headers", {}), "Authorization": f"Bearer {tokens['viewer']}"}
        response = client.post(PATH, headers=headers, **{k: v for k, v in request.items() if k != "headers"})
        assert (response.status_code, response.json()) == (403, refused), (request, response.text)
    assert catalogue.requests == []
    for user in ("editor", "op", "admin"):  # User, Op, Admin: as before
        response = client.post(PATH, headers={"Authorization": f"Bearer {tokens[user]}"}, **upload)
        assert response.status_code == 200 and response.json()["records"] == 4, (user, response.text)
        response = client.post(PATH, json={}, headers={"Authorization": f"Bearer {tokens[user]}"})
        assert response.status_code == 422 and "url" in detail(response)

    # with no portal in portals.yaml: edit access to DAGs as such
    empty = tmp_path / "portals.yaml"
    empty.write_text("portals: []\n")
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(empty))
    response = client.post(PATH, headers={"Authorization": f"Bearer {tokens['viewer']}"}, **upload)
    assert (response.status_code, response.json()) == (403, {
        "detail": "viewer may not edit DAGs: with no portal in portals.yaml, the Harvester's write routes need "
                  "edit access (PUT) to DAGs"})
    assert client.post(PATH, headers={"Authorization": f"Bearer {tokens['editor']}"}, **upload).status_code == 200

    monkeypatch.setenv("HARVESTER_VALIDATE_READERS", "true")
    response = client.post(PATH, headers={"Authorization": f"Bearer {tokens['viewer']}"}, **upload)
    assert response.status_code == 200 and response.json()["records"] == 4
    monkeypatch.setenv("HARVESTER_VALIDATE_READERS", "sometimes")
    response = client.post(PATH, headers={"Authorization": f"Bearer {tokens['viewer']}"}, **upload)
    assert (response.status_code, response.json()) == (503, {
        "detail": "validation is misconfigured: HARVESTER_VALIDATE_READERS='sometimes' is neither on nor off; "
                  "use one of on, true, yes, 1 or one of off, false, no, 0"})
    assert client.post(PATH, **upload).status_code == 401


# -- the report ----------------------------------------------------------------------------------------------
def test_the_report_of_a_catalogue_served_locally(client, headers, catalogue, private_allowed):
    expected = validate_path(SAMPLE)
    response = client.post(PATH, json={"url": catalogue.url("/data.json")}, headers=headers)
    assert response.status_code == 200, response.text
    report = response.json()
    assert (report["source"], report["kind"]) == (catalogue.url("/data.json"), "dcat-json")
    assert report["groups"] == expected.groups and report["rows"] == expected.rows
    assert (report["records"], report["failed"], report["warned"]) == (4, 1, 3)
    assert report["rows_total"] == len(expected.rows)
    assert report["guessed"].startswith("dcat-json")

    told = client.post(PATH, json={"url": catalogue.url("/data.json"), "type": "dcat-json"}, headers=headers).json()
    assert told["groups"] == expected.groups and told["guessed"] is None


def test_the_report_of_an_upload(client, headers):
    expected = validate_path(SAMPLE)
    response = client.post(PATH, files={"file": ("data.json", SAMPLE.read_bytes(), "application/json")},
                           headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["groups"] == expected.groups and response.json()["source"] == "data.json"
    turtle = client.post(PATH, files={"file": ("catalog.ttl", TURTLE.read_bytes(), "text/turtle")},
                         headers=headers)
    assert turtle.status_code == 200 and turtle.json()["kind"] == "dcat-rdf"
    assert turtle.json()["groups"] == validate_path(TURTLE).groups
    # text/plain: only with a type
    plain = client.post(PATH, files={"file": ("data.txt", SAMPLE.read_bytes(), "text/plain")},
                        data={"type": "dcat-json"}, headers=headers)
    assert plain.status_code == 200 and plain.json()["groups"] == expected.groups


def test_the_rows_shown_are_capped(client, headers):
    big = dcat_samples_dir() / "dcat-us" / "dcatus_with_none.json"
    expected = validate_path(big)
    document = json.loads(big.read_bytes())
    many = {**document, "dataset": [{**e, "identifier": f"{e.get('identifier')}-{n}"}
                                    for n in range(3) for e in document["dataset"]]}
    response = client.post(PATH, files={"file": ("many.json", json.dumps(many).encode(), "application/json")},
                           headers=headers)
    assert response.status_code == 200
    report = response.json()
    assert report["rows_total"] == 3 * len(expected.rows) > 1000 and len(report["rows"]) == 1000


def test_not_a_catalogue_is_422(client, headers):
    page = b"<!DOCTYPE html><html><body>hello</body></html>"
    response = client.post(PATH, files={"file": ("page.xml", page, "application/xml")}, headers=headers)
    assert response.status_code == 422 and "not readable as a DCAT catalogue" in detail(response)
    response = client.post(PATH, files={"file": ("x.json", b'{"title": "no datasets"}', "application/json")},
                           headers=headers)
    assert response.status_code == 422 and "no 'dataset' array" in detail(response)


# -- guards ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("host,address,why", [
    ("127.0.0.1", "127.0.0.1", "loopback"), ("localhost", "127.0.0.1", "loopback"),
    ("10.20.30.40", "10.20.30.40", "private"), ("169.254.169.254", "169.254.169.254", "link-local"),
    ("[::1]", "::1", "loopback"),
])
def test_inward_addresses_are_refused_before_any_request(client, headers, catalogue, host, address, why):
    port = catalogue.base_url.rsplit(":", 1)[1]
    response = client.post(PATH, json={"url": f"http://{host}:{port}/data.json"}, headers=headers)
    assert response.status_code == 422, response.text
    text = detail(response)
    assert host.strip("[]") in text and why in text and "HARVESTER_VALIDATE_ALLOW_PRIVATE" in text
    assert address in text or (host == "localhost" and "::1" in text)
    assert catalogue.requests == []


def test_a_redirect_to_loopback_is_refused(client, headers, catalogue):
    """With private addresses refused, every loopback URL is refused before any request: a server
    that would redirect inward is never asked (the hop itself: tests/pipeline/test_validate.py)."""
    response = client.post(PATH, json={"url": catalogue.url("/data.json"), "type": "dcat-json"}, headers=headers)
    assert response.status_code == 422 and "loopback" in detail(response)
    assert catalogue.requests == []


def test_only_http_urls(client, headers):
    for url, scheme in (("file:///etc/passwd", "file:"), ("ftp://example.org/data.json", "ftp:"),
                        ("gopher://example.org/", "gopher:")):
        response = client.post(PATH, json={"url": url}, headers=headers)
        assert response.status_code == 422 and f"not {scheme}" in detail(response), response.text


def test_bad_parameters_are_422(client, headers):
    for body, named in (({}, "url"), ({"url": "https://example.org", "type": "socrata"}, "type"),
                        ({"url": "https://example.org", "pages": 0}, "pages"),
                        ({"url": "https://example.org", "pages": "3"}, "pages")):
        response = client.post(PATH, json=body, headers=headers)
        assert response.status_code == 422 and named in detail(response), (body, response.text)


def test_an_upload_over_the_limit_is_413(client, headers, monkeypatch):
    monkeypatch.setenv("HARVESTER_VALIDATE_MAX_BYTES", "1kB")
    data = SAMPLE.read_bytes()
    assert len(data) > 1024
    response = client.post(PATH, files={"file": ("data.json", data, "application/json")}, headers=headers)
    assert response.status_code == 413 and "1kB" in detail(response)
    # announced by its Content-Length, far over: refused before it is read
    huge = b'{"dataset": [' + b" " * (300 * 1024) + b"]}"
    response = client.post(PATH, files={"file": ("data.json", huge, "application/json")}, headers=headers)
    assert response.status_code == 413 and "HARVESTER_VALIDATE_MAX_BYTES" in detail(response)
    monkeypatch.setenv("HARVESTER_VALIDATE_MAX_BYTES", "64kB")
    assert client.post(PATH, files={"file": ("data.json", data, "application/json")},
                       headers=headers).status_code == 200


def test_a_fetched_body_over_the_limit_is_413(client, headers, catalogue, private_allowed, monkeypatch):
    monkeypatch.setenv("HARVESTER_VALIDATE_MAX_BYTES", "1kB")
    response = client.post(PATH, json={"url": catalogue.url("/data.json")}, headers=headers)
    assert response.status_code == 413 and "1kB" in detail(response)


def test_media_types(client, headers):
    for media in ("image/png", "text/html", "application/pdf"):
        response = client.post(PATH, files={"file": ("x", SAMPLE.read_bytes(), media)}, headers=headers)
        assert response.status_code == 415 and media in detail(response), response.text
    response = client.post(PATH, files={"file": ("data.txt", SAMPLE.read_bytes(), "text/plain")}, headers=headers)
    assert response.status_code == 415 and "text/plain" in detail(response) and "type" in detail(response)
    response = client.post(PATH, content=b"url=https://example.org", headers={
        **headers, "Content-Type": "application/x-www-form-urlencoded"})
    assert response.status_code == 415 and "application/x-www-form-urlencoded" in detail(response)


# -- bounds (issue 35): each validation a child process, its rows capped, its memory limited -------------------
def test_a_5mb_data_json_of_broken_entries_is_counted_exactly_in_bounded_memory(client, headers, monkeypatch):
    """5 MB of broken entries (a duplicate identifier each): 275,940 rows. The answer counts every one
    of them and shows the first 1000; the child that validated them kept 1000 (the old code kept all,
    151 MB; {} entries, 3.5 M rows, took 632 MB) and said its peak memory."""
    from harvester.testing.hostile_documents import broken_data_json

    monkeypatch.setenv("HARVESTER_VALIDATE_TIMEOUT_SECS", "120")
    document = broken_data_json(5 * 1024 * 1024, b'{"identifier":"a"}')
    response = client.post(PATH, files={"file": ("data.json", document, "application/json")}, headers=headers)
    assert response.status_code == 200, response.text
    report = response.json()
    entries = document.count(b"{") - 1
    assert (report["records"], report["failed"], report["rows_total"]) == (entries, entries, entries)
    assert {g["code"]: g["count"] for g in report["groups"]} == {"no-title": 1, "duplicate-identifier": entries - 1}
    assert len(report["rows"]) == 1000 and report["rows"][-1]["position"] == 1000
    peak = int(response.headers["X-Validation-Peak-Memory"])
    assert peak < 100 * 1024 * 1024, f"the validation's child peaked at {peak / 2 ** 20:.0f} MB"
    assert float(response.headers["X-Validation-Seconds"]) < 120


def test_a_validation_over_its_memory_is_413_naming_the_setting(client, headers, monkeypatch):
    """11 MB of CKAN packages parse into some 200 MB: with HARVESTER_VALIDATE_MAX_MEMORY=150MB the
    child stops at its limit (RLIMIT_AS), and the answer says which setting it met."""
    monkeypatch.setenv("HARVESTER_VALIDATE_MAX_MEMORY", "150MB")
    packages = b"[" + b",".join([b'{"name": "x"}'] * 800_000) + b"]"
    response = client.post(PATH, files={"file": ("packages.json", packages, "application/json")},
                           data={"type": "ckan"}, headers=headers)
    assert response.status_code == 413, response.text
    assert "HARVESTER_VALIDATE_MAX_MEMORY (150MB)" in detail(response)
    assert int(response.headers["X-Validation-Peak-Memory"]) <= 150 * 1024 * 1024
    monkeypatch.setenv("HARVESTER_VALIDATE_MAX_MEMORY", "banana")
    response = client.post(PATH, files={"file": ("data.json", SAMPLE.read_bytes(), "application/json")},
                           headers=headers)
    assert response.status_code == 503 and "HARVESTER_VALIDATE_MAX_MEMORY='banana'" in detail(response)


def test_a_json_request_nested_too_deep_is_422_not_500(client, headers):
    body = b'{"url": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    response = client.post(PATH, content=body, headers={**headers, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert "nests deeper than a request naming a URL ever does" in detail(response)
