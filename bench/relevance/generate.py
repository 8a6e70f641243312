"""The generated relevance set: queries built by code from the sample records, not picked by hand.

``generate()`` reads the corpus the search benchmark harvests (every ``../shared/ckan-samples/*.jsonl``
file as its own portal, plus the Argentine DCAT-AR catalogue ``datos-gob-ar/data.json-2018-07-10``
of ``../shared/dcat-samples``, Spanish) and returns a list of queries in the shape of
``queries.yaml`` (query, language, expected [{file, id}], note) with two more keys: ``kind`` and
``set`` ("generated"). It is deterministic: the same records give the same queries (a
``random.Random(SEED)`` draws every sample, from lists sorted by file and id first).

Kinds of query:

- ``title``: a dataset's title, pasted as a person copies it (case, accents and punctuation as in
  the record). For each language, a seeded sample of at most ``TITLES_PER_LANGUAGE`` datasets whose
  title is in that language: the portal's language (``PORTAL_LANGUAGE``: dados.gov.br pt, Zürich
  and GovData de, the DKAN portal fr, datos.gob.ar es, the English-speaking portals en), or, for
  portals with titles in several languages (HDX, EnviDat: ``None`` there), the language
  ``title_language()`` reads from the title's function words. A title is dropped when its
  function words point to another language than the portal's, when it has fewer than two words,
  or when it is a CKAN harvest source (``type: harvest``, catalog.data.gov). Expected: the dataset
  and every other dataset of the corpus with the same folded title (case, accents, punctuation
  aside). Text and hybrid search give an exact title a boost, so these mostly measure the vector
  side and the title boost itself.
- ``title-xl`` (cross-language): data.gc.ca records carry a French title (``title_fra``) while the
  harvester indexes the English one (``title`` and ``notes`` only): the French title is the query
  (language fr), the dataset the answer. Neither the words nor the title boost help there: only a
  model that maps French onto English does. A seeded sample of at most ``TITLES_PER_LANGUAGE``.
- ``code``: a token that looks like an agency's or programme's acronym or code, as it appears
  verbatim in a title or description: ``CODE`` below (3 to 12 characters of upper-case letters
  and digits, starting with a letter, at least two letters; Roman numerals left out), that is not
  an ordinary word (never written otherwise than in upper case anywhere in the corpus: "DADOS" of
  an upper-case title is out because "dados" is written elsewhere; data.gc.ca's French fields,
  not indexed, count for this too), that appears at least once among ordinary words (neither word
  next to it upper case: the words of a shouted title, "SICOOB OURO VERDE", are not codes), and
  that occurs as a whole word (case and accents folded) in the title, description, tags or
  organization of at least 1 and at most ``CODE_MAX_DATASETS`` datasets of the whole corpus (the
  two data.gc.ca snapshots share their ids: one dataset), all of one language. Query: the token
  lower-cased, as a user types it; expected: the datasets holding it; language: theirs (the
  portal's). A seeded sample of at most ``CODES_PER_LANGUAGE`` per language. (Full-text search
  stems the query, so it may match more datasets than counted here: "paa" is read as "pa".)
- ``code-wide``: the same codes, held by more than ``CODE_MAX_DATASETS`` datasets and at most
  ``CODE_WIDE_SHARE`` (1%) of the corpus's datasets (issue 40: hybrid keeps in its top 5 what text
  has there for codes up to 1% of the catalogue). A seeded sample of at most ``CODES_PER_LANGUAGE``
  per language, from a generator of its own (the other kinds' queries stay as they were).

    .venv/bin/python bench/relevance/generate.py          # counts per kind and language
    .venv/bin/python bench/relevance/generate.py --show   # and every query
"""
from __future__ import annotations

import functools
import gzip
import json
import os
import random
import re
import sys
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = Path(os.environ.get("HARVESTER_SAMPLES_DIR") or ROOT.parent / "shared" / "ckan-samples")
DCAT_SAMPLES = Path(os.environ.get("HARVESTER_DCAT_SAMPLES_DIR") or ROOT.parent / "shared" / "dcat-samples")
# The DCAT-AR catalogue harvested beside the CKAN files (its newest snapshot), named as in `expected`.
DCAT_FILES = {"datos-gob-ar/data.json-2018-07-10.json.gz": "spanish"}

