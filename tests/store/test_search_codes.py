"""Exact codes and acronyms in hybrid search (issue 40): whatever text search returns in its top 5
for a code found in up to 1% of the catalogue, hybrid returns in its top 5 too.

The catalogue: the Brazilian (dados.gov.br, Portuguese), Canadian (data.gc.ca) and US
(catalog.data.gov) samples, 2,556 real records harvested through the pipeline's steps (a local CKAN
portal each over HTTP) with vectors from the local Ollama stand-in (testing/ollama.py): random
directions seeded by the text, so the vector side is pure noise, as a model's neighbours of a code
it has no meaning for are. The codes are picked from the records by a rule (below), not by hand."""
from __future__ import annotations

import re
import uuid
from collections import defaultdict

import psycopg
import pytest

from harvester.config.portals import Portal
from harvester.store.search import SearchFilters, SearchSettings, search

FILES = {"br": ("dados-gov-br.jsonl", "portuguese"),
         "ca": ("data-gc-ca-snapshot-2013-06-17T12-30.jsonl", "english"),
         "us": ("catalog-data-gov.jsonl", "english")}
_ACRONYM = re.compile(r"(?<!\w)([A-Z][A-Z0-9]{2,11})(?!\w)")
_ROMAN = re.compile(r"^[IVXLCDM]+$")


def _fields(record: dict) -> list[str]:
    org = record.get("organization") or {}
    tags = " ".join(t.get("display_name") or t.get("name") or "" for t in record.get("tags") or []
                    if isinstance(t, dict))
    return [str(x or "") for x in (record.get("title"), record.get("notes"), tags,
                                   org.get("title") if isinstance(org, dict) else "")]


def _codes_in(text: str) -> set[str]:
    """The acronyms of a field written among ordinary words (neither word next to it in capitals:
    the words of a shouted title are no codes)."""
    words = list(re.finditer(r"\w+", text))
    found = set()
    for i, word in enumerate(words):
        if _ACRONYM.fullmatch(word.group()) and sum(c.isalpha() for c in word.group()) >= 2 \
                and not _ROMAN.match(word.group()):
            near = [words[j].group() for j in (i - 1, i + 1) if 0 <= j < len(words)]
            if not any(sum(c.isalpha() for c in w) >= 2 and w.isupper() for w in near):
                found.add(word.group())
    return found


def _codes(records_by_portal: dict) -> dict[str, list[str]]:
    """Per portal, the acronyms of its records (3-12 capitals and digits, two letters or more, not a
    Roman numeral, written among ordinary words at least once) never written in lower or mixed case
    anywhere in the catalogue."""
    lower_forms: set[str] = set()
    held: dict[str, set] = defaultdict(set)
    for portal, records in records_by_portal.items():
        for record in records:
            for text in _fields(record):
                lower_forms.update(w.upper() for w in re.findall(r"\w+", text) if not w.isupper())
                held[portal].update(_codes_in(text))
    return {portal: sorted(c.lower() for c in codes - lower_forms) for portal, codes in held.items()}


@pytest.fixture(scope="module")
def catalogue(pg_server, template_db, samples):
    from harvester.embeddings.ollama import OllamaProvider
    from harvester.pipeline import steps as pipeline
    from harvester.store import db as store_db
    from harvester.testing.ckan_portal import DemoPortal
    from harvester.testing.ollama import FakeOllama

    name = f"t_codes_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = pg_server.url(name)
    records = {portal: samples(file) for portal, (file, _) in FILES.items()}
    servers, urls = [], {}
    try:
        with FakeOllama(models={"nomic-embed-text": 64}) as ollama, \
                store_db.prepare(store_db.connect_url(url)) as conn, \
                store_db.prepare(store_db.connect_url(url)) as reader:
            provider = OllamaProvider(url=ollama.url, dimension=64, max_batch=500)
            for portal, (_, language) in FILES.items():
                server = DemoPortal(records=records[portal])
                server.start()
                servers.append(server)
                urls[portal] = server.base_url
                p = Portal(name=portal, url=server.base_url, politeness_delay=0, max_retries=0, language=language)
                stats = pipeline.harvest(conn, reader, p, pipeline.source_for(p), provider, full_sync=True)
                assert stats["failed"] == 0
            for table in ("datasets", "dataset_search", "embeddings"):
                conn.execute(f"ANALYZE {table}")
        yield {"url": url, "records": records, "portals": urls, "provider": provider}
    finally:
        for server in servers:
            server.stop()
        with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def conn(catalogue):
    from harvester.store import db as store_db

    connection = store_db.prepare(store_db.connect_url(catalogue["url"]))
    yield connection
    connection.close()


def _noise(code: str) -> list[float]:
    from harvester.testing.ollama import pseudo_embedding

    return pseudo_embedding(code.lower(), 64)


def _search(conn, catalogue, query: str, mode: str = "hybrid", **kwargs):
    """Search with the catalogue's model (its query vector: chance, as the vector side is for a code)."""
    found = search(conn, query, mode=mode, limit=10, query_vector=_noise(query), provider=catalogue["provider"],
                   **kwargs)
    assert found.note is None and found.model == (None if mode == "text" else catalogue["provider"].model)
    return found


