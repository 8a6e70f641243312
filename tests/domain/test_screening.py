"""The screening of records before they are hashed or staged (issue 36): what is neutralised with a
warning, what fails the record, at which caps, and that a clean record passes unchanged."""
from __future__ import annotations

import hashlib
import json

import pytest

from harvester.domain import dataset as ds
from harvester.domain import outcomes as oc
from harvester.domain import screening as sc

PORTAL = "https://p.org"


def _codes(record: ds.DatasetRecord) -> dict[str, tuple]:
    return {p.code: (p.field, p.value) for p in record.problems}


def _nested(levels: int):
    """``levels`` arrays, one in another."""
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def test_a_clean_record_is_the_same_object_and_unwarned(samples):
    for pkg in samples("data-gov-uk.jsonl"):
        clean, found = sc.screen(pkg, pkg["id"])
        assert clean is pkg and not found.problems()


def test_non_finite_numbers_read_from_json_become_null_anywhere():
    pkg = json.loads('{"id": "r1", "title": "T", "resources": [{"size": NaN}],'
                     ' "deep": {"a": [1, {"b": Infinity}], "c": -Infinity}}')
    record = ds.normalize(pkg, PORTAL)
    assert record.ok and record.raw["resources"] == [{"size": None}]
    assert record.raw["deep"] == {"a": [1, {"b": None}], "c": None}
    (found,) = [p for p in record.problems if p.code == "non-finite-number"]
    assert (found.field, found.value, found.severity, found.stage) == ("resources[0].size", "NaN", "warning", "parse")
    assert found.message == ("record 'r1': a non-finite number (NaN) was made null at resources[0].size"
                             " (3 values in all)")
    assert pkg["resources"] == [{"size": pkg["resources"][0]["size"]}]  # the caller's package is left as it was


def test_lone_surrogates_become_the_replacement_character_in_texts_and_keys():
    pkg = json.loads('{"id": "r", "name": "r\\ud800", "title": "A \\udc00 title", "extras": {"k\\ud83d": "v"},'
                     ' "ok": "a pair \\ud83d\\ude00 stays"}')
    record = ds.normalize(pkg, PORTAL)
    assert record.ok and record.source_id == "r" and record.title == "A \ufffd title"
    assert record.name == "r\ufffd" and record.url == "https://p.org/dataset/r\ufffd"
    assert record.raw["extras"] == {"k\ufffd": "v"} and record.raw["ok"] == "a pair \U0001F600 stays"
    assert _codes(record)["lone-surrogate"] == ("name", "r\ufffd")
    assert record.content_hash == ds.content_hash(ds.embedding_text("A \ufffd title", ""))


@pytest.mark.parametrize("ident, shown, what", [
    ("r\ud800", "r\\ud800", "a lone surrogate (\\ud800: a UTF-16 half, not a character)"),
    ("\udfffr", "\\udfffr", "a lone surrogate (\\udfff: a UTF-16 half, not a character)"),
    ("a\x00b", "a\\x00b", "a NUL character (U+0000)"),
    ("a\x00\udc00", "a\\x00\\udc00", "a lone surrogate (\\udc00: a UTF-16 half, not a character) and a NUL "
                                      "character (U+0000)"),
])
def test_an_identifier_that_cannot_be_stored_fails_its_record_shown_escaped(ident, shown, what):
    # Neutralised, "r\ud800" would be "r\ufffd" and "a\x00b" would be "ab": another dataset's id,
    # whose row the record would overwrite. So the record fails, and says which one it is.
    other = ds.normalize({"id": "ab", "title": "T"}, PORTAL)
    record = ds.normalize({"id": ident, "title": "T"}, PORTAL)
    assert other.ok and not record.ok
    found = record.problems[0]
    assert (found.code, found.severity, found.stage, found.field, found.value) == (
        "unstorable-identifier", "error", "parse", None, shown)
    assert found.message == (f"record '{shown}': its identifier holds {what}, which PostgreSQL cannot store: an "
                             "identifier is not altered (altered, it could be another dataset's), so the record is "
                             "not stored")
    assert [p.code for p in record.problems if p.severity == "error"] == ["unstorable-identifier"]
    assert record.source_id == shown and record.error == found.message
    assert not sc._BAD_CHAR.search(record.error + str(record.raw))


def test_a_record_failing_for_another_reason_says_its_identifier_cannot_be_stored_too():
    record = ds.normalize({"id": "r\ud800", "name": "", "title": ""}, PORTAL)
    assert [p.code for p in record.problems if p.severity == "error"] == ["unstorable-identifier", "no-title"]
    assert record.source_id == "r\\ud800"
    assert sc.identifier_problem("r\ufffd") is None and sc.identifier_problem(None) is None


def test_a_nul_is_removed_with_a_warning():
    record = ds.normalize({"id": "r", "title": "T\x00", "notes": "a\x00b", "k\x00": ["x\x00"]}, PORTAL)
    assert record.ok and (record.title, record.description) == ("T", "ab") and record.raw["k"] == ["x"]
    assert _codes(record)["nul-character"] == ("title", "T")


def test_the_hash_of_a_text_with_a_lone_surrogate_is_the_hash_of_what_is_stored():
    assert ds.sha256_hex("a\ud800b") == ds.sha256_hex("a\ufffdb")
    assert ds.sha256_hex("plain é") == hashlib.sha256("plain é".encode()).hexdigest()