SEED = 20261125
TITLES_PER_LANGUAGE = 40
CODES_PER_LANGUAGE = 30
CODE_MAX_DATASETS = 5
CODE_WIDE_SHARE = 0.01
LANGUAGES = ("pt", "de", "fr", "es", "en")

# The language of each portal's titles; None: read from each title (portals mixing languages).
PORTAL_LANGUAGE = {
    "dados-gov-br.jsonl": "pt", "govdata-de.jsonl": "de", "data-stadt-zuerich-ch.jsonl": "de",
    "dkan-hauts-de-france.jsonl": "fr", "datos-gob-ar/data.json-2018-07-10.json.gz": "es",
    "catalog-data-gov.jsonl": "en", "data-birmingham-gov-uk.jsonl": "en", "data-gov-uk.jsonl": "en",
    "data-gov-au.jsonl": "en", "data-gc-ca-snapshot-2013-06-17T11-50.jsonl": "en",
    "data-gc-ca-snapshot-2013-06-17T12-30.jsonl": "en",
    "data-humdata-org.jsonl": None, "envidat-ch.jsonl": None,
}
# Function words, the cheapest reliable sign of a short text's language.
FUNCTION_WORDS = {
    "pt": "da das do dos de e em na nas no nos para por com ao aos pela pelo uma um os as sobre entre".split(),
    "es": "de del la las el los y en para por con al una un sobre entre según".split(),
    "fr": "de du des la le les et en pour par avec au aux une un sur entre selon".split(),
    "de": "der die das des dem den und in im für von vom mit zur zum nach ein eine auf über".split(),
    "en": "of the and in for by with to on a an from at per between".split(),
}
CODE = re.compile(r"(?<![\w-])[A-Z][A-Z0-9]{2,11}(?![\w-])")
ROMAN = re.compile(r"[IVXLCDM]+")
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Doc:
    file: str       # the sample file, as `expected` names it
    id: str         # the record's id: source_id in the database
    title: str
    text: str       # title, description, tags and organization: what the text side indexes
    fields: tuple   # the same, one string per field (each tag its own)
    kind: str       # the record's type (CKAN: dataset, harvest, ...)
    title_fra: str  # data.gc.ca's French title, else ""
    other: str = ""  # text not indexed (data.gc.ca's French fields): read for ordinary words only


def plain(text: str) -> str:
    """Case, accents and punctuation folded away: 'Ônibus, Ponto!' -> 'onibus ponto'."""
    text = unicodedata.normalize("NFKD", text or "").encode("ascii", "ignore").decode().casefold()
    return " ".join(re.findall(r"[a-z0-9]+", text))


@functools.lru_cache(maxsize=None)
def _key(word: str) -> str:
    """plain() of one word, cached (the corpus has 600,000 words, 60,000 distinct)."""
    return plain(word)


def _clean(value) -> str:
    text = re.sub(r"<[a-zA-Z/!][^>]*>", " ", str(value or ""))
    return " ".join(text.split())


def _names(values) -> list[str]:
    out = []
    for v in values or []:
        name = v.get("display_name") or v.get("name") if isinstance(v, dict) else v
        if isinstance(name, str):
            out.append(name)
    return out


