"""Validating a catalogue without harvesting it (harvester.pipeline.validate): the same groups a
harvest's first run writes, computed here straight from each source's own parsing of the sample;
and the guarded fetching the API relies on (addresses, redirects, size, kinds)."""
from __future__ import annotations

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from harvester.domain import outcomes as oc
from harvester.domain.dataset import normalize
from harvester.http import guard
from harvester.pipeline import validate as v
from harvester.sources import SourceError, dcat_json, dcat_rdf
from harvester.testing.dcat_portal import DcatServer
from harvester.testing.local_http import LocalServer
from harvester.testing.samples import dcat_samples_dir, load_samples

DCAT_US = sorted((dcat_samples_dir() / "dcat-us").rglob("*.json"))
DCAT_AP = sorted(p for p in (dcat_samples_dir() / "dcat-ap").rglob("*") if p.is_file() and p.suffix != ".md")


# -- what a harvest's first run writes, computed from the source's own records -------------------------
def expected(records) -> tuple[list[dict], list[dict]]:
    """(groups, rows) of records in listing order: a Failed record's problems, a stored one's warnings."""
    rows = []
    for position, record in enumerate(records, 1):
        for ordinal, item in enumerate(record.reported()):
            if record.error is None and item.severity != oc.WARNING:
                continue
            rows.append({"position": position, "source_id": record.source_id, "ordinal": ordinal,
                         "stage": item.stage, "severity": item.severity, "code": item.code, "field": item.field,
                         "value": item.value, "message": item.message})
    return [g.as_dict() for g in oc.group(rows)], rows


def dcat_json_records(path: Path) -> list:
    with path.open("rb") as fp:
        return list(dcat_json.iter_records(fp, path.resolve().as_uri()))


def dcat_rdf_records(path: Path) -> list:
    uri = path.resolve().as_uri()

    def fetch(url):
        assert url == uri, f"only the document itself is read, not {url}"
        return path.read_bytes(), ""

    return [r for page in dcat_rdf.iter_pages(uri, fetch, max_pages=1) for r in page]


def check_same(report: v.Report, records) -> None:
    groups, rows = expected(records)
    assert report.groups == groups
    assert report.rows == rows
    assert report.records == len(records)
    assert report.failed == sum(r.error is not None for r in records)


def test_the_samples_include_broken_ones_of_both_kinds():
    broken_us = [p for p in DCAT_US if any(not r.ok for r in _or_empty(dcat_json_records, p))]
    broken_ap = [p for p in DCAT_AP if any(r.reported() for r in _or_empty(dcat_rdf_records, p))]
    assert len(broken_us) >= 8 and len(broken_ap) >= 5, (broken_us, broken_ap)


def _or_empty(read, path):
    try:
        return read(path)
    except (SourceError, ValueError, AssertionError):
        return []


@pytest.mark.parametrize("path", DCAT_US, ids=lambda p: p.name)
def test_dcat_us_samples_give_the_groups_of_their_records(path):
    try:
        records = dcat_json_records(path)
    except dcat_json.InvalidCatalogue:
        with pytest.raises(dcat_json.InvalidCatalogue):
            v.validate_path(path)
        return
    report = v.validate_path(path)
    assert (report.kind, report.guessed) == ("dcat-json", report.guessed) and report.guessed.startswith("dcat-json")
    check_same(report, records)
    # told the kind, the same
    check_same(v.validate_path(path, "dcat-json"), records)


@pytest.mark.parametrize("path", DCAT_AP, ids=lambda p: p.name)
def test_dcat_ap_samples_give_the_groups_of_their_records(path):
    policy = v.FetchPolicy(timeout=5, max_retries=0)  # (a remote JSON-LD context: no network here)
    try:
        records = dcat_rdf_records(path)
    except (SourceError, ValueError, AssertionError):
        with pytest.raises((SourceError, ValueError)):
            v.validate_path(path, fetcher=policy)
        return
    report = v.validate_path(path, fetcher=policy)
    assert report.kind == "dcat-rdf"
    check_same(report, records)


