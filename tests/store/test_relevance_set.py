"""The relevance set of the search benchmark (bench/relevance/queries.yaml) is well formed and honest:
at least 60 queries, every expected dataset exists in the real samples, at least a third written in
the dataset's own (non-English) language, and no query is a title copied verbatim. Fast, no database."""
from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

from harvester.testing.samples import ROOT, load_samples

QUERIES = ROOT / "bench" / "relevance" / "queries.yaml"

# The languages a person would search each sample file's datasets in, besides English.
NATIVE = {
    "dados-gov-br.jsonl": {"pt"},
    "govdata-de.jsonl": {"de"},
    "data-stadt-zuerich-ch.jsonl": {"de"},
    "dkan-hauts-de-france.jsonl": {"fr"},
    "data-humdata-org.jsonl": {"es", "fr"},  # HDX carries records in the language of the country
    "data-gc-ca-snapshot-2013-06-17T11-50.jsonl": {"fr"},
    "data-gc-ca-snapshot-2013-06-17T12-30.jsonl": {"fr"},
    "envidat-ch.jsonl": {"de", "fr"},
}


def _plain(text: str) -> str:
    """Case, accents and punctuation folded away: 'Ônibus, Ponto!' -> 'onibus ponto'."""
    text = unicodedata.normalize("NFKD", text or "").encode("ascii", "ignore").decode().casefold()
    return " ".join(re.findall(r"[a-z0-9]+", text))


@pytest.fixture(scope="module")
def entries() -> list[dict]:
    data = yaml.safe_load(QUERIES.read_text(encoding="utf-8"))
    assert isinstance(data, dict) and isinstance(data.get("queries"), list), "queries.yaml: a mapping with a `queries` list"
    return data["queries"]


@pytest.fixture(scope="module")
def records(entries) -> dict[str, dict[str, dict]]:
    files = {e["file"] for entry in entries for e in entry.get("expected") or []}
    return {name: {rec["id"]: rec for rec in load_samples(name)} for name in sorted(files)}


def test_shape(entries):
    assert len(entries) >= 60
    for entry in entries:
        assert set(entry) <= {"query", "language", "expected", "note"}, entry
        assert isinstance(entry.get("query"), str) and entry["query"].strip(), entry
        assert re.fullmatch(r"[a-z]{2}", entry.get("language") or ""), entry
        assert entry.get("expected"), f"{entry['query']!r} has no expected dataset"
        for expected in entry["expected"]:
            assert set(expected) == {"file", "id"}, entry
    queries = [_plain(e["query"]) for e in entries]
    duplicates = {q for q in queries if queries.count(q) > 1}
    assert not duplicates, f"queries repeated: {sorted(duplicates)}"
    assert sum(len(e["expected"]) > 1 for e in entries) >= 5, "several queries should have more than one answer"


def test_every_expected_dataset_exists(entries, records):
    missing = [(e["query"], x["file"], x["id"]) for e in entries for x in e["expected"]
               if x["id"] not in records.get(x["file"], {})]
    assert not missing, f"expected datasets not in the samples: {missing}"


def test_a_third_in_the_datasets_own_language(entries):
    native = [e for e in entries if e["language"] != "en"
              and all(e["language"] in NATIVE.get(x["file"], set()) for x in e["expected"])]
    assert len(native) * 3 >= len(entries), f"{len(native)} of {len(entries)} in the dataset's own language"
    foreign = [e["query"] for e in entries if e["language"] != "en" and e not in native]
    assert not foreign, f"queries in a language their datasets are not written in: {foreign}"


def test_no_query_is_a_title(entries, records):
    titles = {_plain(rec.get("title") or ""): rec["id"] for by_id in records.values() for rec in by_id.values()}
    for name in NATIVE.keys() | {"catalog-data-gov.jsonl", "data-gov-uk.jsonl", "data-gov-au.jsonl",
                                 "data-birmingham-gov-uk.jsonl"}:
        if name not in records:
            titles.update({_plain(rec.get("title") or ""): rec["id"] for rec in load_samples(name)})
    copied = [e["query"] for e in entries if _plain(e["query"]) in titles]
    assert not copied, f"queries equal to a dataset's title: {copied}"


# -- the generated set (bench/relevance/generate.py) ------------------------------------------------
def _generator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("relevance_generate", ROOT / "bench" / "relevance" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated():
    module = _generator()
    docs = module.load_corpus()
    return module, docs, module.generate(docs)


def test_the_generated_set_is_deterministic_and_large_enough(generated):
    module, docs, entries = generated
    assert module.generate(docs) == entries  # the same records, the same queries
    counts = module.counts(entries)
    titles = {lang: counts.get(("title", lang), 0) + counts.get(("title-xl", lang), 0) for lang in module.LANGUAGES}
    assert sum(titles.values()) >= 100 and all(titles[lang] >= 30 for lang in ("pt", "es", "en", "fr")), counts
    assert titles["de"] >= 5, counts  # all the German titles the samples have
    codes = {lang: counts.get(("code", lang), 0) for lang in module.LANGUAGES}
    assert sum(codes.values()) >= 18 and all(codes[lang] >= 18 for lang in ("pt", "es", "en")), counts
    wide = {lang: counts.get(("code-wide", lang), 0) for lang in module.LANGUAGES}
    assert wide["en"] >= 20 and wide["pt"] >= 10 and wide["es"] >= 3, counts  # codes in 6 to 1% of the corpus
    assert all(set(e) == {"query", "language", "expected", "note", "kind", "set"} for e in entries)
    queries = [(e["kind"], _plain(e["query"])) for e in entries]
    assert len(set(queries)) == len(queries)


def test_generated_queries_hold_what_they_claim(generated):
    module, docs, entries = generated
    by_id = {}
    for d in docs:
        by_id.setdefault(d.id, []).append(d)
    for e in entries:
        answers = [d for x in e["expected"] for d in by_id[x["id"]] if d.file == x["file"]]
        assert len(answers) == len(e["expected"]), e
        if e["kind"] == "title":  # the query is an answer's title, as pasted
            assert any(d.title == e["query"] for d in answers), e
        elif e["kind"] == "title-xl":  # a French title of an English-indexed dataset
            assert answers[0].title_fra == e["query"] and _plain(answers[0].title) != _plain(e["query"]), e
        else:  # a code: lower case, a whole word of every answer's text and of no other dataset's
            fewest, most = (1, module.CODE_MAX_DATASETS) if e["kind"] == "code" else \
                (module.CODE_MAX_DATASETS + 1, module.CODE_WIDE_SHARE * len(by_id))
            assert e["query"] == e["query"].lower() and fewest <= len(e["expected"]) <= most, e
            assert all(e["query"] in _plain(d.text).split() for d in answers), e
    for kind in ("code", "code-wide"):
        code = next(e for e in entries if e["kind"] == kind)
        holders = {d.id for d in docs if code["query"] in _plain(d.text).split()}
        assert holders == {x["id"] for x in code["expected"]}