def load_corpus() -> list[Doc]:
    """Every record the benchmark harvests, sorted by file and id."""
    docs = []
    for path in sorted(SAMPLES.glob("*.jsonl")):
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    continue
                pkg = json.loads(line)
                org = pkg.get("organization")
                org = (org.get("title") or org.get("name")) if isinstance(org, dict) else org
                title, notes = _clean(pkg.get("title")), _clean(pkg.get("notes"))
                fields = (title, notes, *_names(pkg.get("tags")), org or "")
                docs.append(Doc(path.name, str(pkg["id"]), title, " \n ".join(fields), fields,
                                str(pkg.get("type") or ""), _clean(pkg.get("title_fra")),
                                " ".join(_clean(pkg.get(k)) for k in ("title_fra", "notes_fra"))))
    for name in DCAT_FILES:
        path = DCAT_SAMPLES / name
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            catalogue = json.load(handle)
        for entry in catalogue.get("dataset") or []:
            if not isinstance(entry.get("identifier"), str) or not entry.get("title"):
                continue
            publisher = (entry.get("publisher") or {}).get("name") or ""
            title, notes = _clean(entry.get("title")), _clean(entry.get("description"))
            fields = (title, notes, *_names(entry.get("keyword")), publisher)
            docs.append(Doc(name, entry["identifier"], title, " \n ".join(fields), fields, "dataset", ""))
    return sorted(docs, key=lambda d: (d.file, d.id))


def title_language(title: str) -> str | None:
    """The language whose function words the title holds most of (None: none, or a tie)."""
    words = plain(title).split()
    counts = {lang: sum(w in set(fw) for w in words) for lang, fw in FUNCTION_WORDS.items()}
    best = max(counts.values())
    if not best:
        return None
    leaders = [lang for lang, c in counts.items() if c == best]
    # Portuguese, Spanish and French share "de": a tie among them is no sign against any of them
    return leaders[0] if len(leaders) == 1 else ("romance" if set(leaders) <= {"pt", "es", "fr"} else None)


def _title_fits(title: str, language: str) -> bool:
    read = title_language(title)
    return read in (None, language) or (read == "romance" and language in ("pt", "es", "fr"))


def _entry(query, language, kind, docs, note) -> dict:
    expected = sorted({(d.file, d.id) for d in docs})
    # one dataset harvested from two portals (the data.gc.ca snapshots) is one answer
    seen, unique = set(), []
    for file, id_ in expected:
        if id_ not in seen:
            seen.add(id_)
            unique.append({"file": file, "id": id_})
    return {"query": query, "language": language, "expected": unique, "note": note, "kind": kind,
            "set": "generated"}


def title_queries(docs: list[Doc], rng: random.Random) -> list[dict]:
    by_title: dict[str, list[Doc]] = defaultdict(list)
    for d in docs:
        by_title[plain(d.title)].append(d)
    pools: dict[str, list[Doc]] = defaultdict(list)
    for d in docs:
        if d.kind == "harvest" or len(plain(d.title).split()) < 2:
            continue
        language = PORTAL_LANGUAGE.get(d.file)
        if language is None:
            read = title_language(d.title)
            language = read if read in LANGUAGES else None
        if language and _title_fits(d.title, language):
            pools[language].append(d)
    out, used = [], set()
    for language in LANGUAGES:
        pool, picked = pools.get(language, []), []
        for d in rng.sample(pool, len(pool)):
            key = plain(d.title)
            if key in used:
                continue
            used.add(key)
            picked.append(_entry(d.title, language, "title", by_title[key], f"title of {d.file} {d.id}"))
            if len(picked) == TITLES_PER_LANGUAGE:
                break
        out += picked
    # cross-language: data.gc.ca's French titles, the English-indexed dataset as the answer
    pool = [d for d in docs if d.title_fra and d.kind != "harvest" and len(plain(d.title_fra).split()) >= 2
            and plain(d.title_fra) != plain(d.title)]
    picked, used_xl = [], set()
    for d in rng.sample(pool, len(pool)):
        if d.id in used_xl or plain(d.title_fra) in used:
            continue
        used_xl.add(d.id)
        used.add(plain(d.title_fra))
        same = [x for x in docs if x.id == d.id]
        picked.append(_entry(d.title_fra, "fr", "title-xl", same, f"title_fra of {d.file} {d.id}; indexed: {d.title}"))
        if len(picked) == TITLES_PER_LANGUAGE:
            break
    return out + picked


def _doc_language(d: Doc) -> str | None:
    language = PORTAL_LANGUAGE.get(d.file)
    if language is None:
        read = title_language(d.title)
        language = read if read in LANGUAGES else "en"
    return language