def test_a_gzipped_data_json_is_read(tmp_path):
    source = dcat_samples_dir() / "dcat-us" / "dcatus_with_none.json"
    packed = tmp_path / "data.json.gz"
    packed.write_bytes(gzip.compress(source.read_bytes()))
    report = v.validate_path(packed)
    assert report.kind == "dcat-json" and report.records == 402
    assert report.groups == expected(dcat_json_records(source))[0]
    assert report.failed > 0


# -- CKAN documents -----------------------------------------------------------------------------------------
def broken_ckan_packages() -> list[dict]:
    packages = load_samples("data-gov-au.jsonl")
    packages[1] = {k: val for k, val in packages[1].items() if k != "id"}
    packages[3] = {**packages[3], "metadata_modified": "garbage"}
    return packages


def test_ckan_packages_one_a_line_and_a_package_search_answer(tmp_path):
    packages = broken_ckan_packages()
    lines = tmp_path / "packages.jsonl"
    lines.write_text("\n".join(json.dumps(p) for p in packages) + "\n")
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps({"help": "x", "success": True, "result": {"count": len(packages),
                                                                           "results": packages}}))
    for path in (lines, answer):
        report = v.validate_path(path)
        records = [normalize(p, path.resolve().as_uri()) for p in packages]
        assert report.kind == "ckan"
        check_same(report, records)
        codes = {g["code"]: g for g in report.groups}
        assert codes["no-identifier"]["examples"] == ["#2"] and codes["bad-date"]["count"] == 1
        assert report.failed == 2


def test_a_gzipped_upload_is_unpacked_within_the_limit_and_the_deadline():
    packages = broken_ckan_packages()
    packed = gzip.compress("\n".join(json.dumps(p) for p in packages).encode())
    report = v.validate_bytes(packed, "ckan", "dump.jsonl.gz")
    assert report.records == len(packages) and report.failed == 2
    with pytest.raises(v.TooLarge, match="unpacks to more than 1kB"):
        v.validate_bytes(packed, "ckan", "dump.jsonl.gz", fetcher=v.FetchPolicy(max_bytes=1024))
    data = (dcat_samples_dir() / "dcat-us" / "dcatus.json").read_bytes()
    with pytest.raises(v.FetchTimeout):
        v.validate_bytes(gzip.compress(data), "dcat-json", "data.json.gz", fetcher=v.FetchPolicy(deadline=0.0))
    assert v.validate_bytes(gzip.compress(data), "dcat-json", "data.json.gz",
                            fetcher=v.FetchPolicy(deadline=30.0)).records == 7


def test_not_a_catalogue_raises_the_sources_error(tmp_path):
    page = tmp_path / "page.html"
    page.write_text("<!DOCTYPE html><html><body><h1>Welcome</h1></body></html>")
    with pytest.raises(dcat_rdf.RdfParseError):
        v.validate_path(page)
    with pytest.raises(dcat_json.InvalidCatalogue, match="not a valid JSON document"):
        v.validate_path(page, "dcat-json")
    thing = tmp_path / "thing.json"
    thing.write_text(json.dumps({"title": "a JSON object", "items": [1, 2]}))
    with pytest.raises(dcat_json.InvalidCatalogue, match="no 'dataset' array"):
        v.validate_path(thing)
    with pytest.raises(SourceError, match="not a CKAN package_search"):
        v.validate_path(thing, "ckan")
    with pytest.raises(ValueError, match="cannot be validated"):
        v.validate_path(thing, "socrata")


def test_validate_bytes_is_validate_path_of_the_same_document():
    path = dcat_samples_dir() / "dcat-us" / "dcatus_multiple_invalid.json"
    report = v.validate_bytes(path.read_bytes(), None, "catalog.json")
    assert report.source == "catalog.json" and report.kind == "dcat-json"
    assert report.groups == v.validate_path(path).groups and report.failed == 1


