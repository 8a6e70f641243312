"""The text recipe and the three hashes, on real CKAN records (pure: no database, no network)."""
import copy
from datetime import datetime, timezone

from harvester.domain import dataset as ds

PORTAL = "https://data.example.org"


def test_real_records_normalize(samples):
    for name in ("data-birmingham-gov-uk.jsonl", "dados-gov-br.jsonl", "catalog-data-gov.jsonl",
                 "dkan-hauts-de-france.jsonl", "data-stadt-zuerich-ch.jsonl"):
        for pkg in samples(name):
            rec = ds.normalize(pkg, PORTAL)
            assert rec.ok, (name, rec.error)
            assert rec.source_id == pkg["id"]
            assert rec.title and "<" not in rec.title
            assert len(rec.content_hash) == 64 and len(rec.metadata_hash) == 64
            assert rec.url == f"{PORTAL}/dataset/{pkg['name']}"


def test_html_is_stripped_from_the_embedded_text(samples):
    with_html = [p for p in samples("dados-gov-br.jsonl") if p.get("notes") and "<" in p["notes"]]
    assert with_html, "the Brazilian sample has HTML in notes"
    rec = ds.normalize(with_html[0], PORTAL)
    assert "<" not in rec.description and ">" not in rec.description
    assert "  " not in rec.description


def test_clean_text():
    assert ds.clean_text("<p>Air&nbsp;quality</p><p>in <b>Zürich</b></p>") == "Air\xa0quality in Zürich".replace("\xa0", " ")
    assert ds.clean_text("  a\r\n\tb  ") == "a b"
    assert ds.clean_text("Fish &amp; chips") == "Fish & chips"
    assert ds.clean_text(None) == ""


def test_content_hash_follows_title_and_description_only(samples):
    pkg = samples("data-birmingham-gov-uk.jsonl")[0]
    base = ds.normalize(pkg, PORTAL)

    retitled = copy.deepcopy(pkg)
    retitled["title"] += " (revised)"
    assert ds.normalize(retitled, PORTAL).content_hash != base.content_hash

    whitespace = copy.deepcopy(pkg)
    whitespace["notes"] = "  " + pkg["notes"].replace(" ", "   ") + "\n"
    assert ds.normalize(whitespace, PORTAL).content_hash == base.content_hash

    retagged = copy.deepcopy(pkg)
    retagged["tags"] = list(reversed(pkg["tags"])) + [{"name": "new-tag"}]
    rec = ds.normalize(retagged, PORTAL)
    assert rec.content_hash == base.content_hash
    assert rec.metadata_hash != base.metadata_hash


def test_metadata_hash_ignores_order_and_bookkeeping(samples):
    pkg = samples("data-gov-au.jsonl")[0]
    base = ds.normalize(pkg, PORTAL).metadata_hash
    shuffled = copy.deepcopy(pkg)
    shuffled["tags"] = list(reversed(pkg.get("tags") or []))
    shuffled["resources"] = list(reversed(pkg.get("resources") or []))
    shuffled["metadata_modified"] = "2030-01-01T00:00:00"
    shuffled["revision_id"] = "something-else"
    assert ds.normalize(shuffled, PORTAL).metadata_hash == base


def test_resource_format_change_is_a_metadata_change(samples):
    pkg = samples("data-gc-ca-snapshot-2013-06-17T11-50.jsonl")[0]
    changed = copy.deepcopy(pkg)
    changed["resources"][0]["format"] = "CSV" if pkg["resources"][0]["format"] != "CSV" else "XLS"
    a, b = ds.normalize(pkg, PORTAL), ds.normalize(changed, PORTAL)
    assert a.content_hash == b.content_hash and a.metadata_hash != b.metadata_hash


def test_url_hash_normalizes_scheme_host_and_trailing_slash():
    assert ds.normalize_url("HTTPS://Data.Example.ORG/dataset/x/") == "https://data.example.org/dataset/x"
    assert ds.normalize_url("https://data.example.org/Dataset/X") == "https://data.example.org/Dataset/X"


def test_unusable_records_say_why():
    assert ds.normalize({"name": "no-id", "title": "No id"}, PORTAL).error == "record 'no-id' has no 'id'"
    assert ds.normalize(["not", "a", "dict"], PORTAL).error == "record is a list, not a JSON object"
    assert ds.normalize({"id": "  "}, PORTAL).error == "record '?' has no 'id'"


def test_timestamps_without_zone_or_T_are_utc(samples):
    pkg = samples("dkan-hauts-de-france.jsonl")[0]
    assert pkg["metadata_modified"] == "2019-09-30 22:00:00"
    assert ds.normalize(pkg, PORTAL).metadata_modified == datetime(2019, 9, 30, 22, tzinfo=timezone.utc)
    assert ds.parse_timestamp("2013-06-17T15:32:05.305546") == datetime(2013, 6, 17, 15, 32, 5, 305546, tzinfo=timezone.utc)
    assert ds.parse_timestamp("2020-01-01T00:00:00Z") == datetime(2020, 1, 1, tzinfo=timezone.utc)
    assert ds.parse_timestamp("not a date") is None


def test_long_text_is_truncated_deterministically():
    text = ds.embedding_text("T", "x" * 20000)
    assert len(text) == ds.MAX_TEXT_CHARS
    assert ds.content_hash(text) == ds.content_hash(ds.embedding_text("T", "x" * 30000))


def test_an_edit_beyond_the_embedded_text_is_a_metadata_change():
    long = {"id": "a", "name": "a", "title": "T", "notes": "x" * 9000}
    edited = {**long, "notes": "x" * 8990 + "y" * 10}
    a, b = ds.normalize(long, PORTAL), ds.normalize(edited, PORTAL)
    assert a.content_hash == b.content_hash and a.metadata_hash != b.metadata_hash


def test_missing_title_falls_back_to_name():
    rec = ds.normalize({"id": "abc", "name": "air-quality", "title": None, "notes": None}, PORTAL)
    assert rec.title == "air-quality" and rec.description == ""