def _codes_in(text: str) -> set[str]:
    """The CODE tokens of one field written among ordinary words: neither word next to it is
    upper case too (a shouted title or list, "SICOOB OURO VERDE", yields none)."""
    words = list(_WORD.finditer(text))
    at = {w.start(): i for i, w in enumerate(words)}
    found = set()
    for m in CODE.finditer(text):
        i = at.get(m.start())
        if i is None:
            continue
        near = [words[j].group(0) for j in (i - 1, i + 1) if 0 <= j < len(words)]
        if not any(sum(c.isalpha() for c in w) >= 2 and w.isupper() for w in near):
            found.add(m.group(0))
    return found


def _code_pools(docs: list[Doc], fewest: int, most: int) -> dict[str, list[tuple[str, list[Doc]]]]:
    """Per language, (token, the datasets holding it) of the CODE tokens (rules above) held by
    ``fewest`` to ``most`` datasets of the corpus, all of that language."""
    ordinary: set[str] = set()   # words written otherwise than all upper case somewhere
    holders: dict[str, set[str]] = defaultdict(set)  # folded word -> dataset ids holding it
    by_id: dict[str, list[Doc]] = defaultdict(list)
    candidates: set[str] = set()
    for d in docs:
        by_id[d.id].append(d)
        for word in _WORD.findall(d.text):
            if not word.isupper():
                ordinary.add(_key(word))
            holders[_key(word)].add(d.id)
        ordinary.update(_key(w) for w in _WORD.findall(d.other) if not w.isupper())
        for text in d.fields:
            candidates.update(_codes_in(text))
    pools: dict[str, list[tuple[str, list[Doc]]]] = defaultdict(list)
    for token in sorted(candidates):
        key = plain(token)
        if ROMAN.fullmatch(token) or sum(c.isalpha() for c in token) < 2 or key in ordinary:
            continue
        ids = sorted(holders.get(key, ()))
        if not fewest <= len(ids) <= most:
            continue
        holding = [d for i in ids for d in by_id[i]]
        languages = {_doc_language(d) for d in holding}
        if len(languages) == 1:
            pools[languages.pop()].append((token, holding))
    return pools


def code_queries(docs: list[Doc], rng: random.Random, kind: str = "code") -> list[dict]:
    """``code``: codes held by 1 to CODE_MAX_DATASETS datasets; ``code-wide``: by more, up to
    CODE_WIDE_SHARE of the corpus's datasets (the range issue 40 asks hybrid to keep in its top 5)."""
    if kind == "code":
        fewest, most = 1, CODE_MAX_DATASETS
    else:
        fewest, most = CODE_MAX_DATASETS + 1, int(CODE_WIDE_SHARE * len({d.id for d in docs}))
    pools = _code_pools(docs, fewest, most)
    out = []
    for language in LANGUAGES:
        pool = pools.get(language, [])
        for token, holding in rng.sample(pool, min(CODES_PER_LANGUAGE, len(pool))):
            out.append(_entry(token.lower(), language, kind, holding,
                              f"{token} in {len({d.id for d in holding})} dataset(s)"))
    return out


def generate(docs: list[Doc] | None = None) -> list[dict]:
    """The generated queries: titles (by language), cross-language titles, codes (in 1-5 datasets,
    then in more, up to 1% of the corpus)."""
    docs = load_corpus() if docs is None else docs
    rng = random.Random(SEED)
    titles = title_queries(docs, rng)
    # code-wide from a generator of its own: the earlier kinds' queries stay what they were
    return titles + code_queries(docs, rng) + code_queries(docs, random.Random(SEED + 1), "code-wide")


def counts(entries: list[dict]) -> dict[tuple[str, str], int]:
    return dict(sorted(Counter((e["kind"], e["language"]) for e in entries).items()))


def main() -> int:
    entries = generate()
    for (kind, language), n in counts(entries).items():
        print(f"{kind:9s} {language}  {n}")
    print(f"total {len(entries)}")
    if "--show" in sys.argv:
        for e in entries:
            print(f"{e['kind']:9s} {e['language']} {e['query'][:70]!r:74s} {len(e['expected'])}  {e['note'][:60]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