def test_the_rows_kept_are_capped_and_the_counts_stay_exact():
    """A validation keeps its first rows (MAX_ROWS by default, issue 35): a data.json of broken
    entries has millions; rows_total and every group count all of them, as oc.group of every row."""
    document = b'{"dataset": [' + b",".join([b"{}"] * 5000 + [b"1"] * 700 + [b'{"identifier": "a"}'] * 300) + b"]}"
    whole = v.validate_bytes(document, "dcat-json", "data.json", max_rows=None)
    assert whole.rows_total == len(whole.rows) == 2 * 5000 + 700 + 300
    kept = v.validate_bytes(document, "dcat-json", "data.json", max_rows=1000)
    assert kept.rows == whole.rows[:1000] and kept.rows_total == whole.rows_total
    assert kept.groups == whole.groups == [g.as_dict() for g in oc.group(whole.rows)]
    assert (kept.records, kept.failed) == (whole.records, whole.failed) == (6000, 6000)
    assert kept.as_dict()["rows_total"] == whole.rows_total and len(kept.as_dict()["rows"]) == 1000
    default = v.validate_bytes(document, "dcat-json", "data.json")
    assert len(default.rows) == v.MAX_ROWS == 10_000 and default.groups == whole.groups

# -- addresses -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("address,why", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("10.1.2.3", "private"), ("192.168.0.7", "private"),
    ("172.16.5.5", "private"), ("fc00::1", "private"), ("169.254.169.254", "link-local (cloud metadata)"),
    ("169.254.1.1", "link-local"), ("fe80::1", "link-local"), ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("240.0.0.1", "reserved"),
    ("::ffff:127.0.0.1", "loopback"), ("100.64.0.1", "not globally routable"),
    ("8.8.8.8", None), ("2606:4700:4700::1111", None),
])
def test_address_refusal(address, why):
    assert guard.address_refusal(address) == why


def test_a_name_that_resolves_inward_is_refused():
    with pytest.raises(guard.AddressRefused) as caught:
        guard.checked_addresses("localhost", 80, allow_private=False)
    assert caught.value.host == "localhost" and caught.value.address in ("127.0.0.1", "::1")
    assert "localhost resolves to" in str(caught.value) and "loopback" in str(caught.value)
    assert guard.checked_addresses("localhost", 80, allow_private=True)


class Redirector(LocalServer):
    """Answers every GET with a redirect to ``target``; or, when ``body`` is set, with it, without a
    Content-Length (the body ends when the connection closes)."""

    name = "redirector"

    def __init__(self):
        self.target: str | None = None
        self.body: bytes | None = None
        self.hits: list[str] = []
        self._lock = threading.Lock()
        super().__init__()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args):
                pass

            def do_GET(self):
                with server._lock:
                    server.hits.append(self.path)
                if server.body is not None:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(server.body)
                    return
                self.send_response(302)
                self.send_header("Location", server.target)
                self.send_header("Content-Length", "0")
                self.end_headers()

        return Handler


@pytest.fixture
def catalogue():
    """A DCAT server with a broken sample at /data.json."""
    with DcatServer() as server:
        sample = dcat_samples_dir() / "dcat-us" / "dcatus_multiple_invalid.json"
        server.set_document("/data.json", sample.read_bytes())
        yield server


@pytest.fixture
def redirector():
    with Redirector() as server:
        yield server


def test_loopback_is_refused_before_any_request(catalogue):
    strict = v.FetchPolicy(allow_private=False, timeout=5)
    for url in (catalogue.url("/data.json"), catalogue.url("/data.json").replace("127.0.0.1", "localhost")):
        with pytest.raises(guard.AddressRefused, match="loopback"):
            v.validate_url(url, "dcat-json", fetcher=strict)
        with pytest.raises(guard.AddressRefused):
            v.validate_url(url, fetcher=strict)  # guessing the kind fetches too: refused as well
    assert catalogue.requests == []


def test_a_redirect_hop_is_checked(catalogue, redirector):
    # The redirector's own address and port are let through; where it sends is not.
    allowed = frozenset({("127.0.0.1", redirector.port)})
    strict = v.FetchPolicy(allow_private=False, timeout=5, allowed=allowed)
    for target in (catalogue.url("/data.json"), catalogue.url("/data.json").replace("127.0.0.1", "localhost")):
        redirector.target = target
        with pytest.raises(guard.AddressRefused, match="loopback") as caught:
            v.validate_url(f"http://127.0.0.1:{redirector.port}/data.json", "dcat-json", fetcher=strict)
        assert caught.value.address in ("127.0.0.1", "::1")
    assert len(redirector.hits) == 2 and catalogue.requests == []
    # allowed: the redirect is followed to the same report as the catalogue's own URL
    redirector.target = catalogue.url("/data.json")
    followed = v.validate_url(f"http://127.0.0.1:{redirector.port}/data.json", "dcat-json",
                              fetcher=v.FetchPolicy(timeout=5))
    assert followed.groups == v.validate_url(catalogue.url("/data.json")).groups and followed.failed == 1


