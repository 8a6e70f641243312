"""The demo CKAN portal over real HTTP: CKAN's wire format, the Solr subset, faults, the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests

from harvester.testing.ckan_portal import DemoPortal, load_jsonl, parse_solr_date, record_ms
from harvester.testing.samples import sample_path, samples_dir

REPO = Path(__file__).resolve().parents[2]
SAMPLES = samples_dir()
DATA_GOV = sample_path("catalog-data-gov.jsonl")
DKAN = sample_path("dkan-hauts-de-france.jsonl")



def get(portal, action, **params):
    return requests.get(f"{portal.base_url}/api/3/action/{action}", params=params, timeout=10)


def search(portal, **params):
    r = get(portal, "package_search", **params)
    assert r.status_code == 200, r.text[:500]
    return r.json()["result"]


def ids_of(result):
    return {r["id"] for r in result["results"]}


def ms(value):
    return record_ms(value)


def utc_ms(*args):
    return record_ms(datetime(*args, tzinfo=timezone.utc).isoformat())


# -- CKAN's wire format --------------------------------------------------------------------------
def test_package_search_envelope_is_ckans(gc_portal, gc_records):
    real = json.loads((SAMPLES / "package_search-response-birmingham.json").read_text())
    r = get(gc_portal, "package_search")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/json;charset=utf-8"
    body = r.json()
    assert list(body) == list(real) == ["help", "success", "result"]
    assert list(body["result"]) == list(real["result"]) == ["count", "sort", "facets", "results", "search_facets"]
    assert body["help"] == f"{gc_portal.base_url}/api/3/action/help_show?name=package_search"
    assert body["success"] is True
    res = body["result"]
    assert res["count"] == len(gc_records) == 489
    assert res["sort"] == real["result"]["sort"] == "score desc, metadata_modified desc"
    assert len(res["results"]) == 10  # CKAN's default rows
    assert res["facets"] == {} and res["search_facets"] == {}
    # records are served verbatim
    by_id = {r["id"]: r for r in gc_records}
    assert all(rec == by_id[rec["id"]] for rec in res["results"])


def test_sort_on_several_keys(gc_portal, gc_records):
    asc = search(gc_portal, sort="metadata_modified asc, id asc", rows=1000)
    expected = sorted(gc_records, key=lambda r: (ms(r["metadata_modified"]), r["id"]))
    assert [r["id"] for r in asc["results"]] == [r["id"] for r in expected]
    assert asc["sort"] == "metadata_modified asc, id asc"
    desc = search(gc_portal, sort="metadata_modified desc, id desc", rows=1000)
    assert [r["id"] for r in desc["results"]] == [r["id"] for r in reversed(expected)]
    by_name = search(gc_portal, sort="name asc", rows=5)
    assert [r["name"] for r in by_name["results"]] == sorted(r["name"] for r in gc_records)[:5]


def test_rows_default_cap_and_start():
    with DemoPortal(files=[DATA_GOV]) as p:
        assert search(p, rows=5000)["count"] == 1235
        assert len(search(p, rows=5000)["results"]) == 1000  # ckan.search.rows_max
        assert len(search(p, rows=10, start=1230)["results"]) == 5
        assert search(p, rows=0)["results"] == []
        assert search(p, start=5000)["results"] == []


def test_q_all_empty_and_free_text(gc_portal, gc_records):
    assert search(gc_portal, q="*:*")["count"] == 489
    assert search(gc_portal, q="")["count"] == 489
    word = "Canada"
    hits = search(gc_portal, q=word, rows=1000)
    assert 0 < hits["count"] < 489
    assert all(word.lower() in json.dumps(r, ensure_ascii=False).lower() for r in hits["results"])


# -- fq: the Solr subset -------------------------------------------------------------------------
@pytest.mark.parametrize("fq, keep", [
    ("metadata_modified:[2013-06-17T11:50:00Z TO *]", lambda m: m >= utc_ms(2013, 6, 17, 11, 50)),
    ("metadata_modified:[2013-06-14T00:00:00Z TO 2013-06-15T00:00:00Z]",
     lambda m: utc_ms(2013, 6, 14) <= m <= utc_ms(2013, 6, 15)),
    ("metadata_modified:{2013-06-14T00:00:00Z TO 2013-06-15T00:00:00Z}",
     lambda m: utc_ms(2013, 6, 14) < m < utc_ms(2013, 6, 15)),
    ("metadata_modified:[* TO 2013-05-20T00:00:00Z}", lambda m: m < utc_ms(2013, 5, 20)),
    # 2013-06-17T15:32:05.305546 is 15:32:05.305 for Solr (millisecond precision)
    ("metadata_modified:[2013-06-17T15:32:05.305Z TO *]", lambda m: m >= utc_ms(2013, 6, 17, 15, 32, 5, 305000)),
    ("metadata_modified:{2013-06-17T15:32:05.305Z TO *]", lambda m: m > utc_ms(2013, 6, 17, 15, 32, 5, 305000)),
    ("metadata_modified:[2013-06-17T15:32:05.306Z TO *]", lambda m: m > utc_ms(2013, 6, 17, 15, 32, 5, 305000)),
    ("metadata_modified:[2013-06-14T12:00:00.5Z TO *]", lambda m: m >= utc_ms(2013, 6, 14, 12, 0, 0, 500000)),
    ("metadata_modified:[NOW-100YEARS TO NOW]", lambda m: True),
    ("metadata_modified:[NOW/DAY TO *]", lambda m: False),
    ("metadata_modified:[2013-06-14T00:00:00Z TO *] AND metadata_modified:[* TO 2013-06-14T00:00:00Z+1DAY]",
     lambda m: utc_ms(2013, 6, 14) <= m <= utc_ms(2013, 6, 15)),
])
def test_fq_date_ranges(gc_portal, gc_records, fq, keep):
    expected = {r["id"] for r in gc_records if keep(ms(r["metadata_modified"]))}
    got = search(gc_portal, fq=fq, rows=1000)
    assert got["count"] == len(expected)
    assert ids_of(got) == expected


def test_space_separated_zoneless_timestamp_is_utc():
    with DemoPortal(files=[DKAN]) as p:  # metadata_modified "2019-09-30 22:00:00"
        assert search(p, fq="metadata_modified:[2019-09-30T22:00:00Z TO 2019-09-30T22:00:00Z]")["count"] == 1
        assert search(p, fq="metadata_modified:{2019-09-30T22:00:00Z TO *]")["count"] == 0
        assert search(p, fq="metadata_modified:[2019-09-30T21:59:59.999Z TO *]")["count"] == 1


def test_fq_terms_and_boolean_operators():
    records = load_jsonl(DATA_GOV)
    with DemoPortal(records=records) as p:
        n_dataset = sum(1 for r in records if r["type"] == "dataset")
        assert search(p, fq="type:dataset")["count"] == n_dataset
        assert search(p, fq="-type:dataset")["count"] == len(records) - n_dataset
        assert search(p, fq="type:(dataset OR harvest)")["count"] == len(records)
        one = records[100]
        assert ids_of(search(p, fq=f"id:{one['id']}")) == {one["id"]}
        assert ids_of(search(p, fq=f'name:"{one["name"]}"')) == {one["id"]}
        assert ids_of(search(p, fq=f"+type:{one['type']} +id:{one['id']}")) == {one["id"]}
        assert search(p, fq=f"type:dataset AND id:{one['id']}")["count"] == (one["type"] == "dataset")
        both = f"id:{records[0]['id']} OR id:{records[1]['id']}"
        assert ids_of(search(p, fq=both)) == {records[0]["id"], records[1]["id"]}
        mm = records[600]["metadata_modified"]
        combined = search(p, fq=f"type:harvest AND metadata_modified:[{mm[:19]}Z TO *]", rows=1000)
        assert ids_of(combined) == {r["id"] for r in records
                                    if r["type"] == "harvest" and ms(r["metadata_modified"]) >= ms(mm[:19])}


SEARCH_ERROR_NO_Z = (
    "Search error: 'SOLR returned an error running query: {\\'q\\': \\'*:*\\', \\'fq\\': "
    "[\\'metadata_modified:[2013-06-17T11:50:00 TO *]\\', \\'+site_id:\"default\"\\', \\'+state:active\\'], "
    "\\'rows\\': 11, \\'sort\\': \\'score desc, metadata_modified desc\\', \\'start\\': 0, \\'facet\\': \\'true\\', "
    "\\'facet.limit\\': \\'50\\', \\'facet.mincount\\': 1, \\'fl\\': \\'id validated_data_dict\\', \\'wt\\': "
    "\\'json\\', \\'df\\': \\'text\\', \\'q.op\\': \\'AND\\'} Error: SolrError(\"Solr responded with an error "
    "(HTTP 400): [Reason: Invalid Date String:\\'2013-06-17T11:50:00\\']\")'"
)


def test_unparseable_fq_gets_ckans_search_error(gc_portal):
    r = get(gc_portal, "package_search", fq="metadata_modified:[2013-06-17T11:50:00 TO *]")
    assert r.status_code == 409
    assert r.json() == {
        "help": f"{gc_portal.base_url}/api/3/action/help_show?name=package_search",
        "success": False,
        "error": {"__type": "Search Error", "message": SEARCH_ERROR_NO_Z},
    }


@pytest.mark.parametrize("fq, reason", [
    ("metadata_modified:[2013-06-17T11:50:00Z TO", "Cannot parse 'metadata_modified:[2013-06-17T11:50:00Z TO'"),
    # unescaped colons: Solr reads the term "2013-06-17T11", like a real Solr does
    ("metadata_modified:2013-06-17T11:50:00Z", "Invalid Date String:'2013-06-17T11'"),
    ("metadata_modified:[yesterday TO *]", "Invalid Date String:'yesterday'"),
    ("metadata_modified:[NOW-1FORTNIGHT TO *]", "Invalid Date Math String:'NOW-1FORTNIGHT'"),
    ("(type:dataset", "Cannot parse '(type:dataset'"),
    ('title:"unterminated', "Cannot parse 'title:\"unterminated'"),
])
def test_fq_errors(gc_portal, fq, reason):
    r = get(gc_portal, "package_search", fq=fq)
    assert r.status_code == 409
    err = r.json()["error"]
    assert err["__type"] == "Search Error"
    assert err["message"].startswith("Search error: 'SOLR returned an error running query: {")
    assert reason in err["message"].replace("\\", "")  # the message is a repr() of a repr()


def test_invalid_sort_and_parameters_are_search_query_errors(gc_portal):
    r = get(gc_portal, "package_search", sort="metadata_modified upwards")
    assert r.status_code == 400
    assert r.json()["error"] == {"__type": "Search Query Error",
                                 "message": "Search Query is invalid: 'Invalid \"sort\" parameter'"}
    r = get(gc_portal, "package_search", foo="bar")
    assert r.status_code == 400
    assert r.json()["error"] == {"__type": "Search Query Error",
                                 "message": "Search Query is invalid: \"Invalid search parameters: ['foo']\""}


def test_validation_errors(gc_portal):
    r = get(gc_portal, "package_search", rows="ten")
    assert (r.status_code, r.json()["error"]) == (409, {"rows": ["Invalid integer"], "__type": "Validation Error"})
    r = get(gc_portal, "package_search", start="-1")
    assert (r.status_code, r.json()["error"]) == (409, {"start": ["Must be a natural number"],
                                                        "__type": "Validation Error"})
    r = get(gc_portal, "package_show")
    assert (r.status_code, r.json()["error"]) == (409, {"name_or_id": ["Missing value"],
                                                        "__type": "Validation Error"})


# -- the other actions ---------------------------------------------------------------------------
def test_package_show_by_id_and_name_and_not_found(gc_portal, gc_records):
    rec = gc_records[42]
    for key in (rec["id"], rec["name"]):
        r = get(gc_portal, "package_show", id=key)
        assert r.status_code == 200
        assert r.json()["result"] == rec
    r = get(gc_portal, "package_show", id="no-such-dataset")
    assert r.status_code == 404
    real = json.loads((SAMPLES / "errors" / "http-404-json-not-found-error.json").read_text())
    body = r.json()
    assert body.keys() == real.keys() and body["error"].keys() == real["error"].keys()
    assert body == {"help": f"{gc_portal.base_url}/api/3/action/help_show?name=package_show", "success": False,
                    "error": {"__type": "Not Found Error", "message": "Not found"}}


def test_package_list_and_status_show(gc_portal, gc_records):
    names = sorted(r["name"] for r in gc_records)
    assert get(gc_portal, "package_list").json()["result"] == names
    assert get(gc_portal, "package_list", limit=3, offset=1).json()["result"] == names[1:4]
    status = get(gc_portal, "status_show").json()["result"]
    assert status["ckan_version"] == "2.10.4"
    assert status["site_url"] == gc_portal.base_url


def test_post_json_bad_json_and_unknown_action(gc_portal, gc_records):
    url = f"{gc_portal.base_url}/api/3/action/package_search"
    r = requests.post(url, json={"fq": f"id:{gc_records[0]['id']}", "rows": 1}, timeout=10)
    assert r.status_code == 200 and r.json()["result"]["results"] == [gc_records[0]]
    r = requests.post(url, data=b"{not json", headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 400
    assert r.json() == ("Bad request - JSON Error: Error decoding JSON data. Error: <BadRequest '400: Bad Request'> "
                        "JSON data extracted from the request: {}")
    r = requests.post(url, data=b"[1, 2]", timeout=10)
    assert (r.status_code, r.json()) == (400, "Bad request - JSON Error: Request data JSON decoded to [1, 2] "
                                              "but it needs to be a dictionary.")
    r = get(gc_portal, "package_purge")
    assert (r.status_code, r.json()) == (400, "Bad request - Action name not known: package_purge")
    assert requests.get(f"{gc_portal.base_url}/api/action/status_show", timeout=10).json()["success"] is True


# -- faults --------------------------------------------------------------------------------------
def test_fail_next_serves_real_error_pages_then_recovers(gc_portal):
    page = (SAMPLES / "errors" / "http-500-html.html").read_text(encoding="utf-8")
    gc_portal.fail_next(1, 500)
    gc_portal.fail_next(1, 503)
    r = get(gc_portal, "status_show")
    assert (r.status_code, r.text, r.headers["Content-Type"]) == (500, page, "text/html;charset=utf-8")
    assert "Retry-After" not in r.headers
    r = get(gc_portal, "status_show")
    assert (r.status_code, r.text) == (503, page)
    gc_portal.fail_next(1, 429)
    gc_portal.fail_next(1, 429, retry_after=7)
    r = get(gc_portal, "status_show")
    assert (r.status_code, r.headers["Retry-After"]) == (429, "1")
    assert "429 Too Many Requests" in r.text
    assert get(gc_portal, "status_show").headers["Retry-After"] == "7"
    assert get(gc_portal, "status_show").status_code == 200
    assert [a for a, _ in gc_portal.requests] == ["status_show"] * 5


def test_fail_next_for_one_action(gc_portal):
    gc_portal.fail_next(2, 503, action="package_search")
    assert get(gc_portal, "status_show").status_code == 200
    assert get(gc_portal, "package_search").status_code == 503
    assert get(gc_portal, "package_search").status_code == 503
    assert get(gc_portal, "package_search").status_code == 200


def test_reject_fq_and_outages(gc_portal):
    gc_portal.reject_fq = True
    r = get(gc_portal, "package_search", fq="type:dataset")
    assert r.status_code == 409 and r.json()["error"]["__type"] == "Search Error"
    assert "undefined field metadata_modified" in r.json()["error"]["message"]
    assert get(gc_portal, "package_search").status_code == 200
    gc_portal.reject_fq = False
    gc_portal.fail_actions = {"package_search"}
    assert [get(gc_portal, "package_search").status_code for _ in range(3)] == [500, 500, 500]
    assert get(gc_portal, "status_show").status_code == 200
    gc_portal.fail_actions = {"*": 503}
    assert get(gc_portal, "status_show").status_code == 503
    gc_portal.fail_next(3, 502)
    gc_portal.reject_fq = True
    gc_portal.clear_faults()
    assert get(gc_portal, "status_show").status_code == 200
    assert get(gc_portal, "package_search", fq="type:dataset").status_code == 200


def test_requests_are_recorded_and_hook_runs(gc_portal):
    seen = []
    gc_portal.on_request = lambda action, params: seen.append(action)
    get(gc_portal, "package_search", fq="type:dataset", rows=3)
    requests.post(f"{gc_portal.base_url}/api/3/action/package_show", json={"id": "x"}, timeout=10)
    assert gc_portal.requests == [("package_search", {"fq": "type:dataset", "rows": "3"}),
                                  ("package_show", {"id": "x"})]
    assert seen == ["package_search", "package_show"]
    assert gc_portal.request_headers[-1]["Content-Type"] == "application/json"


# -- a live catalogue ----------------------------------------------------------------------------
def test_live_mutation(gc_portal, gc_records):
    rec = dict(gc_records[0], metadata_modified="2030-01-01T00:00:00.000001", title="changed")
    gc_portal.upsert_record(rec)
    last = search(gc_portal, sort="metadata_modified desc", rows=1)["results"][0]
    assert last == rec
    assert search(gc_portal)["count"] == 489
    new = dict(gc_records[1], id="11111111-2222-3333-4444-555555555555", name="a-new-one")
    gc_portal.upsert_record(new)
    assert search(gc_portal)["count"] == 490
    assert gc_portal.remove_record(new["id"]) is True
    assert gc_portal.remove_record(new["id"]) is False
    assert get(gc_portal, "package_show", id=new["id"]).status_code == 404
    gc_portal.set_records(gc_records[:3])
    assert search(gc_portal)["count"] == 3


def test_a_record_without_id_is_served_as_is(gc_records):
    broken = {k: v for k, v in gc_records[0].items() if k != "id"}
    with DemoPortal(records=[broken, gc_records[1]]) as p:
        res = search(p, sort="metadata_modified asc, id asc")
        assert res["count"] == 2 and broken in res["results"]


def test_concurrent_mutation_and_search(gc_portal, gc_records):
    stop = threading.Event()
    errors = []

    def mutate():
        i = 0
        while not stop.is_set():
            gc_portal.upsert_record(dict(gc_records[i % 50], metadata_modified=f"2031-01-01T00:00:{i % 60:02d}"))
            i += 1
            time.sleep(0.002)

    t = threading.Thread(target=mutate)
    t.start()
    try:
        for _ in range(10):
            res = search(gc_portal, fq="metadata_modified:[2013-01-01T00:00:00Z TO *]", rows=1000,
                         sort="metadata_modified asc, id asc")
            if res["count"] != 489 or len(res["results"]) != 489:
                errors.append(res["count"])
    finally:
        stop.set()
        t.join()
    assert errors == []


def test_hide_inactive_emulates_ckan_visibility(gc_records):
    active = [r for r in gc_records if r["state"] == "active" and not r["private"]]
    deleted = next(r for r in gc_records if r["state"] == "deleted")
    with DemoPortal(records=gc_records, hide_inactive=True) as p:
        assert search(p)["count"] == len(active) == 434
        assert search(p, include_deleted="true")["count"] == 434 + 32
        assert search(p, include_drafts="true", include_deleted="true")["count"] == 489
        assert len(get(p, "package_list").json()["result"]) == 434
        r = get(p, "package_show", id=deleted["id"])
        assert r.status_code == 403
        assert r.json()["error"] == {"__type": "Authorization Error",
                                     "message": f"Access denied: User  not authorized to read package {deleted['id']}"}


# -- helpers -------------------------------------------------------------------------------------
def test_solr_dates():
    assert parse_solr_date("2013-06-17T11:50:00Z") == utc_ms(2013, 6, 17, 11, 50)
    assert parse_solr_date("2013-06-17T11:50:00.123Z") == utc_ms(2013, 6, 17, 11, 50, 0, 123000)
    assert parse_solr_date("2013-06-17T11:50:00.123999999Z") == utc_ms(2013, 6, 17, 11, 50, 0, 123000)
    now = datetime(2024, 3, 31, 10, 30, tzinfo=timezone.utc)
    assert parse_solr_date("NOW", now) == utc_ms(2024, 3, 31, 10, 30)
    assert parse_solr_date("NOW/DAY", now) == utc_ms(2024, 3, 31)
    assert parse_solr_date("NOW-1MONTH/DAY", now) == utc_ms(2024, 2, 29)
    assert parse_solr_date("NOW+2HOURS", now) == utc_ms(2024, 3, 31, 12, 30)
    assert record_ms("2019-09-30 22:00:00") == utc_ms(2019, 9, 30, 22)
    assert record_ms("2013-06-17T15:32:05.305546") == utc_ms(2013, 6, 17, 15, 32, 5, 305000)
    assert record_ms("2013-06-17T17:32:05.305546+02:00") == utc_ms(2013, 6, 17, 15, 32, 5, 305000)
    assert record_ms(None) is None and record_ms("soon") is None


def test_cli_prints_base_url_and_serves():
    env = dict(os.environ, PYTHONPATH=str(REPO / "plugins") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "harvester.testing.ckan_portal", "--data", str(DKAN),
                             "--data", str(SAMPLES / "govdata-de.jsonl"), "--port", "0"],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("http://127.0.0.1:")
        r = requests.get(f"{line}/api/3/action/package_search", timeout=10)
        assert r.json()["result"]["count"] == 2
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


# -- fl ----------------------------------------------------------------------------------------------
def test_fl_returns_only_those_fields_with_solr_dates(gc_portal, gc_records):
    result = search(gc_portal, fl="id,metadata_modified", sort="metadata_modified asc, id asc", rows=1000)
    assert result["count"] == len(gc_records) and all(set(r) == {"id", "metadata_modified"} for r in result["results"])
    by_id = {r["id"]: r for r in gc_records}
    for doc in result["results"]:
        assert ms(doc["metadata_modified"]) == ms(by_id[doc["id"]]["metadata_modified"])
        assert doc["metadata_modified"].endswith("Z")
    assert search(gc_portal, fl="id metadata_modified", rows=3)["results"] == search(
        gc_portal, fl="id,metadata_modified", rows=3)["results"]
    # like CKAN: fl=id alone gives bare ids
    assert all(isinstance(x, str) for x in search(gc_portal, fl="id", rows=5)["results"])


def test_solr_date_text_drops_a_zero_fraction():
    from harvester.testing.ckan_portal import _solr_date_text

    assert _solr_date_text(utc_ms(2013, 6, 17, 11, 32, 5)) == "2013-06-17T11:32:05Z"
    assert _solr_date_text(utc_ms(2013, 6, 17, 11, 32, 5, 300000)) == "2013-06-17T11:32:05.300Z"


def test_ignore_fl_and_ignore_fq(gc_portal, gc_records):
    gc_portal.ignore_fl = True
    assert search(gc_portal, fl="id,metadata_modified", rows=2)["results"][0]["title"]
    gc_portal.ignore_fq = True
    assert search(gc_portal, fq=f'id:"{gc_records[0]["id"]}"', rows=0)["count"] == len(gc_records)
    gc_portal.clear_faults()
    assert search(gc_portal, fq=f'id:"{gc_records[0]["id"]}"', rows=0)["count"] == 1


def test_private_records_only_for_the_right_token(gc_records):
    private = dict(gc_records[0], private=True)
    with DemoPortal(records=[private] + gc_records[1:]) as p:
        assert search(p)["count"] == 489  # no tokens set: every record as given
        p.api_tokens = {"tok-1"}

        def count(headers=None, **params):
            r = requests.get(f"{p.base_url}/api/3/action/package_search", params=params, headers=headers, timeout=10)
            return r.json()["result"]["count"]

        assert count() == count(include_private="true") == 488
        assert count({"Authorization": "tok-2"}, include_private="true") == 488
        assert count({"Authorization": "tok-1"}) == 488  # CKAN: only when asked for
        assert count({"Authorization": "tok-1"}, include_private="true") == 489
        show = f"{p.base_url}/api/3/action/package_show"
        assert requests.get(show, params={"id": private["id"]}, timeout=10).status_code == 403
        r = requests.get(show, params={"id": private["id"]}, headers={"Authorization": "tok-1"}, timeout=10)
        assert r.json()["result"]["private"] is True
        assert len(get(p, "package_list").json()["result"]) == 488


def test_fail_next_with_a_body(gc_portal):
    gc_portal.fail_next(1, 200)
    r = get(gc_portal, "status_show")
    assert (r.status_code, r.headers["Content-Type"], r.text) == (
        200, "text/html;charset=utf-8", "<html><body><h1>HTTP 200</h1></body></html>")
    gc_portal.fail_next(1, 200, body='{"success": tr')
    r = get(gc_portal, "status_show")
    assert (r.headers["Content-Type"], r.text) == ("application/json;charset=utf-8", '{"success": tr')
    gc_portal.fail_next(1, 403, body={"success": False})
    r = get(gc_portal, "status_show")
    assert (r.status_code, r.json()) == (403, {"success": False})
    assert get(gc_portal, "status_show").json()["success"] is True