def _hold(conn, ids: list[int], code: str) -> bool:
    """Whether every one of the datasets holds the code as a word (a plural ending aside: "CBSAs")."""
    rows = conn.execute("SELECT concat_ws(' ', title, description, tags::text, organization) FROM datasets"
                        " WHERE id = ANY(%s)", (ids,)).fetchall()
    word = re.compile(rf"(?<![^\W_]){re.escape(code)}(?:s|es)?(?![^\W_])", re.IGNORECASE)
    return len(rows) == len(ids) and all(word.search(r[0]) for r in rows)


def _top5(conn, catalogue, query: str, mode: str) -> list[int]:
    return [i["dataset_id"] for i in _search(conn, catalogue, query, mode).items[:5]]


@pytest.fixture(scope="module")
def codes(conn, catalogue):
    """Per portal, (code, how many datasets text search's strict stage finds it in) for the codes of
    its records found in 1 dataset to 1% of the catalogue: every one in more than 5, the first 10
    in 1 to 5 (the rule before issue 40 kept those already)."""
    live = conn.execute("SELECT count(*) FROM dataset_search WHERE removed_at IS NULL").fetchone()[0]
    most = int(SearchSettings().rare_share * live)
    configs = [r[0] for r in conn.execute("SELECT DISTINCT config::text FROM dataset_search")]
    picked = {}
    for portal, candidates in _codes(catalogue["records"]).items():
        counted = conn.execute(
            """
            SELECT c.code, (SELECT count(*) FROM dataset_search s WHERE s.document @@ q.tsq)
            FROM unnest(%(codes)s::text[]) AS c(code),
                 LATERAL (SELECT string_agg(DISTINCT nullif(plainto_tsquery(cfg::regconfig, c.code)::text, ''), ' | ')::tsquery
                          FROM unnest(%(configs)s::text[]) cfg) q(tsq)
            ORDER BY c.code
            """, {"codes": candidates, "configs": configs}).fetchall()
        wide = [(code, n) for code, n in counted if 5 < n <= most]
        few = [(code, n) for code, n in counted if 1 <= n <= 5][:10]
        picked[portal] = wide + few
    return picked


def test_the_catalogue_holds_codes_of_every_sample_in_more_than_five_datasets(codes, conn):
    """The premise: each sample has codes text finds in more than 5 and at most 1% of the datasets
    (the old rule's limit was 5), and codes found in 1 to 5."""
    live = conn.execute("SELECT count(*) FROM dataset_search WHERE removed_at IS NULL").fetchone()[0]
    assert live > 2500
    for portal, rows in codes.items():
        assert sum(n > 5 for _, n in rows) >= 3, (portal, rows)
        assert sum(n <= 5 for _, n in rows) >= 3, (portal, rows)


@pytest.mark.parametrize("portal", sorted(FILES))
def test_hybrid_keeps_every_code_text_has_in_its_top_5(conn, catalogue, codes, portal):
    """For every code of the sample, every dataset text mode returns in its top 5 is in hybrid's top
    5, though the vector side's 20 nearest datasets are chance neighbours."""
    lost = []
    checked = 0
    for code, n in codes[portal]:
        text = _top5(conn, catalogue, code, "text")
        if not _hold(conn, text, code):
            continue  # stemming reads it as another word ("agregados": "agrega", "agregador")
        checked += 1
        hybrid = _top5(conn, catalogue, code, "hybrid")
        if set(text) - set(hybrid):
            lost.append(f"{code} (in {n} datasets: {len(set(text) - set(hybrid))} of text's top 5 missing)")
    assert checked >= 10 and sum(n > 5 for _, n in codes[portal]) >= 3
    assert not lost, f"{len(lost)} of {checked} codes lose answers: " + ", ".join(lost)


def test_common_words_and_long_queries_are_fused_as_before(conn, catalogue):
    """A word in more than 1% of the catalogue, and words that are no code (lower case in the
    records) found in more than 5 datasets, are plain RRF: nothing marked as a rare match."""
    for query in ("data", "census", "population density", "saude"):
        assert not any(i["rare_match"] for i in _search(conn, catalogue, query).items), query


def test_a_code_is_rare_among_the_datasets_the_filters_leave(conn, codes, catalogue):
    """The share is of the datasets the filters leave: a code in more than 1% of a portal's
    datasets is not rare under that portal's filter."""
    live = conn.execute("SELECT count(*) FROM dataset_search WHERE portal_url = %s",
                        (catalogue["portals"]["br"],)).fetchone()[0]
    code, n = next((c, n) for c, n in codes["br"] if n > SearchSettings().rare_share * live
                   and _hold(conn, _top5(conn, catalogue, c, "text"), c))
    whole = _search(conn, catalogue, code)
    assert sum(i["rare_match"] for i in whole.items) == 5
    filtered = _search(conn, catalogue, code, filters=SearchFilters(portal_url=catalogue["portals"]["br"]))
    assert not any(i["rare_match"] for i in filtered.items)