def test_only_http_urls(tmp_path):
    for url, scheme in (("file:///etc/passwd", "file:"), ("ftp://example.org/data.json", "ftp:"),
                        ("gopher://x/", "gopher:")):
        with pytest.raises(v.Refused, match=f"not {scheme}"):
            v.validate_url(url)


def test_a_body_over_the_limit_stops_as_it_streams(redirector, catalogue):
    redirector.body = b'{"dataset": [' + b",".join([b'{"identifier": "x", "title": "t"}'] * 2000) + b"]}"
    url = f"http://127.0.0.1:{redirector.port}/data.json"
    with pytest.raises(v.TooLarge, match="larger than 16kB"):
        v.validate_url(url, "dcat-json", fetcher=v.FetchPolicy(max_bytes=16 * 1024, timeout=5))
    with pytest.raises(v.TooLarge):  # the CKAN and RDF sources read whole answers: counted all the same
        v.validate_url(url, "dcat-rdf", fetcher=v.FetchPolicy(max_bytes=16 * 1024, timeout=5))
    # announced by its Content-Length: refused before the body is read
    with pytest.raises(v.TooLarge, match="bytes, larger than 1kB"):
        v.validate_url(catalogue.url("/data.json"), "dcat-json", fetcher=v.FetchPolicy(max_bytes=1024, timeout=5))
    assert v.validate_url(url, "dcat-json").records == 2000


def test_a_ckan_portal_is_read_for_its_first_pages(portal_server):
    packages = broken_ckan_packages()
    portal_server.set_records(packages)
    report = v.validate_url(portal_server.base_url, pages=2, page_size=2, fetcher=v.FetchPolicy(timeout=10))
    assert report.kind == "ckan" and "status_show" in report.guessed
    assert report.records == 4 and not report.complete
    whole = v.validate_url(portal_server.base_url + "/api/3/action/package_search", "ckan",
                           fetcher=v.FetchPolicy(timeout=10))
    assert whole.records == len(packages) and whole.complete
    assert {g["code"] for g in whole.groups} >= {"no-identifier", "bad-date"} and whole.failed == 2


def test_guessing_kinds():
    assert v.kind_of_name("https://x.org/catalog.ttl") == "dcat-rdf"
    assert v.kind_of_name("dump.jsonl") == "ckan"
    assert v.kind_of_name("https://x.org/api/3/action/package_search?q=a") == "ckan"
    assert v.kind_of_name("https://x.org/data.json") is None
    assert v.sniff(b'{"help": "...", "success": true, "result": {}}') == "ckan"
    assert v.sniff(b'{"@context": "...", "dataset": []}') == "dcat-json"
    assert v.sniff(b'{"@graph": []}') == "dcat-rdf"
    assert v.sniff(b"@prefix dcat: <http://www.w3.org/ns/dcat#> .") == "dcat-rdf"
    assert v.sniff(gzip.compress(b'{"dataset": []}')) == "dcat-json"
    assert v.sniff(b"\x00\x01binary") is None


def test_an_uploaded_package_nested_too_deep_for_pythons_json_is_its_records_error():
    """Python's json gives up at about 1,000 levels (RecursionError, which failed the validation
    whole); the document is read again level by level and the deep package fails alone."""
    from harvester.testing.local_http import dumps, nested

    packages = broken_ckan_packages()
    deep = dict(packages[0], id="deep-one", name="deep-one", extras=[{"key": "tree", "value": nested(5000)}])
    data = dumps({"success": True, "result": {"count": len(packages) + 1, "results": packages + [deep]}})
    report = v.validate_bytes(data.encode(), "ckan", "answer.json")
    assert report.records == len(packages) + 1 and report.failed == 3
    assert any(row["code"] == "record-too-deep" and row["source_id"] == "deep-one" for row in report.rows)