@pytest.mark.parametrize("levels, ok", [(sc.MAX_DEPTH, True), (sc.MAX_DEPTH + 1, False), (300, False)])
def test_nesting_beyond_the_cap_fails_the_record_naming_where(levels, ok):
    # The record itself is the first level: a field holding ``levels - 1`` nested arrays.
    record = ds.normalize({"id": "deep", "title": "T", "x": _nested(levels - 1)}, PORTAL)
    assert record.ok is ok
    if not ok:
        (found,) = record.problems
        assert (found.code, found.severity) == ("record-too-deep", "error")
        assert found.field == "x" + "[0]" * (sc.MAX_DEPTH - 1)  # the 65th level
        assert record.error.startswith("record 'deep' nests objects and arrays more than 64 levels deep (at x[0]")
        assert record.raw == {"id": "deep"}


def test_a_record_beyond_the_size_cap_fails():
    record = ds.normalize({"id": "big", "title": "T", "notes": "x" * sc.MAX_RECORD_BYTES}, PORTAL)
    assert not record.ok and [p.code for p in record.problems] == ["record-too-large"]
    assert record.error.startswith("record 'big' is 10,485,") and record.raw == {"id": "big"}
    assert ds.normalize({"id": "fits", "title": "T", "notes": "x" * (sc.MAX_RECORD_BYTES - 1000)}, PORTAL).ok


def test_a_failed_record_holds_only_what_can_be_stored():
    record = ds.failed("id", {"title": float("inf"), "t": "\x00"},
                       [oc.problem("no-title", "record 'x\ud800' has no title", "title", "\ud800")], prefix="p\ud800: ")
    assert record.source_id == "id" and record.raw == {"title": None, "t": ""}
    assert record.error == "p\ufffd: record 'x\ufffd' has no title"
    assert record.problems[0].value == "\ufffd"
    bad = ds.failed("id\ud800", {"title": "T"}, [oc.problem("no-title", "no title", "title")])
    assert bad.source_id == "id\\ud800"
    assert [p.code for p in bad.problems] == ["unstorable-identifier", "no-title"]
    assert bad.error.startswith("record 'id\\ud800': its identifier holds a lone surrogate") and "; no title" in bad.error


def test_the_caps_the_codes_document_are_the_caps_applied():
    assert f"more than {sc.MAX_DEPTH} levels" in oc.CODES["record-too-deep"].summary
    assert f"more than {sc.MAX_RECORD_BYTES // (1024 * 1024)} MB" in oc.CODES["record-too-large"].summary


# -- the record as published, before a source maps it ----------------------------------------------
@pytest.mark.parametrize("levels", [sc.MAX_DEPTH + 1, 999, 1500, 100_000])
def test_a_record_too_deep_fails_before_any_mapping_reads_it_whatever_its_depth(levels):
    """A mapping reads the record before its package is screened: ``str()`` of a title, a
    ``json.dumps`` of an extra, which raise RecursionError some hundreds of levels down (and
    hide any depth in a text). So the record as published is screened first, without recursion,
    and fails where ``screen`` would say it does."""
    titled = ds.normalize({"id": "deep", "title": _nested(levels - 1)}, PORTAL)  # (str(title) recursed)
    assert not titled.ok and [p.code for p in titled.problems] == ["record-too-deep"]
    assert titled.raw == {"id": "deep"} and titled.problems[0].field == "title" + "[0]" * (sc.MAX_DEPTH - 1)

    record = {"id": "deep", "title": "T", "x": _nested(levels - 1)}
    with pytest.raises(sc.Unfit) as published:
        sc.published(record, "deep")
    with pytest.raises(sc.Unfit) as screened:
        sc.screen(record, "deep")
    assert published.value.problem == screened.value.problem
    assert published.value.problem.field == "x" + "[0]" * (sc.MAX_DEPTH - 1)


def test_a_record_too_large_fails_before_any_mapping():
    with pytest.raises(sc.Unfit) as exc:
        sc.published({"id": "big", "notes": "x" * sc.MAX_RECORD_BYTES}, "big")
    assert exc.value.problem.code == "record-too-large" and "record 'big' is 10,485," in exc.value.problem.message
    with pytest.raises(sc.Unfit):  # (one orjson cannot write, a lone surrogate in it, is measured too)
        sc.published({"id": "big", "notes": "\ud800" + "x" * sc.MAX_RECORD_BYTES}, "big")


def test_non_finite_numbers_are_null_before_a_mapping_reads_them_and_nothing_else_changes():
    pkg = json.loads('{"id": "r", "title": NaN, "name": "r-name", "n": [1, {"v": -Infinity}],'
                     ' "t": "a \\ud800 and NUL\\u0000"}')
    # CKAN's mapping read a NaN title as the text "nan": the title is null, so the name stands in.
    record = ds.normalize(pkg, PORTAL)
    assert record.ok and record.title == "r-name" and record.raw["title"] is None
    (warned,) = [p for p in record.problems if p.code == "non-finite-number"]
    assert (warned.field, warned.value) == ("title", "NaN") and "(2 values in all)" in warned.message

    nulled, found = sc.published(pkg, "r")
    assert nulled == {"id": "r", "title": None, "name": "r-name", "n": [1, {"v": None}],
                      "t": "a \ud800 and NUL\x00"}  # texts are left to screen, after the mapping
    assert [(p.code, p.field, p.value) for p in found.problems()] == [("non-finite-number", "title", "NaN")]
    assert pkg["title"] != pkg["title"]  # the caller's record is left as it was
    clean = {"id": "c", "n": [1.5, 2]}
    assert sc.published(clean, "c")[0] is clean
