"""Search over the datasets: full text, vectors, or both fused (`harvester search`, the Python API
and GET /harvester/api/search all call ``search()``).

Both sides read ``dataset_search`` (sql/007_search.sql), a narrow row per dataset that triggers
keep in step with ``datasets``: its full text and the filters' values, folded once.

- ``text``: PostgreSQL full text over ``dataset_search.document`` (title > tags > description >
  organization, accent-folded, stemmed with the portal's ``language:``), GIN-indexed, ranked by
  ``ts_rank``. The query is never parsed as tsquery syntax: each word goes through
  ``plainto_tsquery`` (so ``& | ! ( :*`` and a pasted " - " are only punctuation), a "quoted
  phrase" must appear as a phrase and ``-word`` (a minus stuck to the word) excludes it. Every
  word must match; while that finds fewer than ``limit`` datasets, those with all words but one
  follow (three words or more), then those with any of them.
- ``vector``: the query embedded with the active provider's model, unless that model does not
  cover the datasets yet (a model switch in progress) and an earlier model covers more: then with
  that one, so search keeps working while the new model fills in. The filters are part of the
  HNSW index scan (pgvector's iterative scan), so a selective filter still returns k results; a
  filter that leaves at most ``exact_limit`` datasets ranks them exactly instead.
- ``hybrid`` (default): each side's top ``candidates``, fused by reciprocal rank fusion:
  score = sum over the sides of 1 / (rrf_k + rank). In ``hybrid`` and ``text`` modes a dataset
  whose title is the query (case, accents and punctuation aside) counts as ranked first by one more
  list, one whose title holds the query's words in a row as ranked second: a pasted title finds
  its dataset first. In single modes the score is that side's 1 / (rrf_k + rank) alone. The two
  sides run at the same time: the vector side's statement on a second connection to the same
  database (store/beside.py, kept by the process), the text side's on the caller's (not when the caller's
  connection is inside a transaction: the other would not see its rows); the same statements, so
  the same results (``SearchSettings.beside=False``: one side after the other).
- Rare exact matches (``hybrid``): when every word of the query is found together in few datasets
  (the text side's strict stage, under the filters, finds at least one and at most ``rare_share``
  of the datasets the filters leave, PostgreSQL's estimate of those), and either in at most
  ``rare_matches`` datasets or the query is a code, that evidence is specific (an agency's or
  programme's code, a name, a rare word: "prouni", "sneep") and the vector side's for the same
  query is mostly noise (a model has no meaning for a code, so its nearest datasets are near by
  chance). A code: one or two words, not only numbers, each written as a code in at least one of
  text's best datasets for the query (two capitals or more, "IFPA", "CBSAs", in a field that is not
  shouted in capitals, or letters and digits together, "sp500"); a common word found in 1% of a
  catalogue is not one, and is fused as any query. Text's best ``rare_matches`` (at most
  ``limit``) of the strict stage, as text mode orders them, then count as ranked first by two more
  lists (2 / (rrf_k + 1) more), which puts them ahead of every other dataset (at most
  1 / (rrf_k + 1) from the vector side, a relaxed text stage ranked after them and one title
  boost): whatever text has in its top 5 for such a query, hybrid has in its top 5. RRF alone
  interleaves the sides (text 1, vector 1, text 2, vector 2, text 3, ...): a code found in four
  datasets or more lost the fourth and fifth from the top 5 to vector-only neighbours near by
  chance. Order among them stays the fused one (the vector side still decides between two datasets
  holding the code). When the strict stage filled its ``candidates`` (more matches than fetched),
  a count capped at the share's bound + 1 (through the GIN index, never every match) decides, and
  only for a query already read as a code. A query whose words are together in many datasets, or
  in none, is fused as before. bench/search_bench.py's generated ``code`` (1-5 datasets) and
  ``code-wide`` (6 to 1% of the corpus) queries measure it; tests/store/test_search_codes.py checks
  it on the Brazilian, Canadian and US samples.

One dataset on several portals (a duplicate group, store/duplicates.py) is one result: each
side's hits are collapsed by group before the ranks are taken (a group's rank on a side is its
best member's), each side fetching twice its ``candidates`` while the database holds any group,
so that collapsing still fills ``limit`` (cut back to ``candidates`` after collapsing: the ranks
are those of a search without collapsing when no hit is grouped). The result shows the group's canonical member when that one matched
(and passed the filters), else its best-ranked member that did: a portal filter finds a group
through its member on that portal. Every item carries ``dataset_id``, ``group_id`` (None when
alone), ``canonical`` (True when alone), ``also_on`` (the group's other live members:
dataset_id, portal_url, portal_name, source_id, title, url) and ``copies`` (how many).
``all_copies=True``: every member is its own result, as without groups, still with those fields.
One query (duplicates.groups_for on every hit) finds the groups; a database with no group answers
a cheaper one (duplicates.any_groups) instead.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
import unicodedata
from dataclasses import dataclass, field
from datetime import date, datetime

from harvester.config.settings import fields_from_env
from harvester.domain import snippet

MODES = ("hybrid", "vector", "text")

# Combining marks dropped after NFKD: the same ranges as harvester_fold() in sql/007_search.sql.
_COMBINING = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")
_PHRASE = re.compile(r'"([^"]*)"')
_NEGATED = re.compile(r"(?:(?<=\s)|^)-(?=\w)(\w[\w.]*)")
HIGHLIGHT = "**"


def fold(text: str) -> str:
    """Accents off, as the index has them: NFKD, combining marks dropped ("informações" -> "informacoes")."""
    return _COMBINING.sub("", unicodedata.normalize("NFKD", text))


@dataclass(frozen=True)
class SearchSettings:
    """Tuning, in the open. ``ef_search``: HNSW candidate list (hnsw.ef_search) of an index of the
    vectors; ``rerank`` / ``rerank_filtered``: how many of the nearest by the vectors' bits the
    vector side ranks exactly, without / with filters, over an index of their bits (0: exact
    search, no index, whatever the kind); ``candidates``: N,
    the results each side contributes to the fusion; ``rrf_k``: the RRF constant;
    ``max_scan_tuples``: how far a filtered HNSW scan may go to find N matches; ``exact_limit``:
    filters that leave at most this many datasets rank them exactly instead (0: never);
    ``text_cap``: the most matches of a text stage ranked (0: all);
    ``rare_matches`` / ``rare_share``: when the query's words together are rare enough that hybrid
    puts those datasets first (module docstring)."""
    # recall@10 of the HNSW side (no filter, the halfvec index) against exact search at 1,000,000
    # datasets (bench/million_search_bench.py, pgvector's build defaults m 16, ef_construction 64), two sets
    # of queries: 0.850 / 0.918 at 150, 0.895 / 0.950 at 300, 0.925 / 0.955 at 500, 0.965 / 0.972 at
    # 800; at 100,000: 0.938 at 150, 0.972 at 300. A graph built with m 24, ef_construction 128
    # reached at 150 what this one does at 300 (100,000: 0.972), in the same time a query, for 3.5
    # times the build (285 s against 81 s): the first sync pays for the build, a query for ef_search.
    ef_search: int = 800
    # When the model's index holds the vectors' bits (HARVESTER_INDEX_KIND=bit, store/vectors.py): the
    # vector side takes the ``rerank`` nearest by Hamming distance (hnsw.ef_search as large) and ranks
    # them exactly by their halfvec; under filters the ``rerank_filtered`` nearest that pass them (the
    # scan's cost is per vector it visits, and a filter leaving 15% makes it visit seven for each that
    # passes). On first_sync_bench's vectors (100,000, dozens of near-ties a query) the bits alone,
    # every Hamming distance taken, hold 0.890-0.920 / 0.932-0.948 / 0.952-0.966 of the exact top 10
    # in their nearest 100 / 400 / 1,000, so no graph over them can do better; the halfvec index gave
    # 0.968-0.990 (bench/index_kind_bench.py).
    # recall@10 at 1,000,000 stand-in vectors without a filter (bench/quantize_bench.py, m 16,
    # ef_construction 64): 0.823 at 100, 0.915 at 400, 0.962 at 1,000 (p95 13.8 / 18.8 / 38.8 ms);
    # the bits alone, every vector's Hamming distance taken: 0.985-0.994 at 100, 1.000 at 400.
    # 0: no index, every dataset passing the filters ranked exactly (exact search: benches' truth)
    rerank: int = 1000
    rerank_filtered: int = 400
    candidates: int = 20
    rrf_k: int = 60
    # A filtered HNSW scan costs about 8 µs per vector it visits (the vector's row and its
    # dataset_search row checked); when the filter's datasets are far from the query it visits many
    # before k pass: at 100,000 datasets a filter leaving 12,600 took 410 ms over 49,853 vectors,
    # where ranking the 12,600 exactly took 48 ms (bench/scale_bench.py). Hence a short scan and a
    # wide exact range (filtered p95 there: 250-380 ms before, 34-42 ms with these).
    max_scan_tuples: int = 10000
    exact_limit: int = 20000
    # hnsw.ef_search of a scan of a portal's own index (store/portal_indexes.py). Every vector it
    # holds passes the portal filter, yet a portal of 50,000-500,000 near-duplicate-rich vectors needs
    # the shared index's list: at a million datasets recall@10 was 0.82-0.96 at 200, 0.88-0.99 at 400
    # (at 100k, 0.97-1.0 at 200), p95 under 40 ms (bench/million_search_bench.py)
    portal_ef_search: int = 800
    # The text side ranks at most this many of a stage's matches (0: all): a common word matches
    # hundreds of thousands of datasets at a million, each ranked by ts_rank (100-700 ms,
    # bench/README.md "A million datasets"); a query whose words match fewer is ranked as before.
    text_cap: int = 10000
    # Rare exact matches (module docstring): text's best rare_matches (0: never; at most limit) of
    # the strict text stage are put first in hybrid when that stage's datasets are at most
    # rare_share of those the filters leave (a portal filter leaving 12 datasets makes no match
    # rare) and either at most rare_matches or the query is a code (issue 40: codes in up to 1% of
    # a catalogue, not only in up to 5 datasets).
    rare_matches: int = 5
    rare_share: float = 0.01
    # Hybrid: the vector side's statement runs on a second connection to the same database while the
    # text side's run on the caller's (store/beside.py), when the caller's holds no open transaction: the same
    # statements, so the same results, in the time of the slower side instead of the sum (issue 40:
    # a 1% filter at a million, vector side 25 ms, text side 2-60 ms). False: one after the other.
    beside: bool = True

    @classmethod
    def from_env(cls, environ=None) -> "SearchSettings":
        """The HARVESTER_SEARCH_* variables (config/settings.py: their ranges and messages)."""
        return fields_from_env(cls, "HARVESTER_SEARCH_", environ)


@dataclass(frozen=True)
class SearchFilters:
    """All optional; text matches ignore case (and accents, for organization and tag). ``format``: a resource's format ("csv" matches
    "CSV" and ".csv"); ``license``: license_id or license_title; ``since``/``until``: the dataset's
    metadata_modified (a date is its whole day; naive times are UTC)."""
    portal_url: str | None = None
    organization: str | None = None
    tag: str | None = None
    format: str | None = None
    license: str | None = None
    since: datetime | date | None = None
    until: datetime | date | None = None
    include_removed: bool = False


@dataclass
class SearchResult:
    model: str | None
    items: list[dict]
    # why another model than the active one was used, or why a side was left out; None otherwise
    note: str | None = None
    mode: str = "hybrid"
    timings: dict = field(default_factory=lambda: {"embed_ms": 0.0, "sql_ms": 0.0})

    @property
    def rows(self) -> list[tuple]:
        """(score, portal_url, title, url, source_id), best first (the earlier interface)."""
        return [(i["score"], i["portal_url"], i["title"], i["url"], i["source_id"]) for i in self.items]


# coverage per (database, portal) for a short while: counting it joins every live dataset to its
# vectors (a third of a second at 100k), too slow for every query while a model switch goes on
COVERAGE_TTL_SECS = 60.0
_coverage_cache: dict[tuple, tuple[float, dict]] = {}


def _coverage(conn, portal_url: str | None) -> dict[str, tuple[int, int]]:
    from harvester.store import vectors

    info = conn.info
    key = (info.host, info.port, info.dbname, portal_url)
    now = time.monotonic()
    cached = _coverage_cache.get(key)
    if cached and now - cached[0] < COVERAGE_TTL_SECS:
        return cached[1]
    cover = vectors.coverage(conn, portal_url)
    _coverage_cache[key] = (now, cover)
    return cover


def choose_provider(conn, portal_url: str | None, provider):
    """The provider to embed the query with, and a note when it is not ``provider``: during a
    model switch (vectors of another model are stored too), the model that covers more live
    datasets, until the new one catches up. With one model, nothing is counted (a catalog read)."""
    from harvester.embeddings import provider_for_model
    from harvester.store import vectors

    if not vectors.indexed_models(conn) - {provider.model}:
        return provider, None
    cover = _coverage(conn, portal_url)
    active = cover.get(provider.model, (0, 0))
    best = max(cover.items(), key=lambda item: item[1][0], default=None)
    if best and best[0] != provider.model and active[0] < active[1] and best[1][0] > active[0]:
        note = (f"{provider.model} covers {active[0]} of {active[1]} datasets so far; searching with "
                f"{best[0]} ({best[1][0]} of {best[1][1]})")
        return provider_for_model(best[0]), note
    return provider, None


# -- filters -------------------------------------------------------------------------------------
def _utc(value, end: bool) -> tuple[datetime, bool]:
    """(instant, inclusive) of a ``since`` or (``end``) ``until`` filter, read by domain.dates: a
    date is its whole day (``until`` a date: up to its last instant), naive times are UTC, text
    is what a user typed (parse_user_date)."""
    from harvester.domain.dates import as_instant, parse_user_date

    return (parse_user_date(value, end=end) if isinstance(value, str) else as_instant(value, end=end)), True


# (filter, dataset_search column, the value's key as the column holds it): GIN-indexed arrays
_ARRAY_FILTERS = (("organization", "organizations", "harvester_search_key({})"),
                  ("tag", "tags", "harvester_search_key({})"),
                  ("format", "formats", "harvester_format_key({})"),
                  ("license", "licenses", "lower(btrim({}))"))


def filter_sql(filters: SearchFilters, alias: str = "s") -> tuple[str, dict]:
    """A WHERE condition on dataset_search (as ``alias``) and its parameters. The values are folded
    the way sql/007_search.sql stores them (harvester_search_key, harvester_format_key)."""
    a = alias
    parts, params = ["true"], {}
    if not filters.include_removed:
        parts.append(f"{a}.removed_at IS NULL")
    if filters.portal_url:
        parts.append(f"{a}.portal_url = %(f_portal)s")
        params["f_portal"] = filters.portal_url
        params["f_portal_lexeme"] = portal_lexeme(filters.portal_url)
    for name, column, key in _ARRAY_FILTERS:
        if getattr(filters, name):
            parts.append(f"{a}.{column} @> ARRAY[{key.format(f'%(f_{name})s')}]")
            params[f"f_{name}"] = getattr(filters, name)
    if filters.since is not None:
        params["f_since"], _ = _utc(filters.since, end=False)
        parts.append(f"{a}.metadata_modified >= %(f_since)s")
    if filters.until is not None:
        params["f_until"], inclusive = _utc(filters.until, end=True)
        parts.append(f"{a}.metadata_modified {'<=' if inclusive else '<'} %(f_until)s")
    return " AND ".join(parts), params


def _narrowing(filters: SearchFilters) -> bool:
    """Whether the filters do more than leave removed datasets out."""
    return any(getattr(filters, name) not in (None, "") for name in
               ("portal_url", "organization", "tag", "format", "license", "since", "until"))


# -- the text side ---------------------------------------------------------------------------------
# Words of a query beyond this many are not relaxed one at a time (a pasted paragraph).
_RELAX_MAX_WORDS = 10


@dataclass(frozen=True)
class TextQuery:
    """tsquery texts, strictest first: every word; all words but one (three words or more); any
    word. Each ORs the configurations in use (each dataset was indexed with one of them)."""
    stages: tuple[str, ...] = ()

    @property
    def all_words(self) -> str | None:
        return self.stages[0] if self.stages else None


def _split_query(query: str) -> tuple[list[str], list[str], list[str]]:
    """(plain words, "phrases", -excluded words), accents folded."""
    text = fold(query)
    phrases = [p.strip() for p in _PHRASE.findall(text) if p.strip()]
    text = _PHRASE.sub(" ", text)
    negated = _NEGATED.findall(text)
    text = _NEGATED.sub(" ", text)
    return text.split(), phrases, negated


def _configs(conn) -> list[str]:
    """The text-search configurations datasets are indexed with (a skip scan of an index)."""
    rows = conn.execute(
        """
        WITH RECURSIVE c(cfg) AS (
            SELECT min(config::oid) FROM dataset_search
            UNION ALL
            SELECT (SELECT min(config::oid) FROM dataset_search WHERE config::oid > c.cfg)
            FROM c WHERE c.cfg IS NOT NULL)
        SELECT cfg::regconfig::text FROM c WHERE cfg IS NOT NULL
        """).fetchall()
    return [r[0] for r in rows] or ["simple"]


def _and(parts) -> str:
    return " & ".join(f"( {p} )" for p in parts)


def _or(parts) -> str:
    return " | ".join(f"( {p} )" for p in parts)


def text_query(conn, query: str) -> TextQuery:
    """The query as tsquery texts (TextQuery.stages). Never raises on odd input: each word, phrase
    and excluded word goes through plainto_tsquery / phraseto_tsquery, which read no operators
    (``& | ! ( :*`` are punctuation), and a word that is only punctuation or a stop word drops out."""
    words, phrases, negated = _split_query(query)
    configs = _configs(conn)
    terms = [("w", i, w) for i, w in enumerate(words)] + [("p", i, p) for i, p in enumerate(phrases)] \
        + [("n", i, n) for i, n in enumerate(negated)]
    if not terms:
        return TextQuery()
    rows = conn.execute(
        """
        SELECT c, t.kind, t.i, CASE WHEN t.kind = 'p' THEN phraseto_tsquery(c::regconfig, t.term)::text
                                    ELSE plainto_tsquery(c::regconfig, t.term)::text END
        FROM unnest(%(configs)s::text[]) WITH ORDINALITY AS cs(c, ci),
             unnest(%(kinds)s::text[], %(idx)s::int[], %(terms)s::text[]) AS t(kind, i, term)
        ORDER BY cs.ci, t.kind, t.i
        """, {"configs": configs, "kinds": [t[0] for t in terms], "idx": [t[1] for t in terms],
              "terms": [t[2] for t in terms]}).fetchall()
    per_config: dict[str, dict[str, list[str]]] = {}
    for config, kind, _, tsq in rows:
        if tsq:
            per_config.setdefault(config, {"w": [], "p": [], "n": []})[kind].append(tsq)
    stages: list[list[str]] = [[], [], []]
    for parts in per_config.values():
        plain, phrase, excluded = parts["w"], parts["p"], parts["n"]
        if not plain and not phrase:
            continue
        exclude = f" & !( {_or(excluded)} )" if excluded else ""
        stages[0].append(f"( {_and(plain + phrase)} ){exclude}")
        if 3 <= len(plain) <= _RELAX_MAX_WORDS:
            all_but_one = [_and(plain[:i] + plain[i + 1:]) for i in range(len(plain))]
            stages[1].append(f"( {_or(all_but_one)} )" + (f" & ( {_and(phrase)} )" if phrase else "") + exclude)
        stages[2].append(f"( {_or(plain + phrase)} ){exclude}")
    found = []
    for stage in stages:
        text = _or(dict.fromkeys(stage)) if stage else None  # the same tsquery from several configs once
        if text and text not in found:
            found.append(text)
    return TextQuery(tuple(found))


def _title_key(text: str) -> str:
    return " ".join(re.findall(r"\w+", fold(text or "").lower()))


# The text side reads a small filter's rows when the stage's matches (PostgreSQL's estimate) are
# more than this many times the filter's datasets. At 1,000,000 datasets, portals of 1,000 and
# 10,000 (bench/million_search_bench.py's catalogue, warm): a relaxed stage matching 44,000 to
# 964,000 datasets took 92-2,339 ms through the full-text index and 4-90 ms through the rows; a
# strict stage matching 99-7,660 took 5-123 ms through the index, 4-85 ms through the rows.
_ROWS_PER_INDEX_ENTRY = 4
# The title's words of a dataset's document, as sql/030's index has them (the same expression, so
# that PostgreSQL uses the index).
_TITLE_WORDS = "ts_filter(s.document, '{a}')"
# What the full-text index holds (sql/035): each document with its portal as one more lexeme,
# 'p:' and the md5 of the portal URL (md5 of the URL's UTF-8 bytes, as in Python). A user's words
# never form it: the query parser splits at the colon.
_MATCHED = "(s.document || array_to_tsvector(ARRAY['p:' || md5(s.portal_url)]))"


def portal_lexeme(portal_url: str) -> str:
    """The tsquery of a portal's lexeme in the full-text index (sql/035)."""
    return f"'p:{hashlib.md5(portal_url.encode('utf-8')).hexdigest()}'"


def _matches(params: dict, name: str = "tsq") -> str:
    """The condition "the document matches %(name)s" as the full-text index answers it: under a
    portal filter with the portal's lexeme, so that GIN gives only that portal's matches (a third
    to two thirds faster than ANDing them with a bitmap of the portal's rows at a million datasets);
    without one, the words alone. The same rows as ``s.document @@ ...`` under the same filters."""
    # the document's own test first: a scan of rows (a common word without a filter, stopping at
    # the cap) tests it on every row, and the expression (an md5 and a copy of the document) only on
    # the rows that match
    if "f_portal_lexeme" in params:
        return f"s.document @@ %({name})s::tsquery AND {_MATCHED} @@ (%({name})s::tsquery && %(f_portal_lexeme)s::tsquery)"
    return f"s.document @@ %({name})s::tsquery AND {_MATCHED} @@ %({name})s::tsquery"
# The title matches are read first (sql/030's index) when the stage may have more matches than the
# cap: PostgreSQL expects more than this share of the cap in the whole catalogue (its estimate of
# words found together, often in the same titles, can be several times too low: a wide margin;
# under the cap the order read in changes nothing, only the time: 3.4 ms more a stage at 100,000).
_TITLES_FIRST_SHARE = 0.1
# Under filters, through the index, the title matches are read first at once (not after one read of
# every match under the filters, counted up to the cap) when PostgreSQL expects at least this share
# of the cap under them (its estimate of the stage's matches times the filters' share of the
# catalogue): a stage past the cap pays the one read, then titles first; one under it, titles first
# in vain (the full-text index read twice, the title matches' rows outside the filter read). At
# 1,000,000 datasets, p95 of hybrid under a 5% portal 709 -> 231 ms near the query, 291 -> 181 ms
# far from it (beside the seqscan-free plans); 0.1 here gave 251 and 314. Without a filter the
# estimate is the stage's alone and _TITLES_FIRST_SHARE decides (at 0.5, p50 53 -> 67 ms: more
# stages past the cap read twice).
_TITLES_FIRST_EXPECTED = 0.5


def _text_side(conn, tsquery: str, where: str, params: dict, limit: int, exclude: list[int] = (),
               cap: int = 0, few: bool = False, titles: bool = True, narrowing: bool = True) -> list[tuple]:
    """(dataset id, ts_rank) of the best matches, best first. ``cap`` (SearchSettings.text_cap; 0:
    none): at most that many matches are ranked: first those whose title holds the query's words
    (sql/030's index of the title's words; ts_rank weighs a title word five times a description's,
    so the best matches are there), then the others the full-text index gives (in table order) up
    to the cap. A query whose words match fewer is ranked exactly as without a cap; one of very
    common words (hundreds of thousands of matches at a million datasets) is ranked within a
    bounded set that holds its title matches (up to the cap), the datasets nearest in meaning left
    to the vector side and the fusion. ``titles=False``: every match under the filters read once
    and ranked, counted as it is read, and titles first only when that passed the cap (search()
    asks so when PostgreSQL expects the stage well under the cap, _TITLES_FIRST_SHARE, or the
    filters to hold less than _TITLES_FIRST_EXPECTED of the cap's matches: the same ranking, without reading the index twice and the title matches' rows
    outside the filter: at a million datasets, 'boundary files' under a 5% portal, 87,191 matches
    of which 6,078 on the portal, 115 ms titles first, one read 40-50 ms).

    ``few``: the filters leave few datasets (PostgreSQL expects at most exact_limit, and fewer than
    a quarter of the stage's matches, _ROWS_PER_INDEX_ENTRY): their rows are read and each one's text
    checked, not the full-text index. Through the index, a relaxed stage
    (any word of "county water data") is a bitmap of every dataset holding a common word, a million
    at a million datasets, built before the filter narrows it: 0.1-2.3 s for a portal of 1,000 or
    10,000 (bench/million_search_bench.py), against 4-90 ms reading the portal's rows. The filter's rows come in dataset order (sql/028's index for a
    portal), the same matches, ranked the same way."""
    values = {**params, "tsq": tsquery, "n": limit, "exclude": list(exclude), "cap": cap or None}
    if few:
        statement = f"""
        SELECT m.dataset_id, ts_rank(m.document, %(tsq)s::tsquery, 1) AS rank
        FROM (SELECT s.dataset_id, s.document FROM dataset_search s
              WHERE s.dataset_id = ANY(ARRAY(SELECT s.dataset_id FROM dataset_search s WHERE {where}
                                             ORDER BY s.dataset_id))
                AND (s.document @@ %(tsq)s::tsquery) IS TRUE AND {where}
                AND NOT (s.dataset_id = ANY(%(exclude)s))
              LIMIT %(cap)s) m
        ORDER BY rank DESC, m.dataset_id
        LIMIT %(n)s
        """
        return [(r[0], float(r[1])) for r in conn.execute(statement, values, prepare=False).fetchall()]
    if not (cap and titles):
        # every match under the filters ranked, read once through the index, when they are at most
        # the cap (counted up to the cap + 1 as they are read); more than the cap: titles first
        statement = f"""
        WITH m AS MATERIALIZED (
            SELECT s.dataset_id, ts_rank(s.document, %(tsq)s::tsquery, 1) AS rank FROM dataset_search s
            WHERE {_matches(params)} AND {where} AND NOT (s.dataset_id = ANY(%(exclude)s))
            LIMIT %(over)s)
        SELECT m.dataset_id, m.rank, (SELECT count(*) FROM m) AS found
        FROM m
        ORDER BY m.rank DESC, m.dataset_id
        LIMIT %(n)s
        """
        rows = _text_rows(conn, statement, {**values, "over": cap + 1 if cap else None}, found=True)
        if not cap or rows is not None:
            return rows
    # the title's matches first (sql/030's index of the title's words: ts_rank weighs a title
    # word five times a description's), then the others up to the cap: both parts together are
    # every match when there are fewer than the cap, so those are ranked exactly as uncapped.
    # Each part ranks as it reads (the CTE keeps ids and ranks, not documents) and the second
    # tells a title match by its title, not by a join (no plan can turn it into a loop), only
    # on the rows that match (the inner LIMIT keeps that test out of the scan's own conditions;
    # the first cap rows hold at least cap - |t| that are not title matches, when there are).
    statement = f"""
    WITH t AS MATERIALIZED (
        SELECT s.dataset_id, ts_rank(s.document, %(tsq)s::tsquery, 1) AS rank FROM dataset_search s
        WHERE {_TITLE_WORDS} @@ %(tsq)s::tsquery AND {_matches(params)} AND {where}
          AND NOT (s.dataset_id = ANY(%(exclude)s))
        LIMIT %(cap)s)
    SELECT m.dataset_id, m.rank
    FROM (SELECT t.dataset_id, t.rank FROM t
          UNION ALL
          (SELECT f.dataset_id, ts_rank(f.document, %(tsq)s::tsquery, 1)
           FROM (SELECT s.dataset_id, s.document FROM dataset_search s
                 WHERE {_matches(params)} AND {where} AND NOT (s.dataset_id = ANY(%(exclude)s))
                 LIMIT %(cap)s) f
           WHERE NOT ({_TITLE_WORDS.replace("s.", "f.")} @@ %(tsq)s::tsquery)
           LIMIT greatest(0, %(cap)s - (SELECT count(*) FROM t)))) m
    ORDER BY m.rank DESC, m.dataset_id
    LIMIT %(n)s
    """
    # without a narrowing filter the matches do lie evenly: a scan in table order that stops at the
    # cap is then what a very common word wants
    return _text_rows(conn, statement, values, seqscan=not narrowing)


def _text_rows(conn, statement: str, values: dict, found: bool = False, seqscan: bool = True) -> list[tuple] | None:
    """The text statement's (dataset id, ts_rank) rows. ``found``: the statement's third column
    counts what it read; None when that passed the cap (``values["over"]`` = the cap + 1).

    Never a prepared statement (psycopg prepares a query text run five times on a connection, and
    PostgreSQL may then plan it once for every value): the best plan of a text statement depends on
    its values, how common the words are and how large the filter is, and a plan made for none of
    them doubled hybrid's p50 under a 0.1% portal at a million datasets (16 -> 32 ms; 1%: 52 -> 81).

    ``seqscan=False`` (the titles-first statement under a narrowing filter): planned without
    sequential scans (set for the statement alone, in a transaction, the caller's setting put
    back). Its LIMIT over an unmaterialized read makes PostgreSQL expect a scan of the table in order
    to stop early, as if the matches lay evenly across it; a filter's rows (a portal's) lie
    together, so it read 590,000 rows of a million to find 7,838 of a 15% portal: 612 ms, against 50
    ms through the indexes. The one read under the cap is a materialized read PostgreSQL expects to
    finish (no LIMIT to stop early at)."""
    if seqscan:
        rows = conn.execute(statement, values, prepare=False).fetchall()
    else:
        with conn.transaction():
            before = conn.execute("SELECT current_setting('enable_seqscan'), set_config('enable_seqscan', 'off', true)"
                                  ).fetchone()[0]
            rows = conn.execute(statement, values, prepare=False).fetchall()
            conn.execute("SELECT set_config('enable_seqscan', %s, true)", (before,))
    if found and rows and values.get("over") is not None and rows[0][2] >= values["over"]:
        return None
    return [(r[0], float(r[1])) for r in rows]


def _text_one_pass(conn, stages: tuple[str, ...], where: str, params: dict, limit: int,
                   exclude: list[int] = ()) -> list[tuple[int, list[tuple]]]:
    """The text stages under filters that leave few datasets, from the first that reads the filter's
    rows (``stages``: it and the broader ones after it), in one statement: the filter's rows read
    once (in dataset order, sql/028's index for a portal; ``exclude``: the hits of the stages
    before), each row's stage the first of ``stages`` its document matches, ranked by that stage's
    ts_rank. Per stage: (how many rows have it as their first stage, its best ``limit`` as
    (dataset id, ts_rank), best first). search() takes a stage's hits from here as the staged loop
    took them from _text_side: a later stage is only asked while the stages before found fewer than
    ``limit`` together, so each of those gave all its matches and the rows a stage excludes are
    exactly those matching an earlier one; a stage with more rows than the cap is not taken from
    here (_text_side ranks the first cap of them, through the rows or the index)."""
    names = [f"t{i}" for i in range(len(stages))]
    first = " ".join(f"WHEN (s.document @@ %({t})s::tsquery) IS TRUE THEN {i}" for i, t in enumerate(names))
    if len(names) > 1:
        # Every stage implies the last, the broadest (text_query: all words, or all but one, imply
        # any word, under the same exclusions): a row that misses it misses them all and is tested
        # once instead of once a stage. Far from the query, most of a filter's rows hold none of its
        # words: at a million datasets under a 1% portal, the read took 39-41 ms instead of 44 (p50).
        first = f"WHEN (s.document @@ %({names[-1]})s::tsquery) IS NOT TRUE THEN NULL " + first
    rank = " ".join(f"WHEN {i} THEN ts_rank(m.document, %({t})s::tsquery, 1)" for i, t in enumerate(names))
    statement = f"""
        SELECT r.stage, r.total, r.dataset_id, r.rank
        FROM (SELECT k.stage, k.dataset_id, k.rank, count(*) OVER (PARTITION BY k.stage) AS total,
                     row_number() OVER (PARTITION BY k.stage ORDER BY k.rank DESC, k.dataset_id) AS place
              FROM (SELECT m.stage, m.dataset_id, CASE m.stage {rank} END AS rank
                    FROM (SELECT s.dataset_id, s.document, CASE {first} END AS stage
                          FROM dataset_search s
                          WHERE s.dataset_id = ANY(ARRAY(SELECT s.dataset_id FROM dataset_search s WHERE {where}
                                                         ORDER BY s.dataset_id))
                            AND {where} AND NOT (s.dataset_id = ANY(%(exclude)s)) OFFSET 0) m
                    WHERE m.stage IS NOT NULL OFFSET 0) k) r
        WHERE r.place <= %(n)s
        ORDER BY r.stage, r.place
        """
    result: list[tuple[int, list[tuple]]] = [(0, []) for _ in stages]
    for stage, total, dataset_id, value in conn.execute(
            statement, {**params, **dict(zip(names, stages)), "n": limit, "exclude": list(exclude)},
            prepare=False).fetchall():  # planned for its values (_text_rows)
        result[stage][1].append((dataset_id, float(value)))
        result[stage] = (total, result[stage][1])
    return result


# -- the vector side -------------------------------------------------------------------------------
def _vector_statements(dimension: int, where: str, kind: str | None = None):
    """(HNSW statement, exact statement) of the vector side."""
    return _hnsw_statement(dimension, where, kind), _exact_statement(dimension, where)


def _hnsw_statement(dimension: int, where: str, kind: str | None):
    """The vector side over the model's shared index: the nearest vectors of live datasets that
    pass the filters, as (dataset id, cosine similarity). ``kind``: that of the model's index
    (vectors.search_kind): over the bits, the ``%(rerank)s`` nearest by Hamming distance that pass
    the filters, ranked exactly (vectors.nearest)."""
    from psycopg import sql

    from harvester.store import vectors

    nearest = vectors.nearest(dimension, kind, sql.SQL(
        "EXISTS (SELECT 1 FROM dataset_search s WHERE s.content_hash = e.content_hash AND {where})"
    ).format(where=sql.SQL(where)))
    return sql.SQL(
        """
        WITH nn AS MATERIALIZED ({nearest})
        SELECT s.dataset_id, 1 - nn.distance, nn.candidates
        FROM nn JOIN dataset_search s ON s.content_hash = nn.content_hash
        WHERE {where}
        ORDER BY nn.distance, s.dataset_id
        LIMIT %(n)s
        """).format(nearest=nearest, where=sql.SQL(where))


def _exact_statement(dimension: int, where: str):
    """The vector side without an index: every live dataset passing the filters compared."""
    from psycopg import sql

    # Every distance computed first (materialized CTEs), between the stored half-precision vectors
    # (sql/019) and the query cast as the index casts it, so both paths rank alike, then sorted: an ORDER BY on the distance itself would be planned as
    # an HNSW scan, which without the iterative scan stops at ef_search and may find nothing that
    # passes the filters. The vectors come from dataset_vectors (sql/010), fetched as one sorted
    # list of ids: rows in dataset order, read in that order; a copy is of the model when its scope
    # is one of the model's (sql/041). Datasets without a current copy of the model (a run not
    # committed yet, a model switch) are looked up in embeddings.
    return sql.SQL(
        """
        WITH f AS MATERIALIZED (
            SELECT s.dataset_id, s.content_hash FROM dataset_search s WHERE {where}
        ), c AS MATERIALIZED (
            SELECT v.dataset_id, v.content_hash, v.embedding <=> %(query)s::halfvec({dim}) AS distance
            FROM dataset_vectors v
            WHERE v.dataset_id = ANY(ARRAY(SELECT f.dataset_id FROM f))
              AND v.scope = ANY(ARRAY(SELECT k.id FROM vector_scopes k WHERE k.model = %(model)s))
        ), d AS (
            SELECT f.dataset_id, coalesce(c.distance, (
                       SELECT e.embedding <=> %(query)s::halfvec({dim}) FROM embeddings e
                       WHERE e.content_hash = f.content_hash AND e.model = %(model_id)s::integer)) AS distance
            FROM f LEFT JOIN c ON c.dataset_id = f.dataset_id AND c.content_hash = f.content_hash
        )
        SELECT dataset_id, 1 - distance FROM d WHERE distance IS NOT NULL ORDER BY distance, dataset_id LIMIT %(n)s
        """).format(dim=sql.Literal(int(dimension)), where=sql.SQL(where))


def _portal_statement(dimension: int, where: str, scope: int):
    """The vector side's statement over a portal's own HNSW index (sql/029, store/portal_indexes.py):
    the scope of the portal's copies of the model (sql/041) is a literal, so that the planner matches
    the partial index's predicate (a parameter would not match it, and psycopg prepares a statement
    run five times: a generic plan).
    The other filters are checked per vector through dataset_search, as is that the copy is of the
    dataset's current text: a filter of the index scan (the OFFSET 0 keeps PostgreSQL from turning
    the EXISTS into a join, planned as a sort of every vector of the portal)."""
    from psycopg import sql

    from harvester.store import portal_indexes, vectors

    kind = portal_indexes.KIND
    expr, q = vectors.index_expression(dimension, kind), vectors.query_cast(dimension, kind=kind)
    return sql.SQL(
        """
        WITH nn AS MATERIALIZED (
            SELECT v.dataset_id, {expr} <=> {q} AS distance
            FROM dataset_vectors v
            WHERE v.scope = {scope}
              AND EXISTS (SELECT 1 FROM dataset_search s WHERE s.dataset_id = v.dataset_id
                            AND s.content_hash = v.content_hash AND {where} OFFSET 0)
            ORDER BY {expr} <=> {q}
            LIMIT %(n)s
        )
        SELECT nn.dataset_id, 1 - nn.distance FROM nn ORDER BY nn.distance, nn.dataset_id LIMIT %(n)s
        """).format(expr=expr, q=q, scope=sql.Literal(int(scope)), where=sql.SQL(where))


_SCAN_SETTINGS = ("hnsw.ef_search", "hnsw.iterative_scan", "hnsw.max_scan_tuples")


@contextlib.contextmanager
def _hnsw_scan(conn, ef_search: int, max_scan_tuples: int):
    """A transaction in which the HNSW scan's settings hold, for it only. Relaxed order: the scan
    goes on past ef_search until enough rows pass the filters; the outer ORDER BY restores the exact
    order of what it found. Inside a caller's open transaction that is a savepoint, and a released
    savepoint keeps what SET LOCAL set until the caller's transaction ends: the caller's values are
    then put back (a failed scan rolls the savepoint back, and them with it)."""
    from psycopg.pq import TransactionStatus

    inside = conn.info.transaction_status == TransactionStatus.INTRANS
    with conn.transaction():
        before = conn.execute(
            "SELECT " + ", ".join(f"current_setting('{name}', true)" for name in _SCAN_SETTINGS) +
            ", set_config('hnsw.ef_search', %s, true), set_config('hnsw.iterative_scan', 'relaxed_order', true),"
            " set_config('hnsw.max_scan_tuples', %s, true)", (str(ef_search), str(max_scan_tuples))).fetchone()
        yield
        if inside:
            # a setting the session had not known yet (pgvector loads when first used) goes back to
            # its default
            conn.execute(
                "SELECT set_config(b.name, coalesce(b.value, s.reset_val), true)"
                " FROM unnest(%s::text[], %s::text[]) AS b(name, value) JOIN pg_settings s ON s.name = b.name",
                (list(_SCAN_SETTINGS), list(before[:len(_SCAN_SETTINGS)])))


def _estimated_matches(conn, where: str, params: dict) -> float:
    """PostgreSQL's estimate of the datasets passing the filters (a plan, not a count: well under a
    millisecond; the statistics of dataset_search's columns and arrays make it close)."""
    plan = conn.execute(f"EXPLAIN (FORMAT JSON) SELECT 1 FROM dataset_search s WHERE {where}", params).fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return float(plan[0]["Plan"]["Plan Rows"])


def _vector_side(conn, model: str, dimension: int, query_vector, where: str, params: dict,
                 settings: SearchSettings, limit: int, narrowing: bool = True, few: bool | None = None) -> list[tuple]:
    """(dataset id, cosine similarity) of the nearest datasets passing the filters, best first.
    The filters are checked inside the HNSW index scan (an EXISTS on dataset_search per vector),
    which pgvector's iterative scan continues until ``limit`` vectors pass (or max_scan_tuples).
    Filters that PostgreSQL expects to leave at most ``settings.exact_limit`` datasets rank those
    exactly instead (every one compared, no index); so does a filtered scan that ended short of
    ``limit``: whenever ``limit`` datasets pass the filters, ``limit`` come back.
    A portal filter on a portal with its own usable HNSW index (store/portal_indexes.py) scans
    that index instead of the shared one, with ``settings.portal_ef_search``. When the shared
    index holds the vectors' bits, its ``settings.rerank`` nearest (``rerank_filtered`` under
    filters) are ranked exactly (vectors.nearest)."""
    import numpy as np

    from harvester.store import portal_indexes, vectors

    rerank = max(limit, settings.rerank_filtered if narrowing else settings.rerank)
    number = vectors.model_id(conn, model)
    values = {**params, "model": model, "model_id": -1 if number is None else number, "n": limit, "rerank": rerank,
              "query": np.asarray(query_vector, dtype=np.float32)}
    if few is None:  # (``few``: search() has asked already)
        few = narrowing and _estimated_matches(conn, where, params) <= settings.exact_limit
    # never prepared, as the text side's statements (_text_rows): planned for the filter's values
    if few or not settings.rerank:  # rerank 0: exact search, every passing dataset compared
        exact = _exact_statement(dimension, where)
        return [(r[0], float(r[1])) for r in conn.execute(exact, values, prepare=False).fetchall()]
    portal = params.get("f_portal")
    max_scan_tuples, kind = settings.max_scan_tuples, None
    scope = portal_indexes.usable(conn, portal, model) if portal else None
    if scope is not None:
        statement, ef_search = _portal_statement(dimension, where, scope), settings.portal_ef_search
    else:
        kind = vectors.search_kind(conn, model)
        statement = _hnsw_statement(dimension, where, kind)
        ef_search = settings.ef_search
        if kind == "bit":  # pgvector's hnsw.ef_search is at most 1,000; past it the iterative scan goes on
            ef_search, max_scan_tuples = min(1000, rerank), max(max_scan_tuples, rerank)
    with _hnsw_scan(conn, ef_search, max_scan_tuples):
        rows = conn.execute(statement, values, prepare=False).fetchall()
    # the estimate was too high, or max_scan_tuples was reached: fewer than limit passed; over the
    # bits, fewer than the rerank candidates did (their top 10 would be ranked from too few: at a
    # million datasets under a sparse filter, 68 of 400 gave recall@10 0.58)
    if narrowing and (len(rows) < limit or kind == "bit" and rows[0][2] < rerank):
        rows = conn.execute(_exact_statement(dimension, where), values, prepare=False).fetchall()
    return [(r[0], float(r[1])) for r in rows]


def explain_vector_side(conn, model: str, dimension: int, query_vector, filters: SearchFilters | None = None,
                        settings: SearchSettings | None = None, exact: bool = False, portal_index: bool = False) -> str:
    """EXPLAIN of the HNSW statement of the vector side, or (``exact``) of its exact statement, or
    (``portal_index``) of its statement over the filter's portal's own index (tests and tuning)."""
    import numpy as np
    from psycopg import sql

    settings = settings or SearchSettings.from_env()
    filters = filters or SearchFilters()
    where, params = filter_sql(filters)
    from harvester.store import vectors

    hnsw, exact_statement = _vector_statements(dimension, where, vectors.search_kind(conn, model))
    if portal_index:
        scope = vectors.existing_scope(conn, filters.portal_url, model)
        hnsw = _portal_statement(dimension, where, -1 if scope is None else scope)
    with conn.transaction():
        conn.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true)")
        plan = conn.execute(sql.SQL("EXPLAIN ") + (exact_statement if exact else hnsw), {
            **params, "model": model, "model_id": vectors.model_id(conn, model) or -1, "n": settings.candidates,
            "rerank": settings.rerank,
            "query": np.asarray(query_vector, dtype=np.float32)}).fetchall()
    return "\n".join(r[0] for r in plan)


# -- the search ------------------------------------------------------------------------------------
def _items(conn, ids: list[int], tsquery: str | None) -> dict[int, dict]:
    rows = conn.execute(
        """
        SELECT d.id, d.portal_url, d.title, d.url, d.organization, d.source_id, d.metadata_modified, d.removed_at,
               CASE WHEN %(tsq)s::text IS NULL THEN left(coalesce(nullif(d.description, ''), d.title), 240)
                    ELSE ts_headline(d.search_config,
                                     translate(harvester_fold(left(coalesce(nullif(d.description, ''), d.title),
                                                                   20000)), %(marks)s, ''),
                                     %(tsq)s::tsquery,
                                     %(options)s) END
        FROM datasets d WHERE d.id = ANY(%(ids)s)
        """, {"ids": ids, "tsq": tsquery, "marks": snippet.START + snippet.STOP,
              # matches between marks no text keeps (removed above): the description's own ** and
              # markup are dropped around them (domain/snippet.py)
              "options": f'StartSel={snippet.START}, StopSel={snippet.STOP}, MaxWords=35, MinWords=15, '
                         'MaxFragments=2, FragmentDelimiter=" … "'}).fetchall()
    return {r[0]: {"portal_url": r[1], "title": r[2], "url": r[3], "organization": r[4], "source_id": r[5],
                   "metadata_modified": r[6], "removed_at": r[7], "snippet": snippet.plain_snippet(r[8])}
            for r in rows}


def _fuse(vector_hits: list[tuple], text_hits: list[tuple], groups: dict[int, dict], n: int, k: int,
          collapse: bool) -> dict:
    """Reciprocal rank fusion of the two sides' (dataset id, value) hits, best first. ``collapse``:
    the members of a duplicate group (``groups``: duplicates.groups_for) are one entry, ranked on
    each side by its best member, and each side keeps its best ``n`` entries. Each entry: score,
    matched (sides), similarity / text_rank (of its best member on that side), ranks, members
    (every member that matched -> its own fused score) and shown (the member to show: the
    canonical one if it matched, else the best-scored one)."""
    def key(dataset_id: int) -> tuple:
        group = groups.get(dataset_id) if collapse else None
        return ("group", group["group_id"]) if group else ("dataset", dataset_id)

    fused: dict[tuple, dict] = {}
    for side, hits in (("vector", vector_hits), ("text", text_hits)):
        seen: dict[tuple, int] = {}
        for position, (dataset_id, value) in enumerate(hits, 1):
            entry_key = key(dataset_id)
            if entry_key not in seen:
                if len(seen) == n:
                    continue  # beyond this side's n entries; a member of a ranked entry still counts below
                seen[entry_key] = len(seen) + 1
                entry = fused.setdefault(entry_key, {"score": 0.0, "matched": [], "similarity": None,
                                                     "text_rank": None, "ranks": {}, "members": {}})
                rank = seen[entry_key]
                entry["score"] += 1.0 / (k + rank)
                entry["matched"].append(side)
                entry["ranks"][side] = rank
                entry["similarity" if side == "vector" else "text_rank"] = value
            members = fused[entry_key]["members"]
            members[dataset_id] = members.get(dataset_id, 0.0) + 1.0 / (k + position)
    for entry in fused.values():
        members = entry["members"]
        canonical = next((groups[i]["canonical_id"] for i in members if i in groups), None) if collapse else None
        entry["shown"] = canonical if canonical in members else \
            min(members, key=lambda i: (-members[i], i))
    return fused


# A query word written in the records as a code: two capitals or more ("IFPA", "ProUni", "CBSAs")
# in a field that is not itself shouted (more lower-case letters than capitals), or letters and
# digits together ("sp500", "3w").
_CODE_QUERY_WORDS = 2
_HAS_DIGIT_AND_LETTER = re.compile(r"(?=.*\d)(?=.*[^\W\d_])")


def _written_as_code(word: str, texts: list[str]) -> bool:
    if _HAS_DIGIT_AND_LETTER.match(word) or not re.search(r"[^\W\d_]", word):
        return True  # a code with digits, or a number (a year beside a code: "ustr foia 2009")
    # the word, or it with an ending of one or two letters ("CBSAs" for "cbsa"), between non-letters
    pattern = re.compile(rf"(?<![^\W_]){re.escape(word)}[^\W\d_]{{0,2}}(?![^\W_])", re.IGNORECASE)
    for text in texts:
        if sum(c.islower() for c in text) <= sum(c.isupper() for c in text):
            continue  # a shouted field: capitals say nothing there
        if any(sum(c.isupper() for c in m.group()) >= 2 for m in pattern.finditer(text)):
            return True
    return False


def _looks_like_code(conn, query: str, dataset_ids: list[int]) -> bool:
    """Whether ``query`` is one or two codes or acronyms (module docstring): at most _CODE_QUERY_WORDS
    words, not only numbers, each written as a code (_written_as_code) in the title, description,
    tags or organization of at least one of ``dataset_ids`` (text's best: a handful of rows read)."""
    words, phrases, negated = _split_query(query)
    words = [w for w in words if re.search(r"\w", w)]
    if phrases or not words or len(words) > _CODE_QUERY_WORDS or not any(re.search(r"[^\W\d_]", w) for w in words):
        return False
    rows = conn.execute(
        """
        SELECT harvester_fold(coalesce(d.title, '')), harvester_fold(left(coalesce(d.description, ''), 20000)),
               harvester_fold(coalesce(d.organization, '')), harvester_fold(coalesce(d.tags::text, ''))
        FROM datasets d WHERE d.id = ANY(%s)
        """, (dataset_ids,)).fetchall()
    texts = [text for row in rows for text in row if text]
    return all(_written_as_code(fold(w), texts) for w in words)


def _strict_count(conn, tsquery: str, where: str, params: dict, bound: int) -> int:
    """How many datasets passing the filters hold every word, counted up to ``bound`` + 1 (a capped
    count through the GIN index: never every match of a common word)."""
    return conn.execute(
        f"""
        SELECT count(*) FROM (SELECT 1 FROM dataset_search s
                              WHERE {_matches(params)} AND {where} LIMIT %(cap)s) m
        """, {**params, "tsq": tsquery, "cap": bound + 1}).fetchone()[0]


def _rare_entries(conn, query: str, tsquery: str | None, strict: list[int], complete: bool, fused: dict,
                  where: str, params: dict, settings: SearchSettings, limit: int,
                  passing: float | None = None) -> list[dict]:
    """The fused entries to put first as rare exact matches (module docstring), or none: text's best
    ``min(rare_matches, limit)`` entries of the strict stage (``strict``: its datasets, best first;
    ``complete``: all of them), ordered as text mode orders them (text rank and title boost), when
    the strict stage's datasets are at least one and at most ``rare_share`` of the datasets passing
    the filters (PostgreSQL's estimate; ``passing``: search() has asked already) and either at most
    ``rare_matches`` or the query is a code."""
    top = min(settings.rare_matches, limit)
    if not strict or not top or tsquery is None:
        return []
    bound = int(settings.rare_share * (_estimated_matches(conn, where, params) if passing is None else passing))
    few = complete and len(strict) <= settings.rare_matches
    if len(strict) > bound:
        return []
    strict_set = set(strict)
    k = settings.rrf_k
    entries = [e for e in fused.values() if "text" in e["ranks"] and strict_set & e["members"].keys()]
    entries.sort(key=lambda e: (-(1.0 / (k + e["ranks"]["text"]) + e.get("title_bonus", 0.0)), e["ranks"]["text"]))
    entries = entries[:top]
    if not entries or few:
        return entries
    if not _looks_like_code(conn, query, [m for e in entries for m in e["members"] if m in strict_set]):
        return []
    if not complete and _strict_count(conn, tsquery, where, params, bound) > bound:
        return []
    return entries


def search(conn, query: str, *, mode: str = "hybrid", filters: SearchFilters | None = None, limit: int = 10,
           settings: SearchSettings | None = None, query_vector=None, provider=None,
           portal_url: str | None = None, all_copies: bool = False) -> SearchResult:
    """The best ``limit`` datasets for ``query``, a duplicate group once (``all_copies``: each of its
    members). ``query_vector``: the query already embedded (with the model search would choose):
    no embedding call. ``portal_url``: shorthand for ``filters.portal_url``. Raises ValueError for
    a bad mode or limit; EmbeddingError when the provider fails in ``vector`` mode; in ``hybrid``
    mode the text side answers alone then, with a note. TerminalEmbeddingError in both modes when
    the provider is misconfigured or the stored vectors do not fit its model (an operator must
    act; hiding it would leave search degraded)."""
    from harvester.embeddings import EmbeddingError, TerminalEmbeddingError, get_provider
    from harvester.store import beside as second
    from harvester.store import duplicates, vectors

    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if limit < 1:
        raise ValueError("limit must be at least 1")
    filters = filters or SearchFilters()
    if portal_url and not filters.portal_url:
        filters = SearchFilters(**{**filters.__dict__, "portal_url": portal_url})
    settings = settings or SearchSettings.from_env()
    n = max(settings.candidates, limit)
    # collapsing groups leaves fewer: each side fetches more, when the database holds any group
    grouped = not all_copies and duplicates.any_groups(conn)
    fetch = 2 * n if grouped else n
    timings = {"embed_ms": 0.0, "sql_ms": 0.0}
    where, params = filter_sql(filters)
    model, notes = None, []
    # filters that leave few datasets: the vector side ranks them all (_vector_side), and the text
    # side reads their rows where the full-text index would give many more (_text_side)
    passing = _estimated_matches(conn, where, params) if _narrowing(filters) else None
    few = passing is not None and passing <= settings.exact_limit

    vector_hits: list[tuple] = []
    if mode in ("hybrid", "vector"):
        try:
            chosen, note = choose_provider(conn, filters.portal_url, provider or get_provider())
            if note:
                notes.append(note)
            model = chosen.model
            if query_vector is None:
                started = time.perf_counter()
                query_vector = chosen.embed_query(query)
                timings["embed_ms"] = (time.perf_counter() - started) * 1000
            dimension = len(query_vector)
            try:
                vectors.check_dimension(conn, chosen.model, dimension)
            except vectors.DimensionMismatch as exc:
                raise TerminalEmbeddingError(str(exc)) from None
        except EmbeddingError as exc:
            # a misconfiguration (vectors that do not fit the model, a bad key) is refused, not hidden
            if mode == "vector" or isinstance(exc, TerminalEmbeddingError):
                raise
            notes.append(f"vector search is unavailable ({exc}); text search only")
            query_vector = None

    started = time.perf_counter()
    # hybrid: the vector side on the second connection while the text side (its tsqueries too) runs
    # here (store/beside.py); the same statements either way
    beside = second.take(conn) if query_vector is not None and mode == "hybrid" and settings.beside else None
    vector_future = None
    if query_vector is not None and mode in ("hybrid", "vector"):
        def vector_side(c):
            return _vector_side(c, model, dimension, query_vector, where, params, settings, fetch,
                                narrowing=_narrowing(filters), few=few)
        if beside is not None:
            vector_future = second.submit(beside, vector_side)
        else:
            vector_hits = vector_side(conn)
    tq = text_query(conn, query)
    text_hits: list[tuple] = []
    strict: list[int] = []  # the datasets of the strict (every word) text stage, best first
    strict_complete = False  # whether that is all of them
    if mode in ("hybrid", "text") and tq.stages:
        # every word; while that finds fewer than limit: all words but one, then any word
        cap = max(settings.text_cap, fetch) if settings.text_cap else 0
        # the stages from the first that reads the filter's rows on: one read (_text_one_pass)
        one_pass: list | None = None
        catalogue = 0.0  # PostgreSQL's estimate of the datasets, asked once when needed
        for number, stage in enumerate(tq.stages):
            passed = one_pass[number - first] if one_pass is not None else None
            if passed is None or (cap and passed[0] > cap):
                # PostgreSQL's estimate of the stage's matches in the whole catalogue: whether to
                # read the filter's rows, and whether the cap may cut the stage (then its title
                # matches first)
                matches = _estimated_matches(conn, "s.document @@ %(tsq)s::tsquery", {"tsq": stage}) \
                    if few or cap else 0.0
                stage_few = few and passing * _ROWS_PER_INDEX_ENTRY < matches
                titles = bool(cap) and not stage_few and (passing is None or passing > cap) \
                    and matches > cap * _TITLES_FIRST_SHARE
                # under few datasets, the rows too for a stage the index would read titles first:
                # through the index that path reads every match of the catalogue's (PostgreSQL,
                # expecting few, may scan the whole table), the rows are at most exact_limit
                if (stage_few or few and titles) and one_pass is None:
                    # this stage and the broader ones after it, from one read of the rows
                    one_pass, first = _text_one_pass(conn, tq.stages[number:], where, params, fetch,
                                                     exclude=[i for i, _ in text_hits]), number
                    passed = one_pass[0]
            if passed is not None and not (cap and passed[0] > cap):
                # the stage's hits as _text_side gives them, through the rows or the index alike
                # (under the cap both rank every match): its best, fewer by the hits so far
                hits = passed[1][:fetch - len(text_hits)]
            else:
                if titles and passing is not None:  # the matches PostgreSQL expects under the filters
                    catalogue = catalogue or max(1.0, _estimated_matches(conn, "TRUE", {}))
                    titles = matches * min(1.0, passing / catalogue) >= cap * _TITLES_FIRST_EXPECTED
                hits = _text_side(conn, stage, where, params, fetch - len(text_hits),
                                  exclude=[i for i, _ in text_hits], cap=cap, few=stage_few, titles=titles,
                                  narrowing=passing is not None)
            if number == 0:
                strict, strict_complete = [i for i, _ in hits], len(hits) < fetch
            text_hits += hits
            if len(text_hits) >= limit:
                break
    elif mode == "text":
        notes.append("the query has no words to search the text for")
    if vector_future is not None:
        try:
            vector_hits = second.result(vector_future)
        except second.NotBeside:
            vector_hits = vector_side(conn)  # here, as without a second connection

    k = settings.rrf_k
    groups = duplicates.groups_for(conn, list(dict.fromkeys(i for i, _ in vector_hits + text_hits))) \
        if all_copies or grouped else {}
    fused = _fuse(vector_hits, text_hits, groups, n, k, collapse=not all_copies)
    # A pasted title: the dataset with exactly that title (case, accents and punctuation aside)
    # counts as ranked first by one more list; one whose title holds the query's words in a row
    # (two words or more), as ranked second. A group counts its members' best.
    wanted = _title_key(query)
    if wanted and fused and mode != "vector":
        entry_of = {member: entry for entry in fused.values() for member in entry["members"]}
        for dataset_id, title in conn.execute("SELECT id, title FROM datasets WHERE id = ANY(%s)",
                                              (list(entry_of),)).fetchall():
            key, entry = _title_key(title), entry_of[dataset_id]
            if key == wanted and entry.get("title_match") != "exact":
                entry["score"] += 1.0 / (k + 1) - (1.0 / (k + 2) if entry.get("title_match") == "words" else 0.0)
                entry["title_match"], entry["title_bonus"] = "exact", 1.0 / (k + 1)
            elif " " in wanted and f" {wanted} " in f" {key} " and not entry.get("title_match"):
                entry["score"] += 1.0 / (k + 2)
                entry["title_match"], entry["title_bonus"] = "words", 1.0 / (k + 2)
    if mode == "hybrid":
        for entry in _rare_entries(conn, query, tq.all_words, strict, strict_complete, fused, where, params,
                                   settings, limit, passing):
            entry["score"] += 2.0 / (k + 1)
            entry["rare_match"] = True
    order = sorted(fused.values(), key=lambda e: (-e["score"], e["ranks"].get("text", n + 1),
                                                  e["ranks"].get("vector", n + 1), e["shown"]))[:limit]
    details = _items(conn, [e["shown"] for e in order], tq.stages[-1] if tq.stages else None) if order else {}
    timings["sql_ms"] += (time.perf_counter() - started) * 1000

    items = []
    for rank, entry in enumerate(order, 1):
        dataset_id = entry["shown"]
        row, group = details[dataset_id], groups.get(dataset_id)
        also_on = [{key: m[key] for key in ("dataset_id", "portal_url", "portal_name", "source_id", "title", "url")}
                   for m in (group["members"] if group else []) if m["live"] and m["dataset_id"] != dataset_id]
        items.append({
            "rank": rank, "score": round(entry["score"], 6), "matched": sorted(entry["matched"]),
            "portal_url": row["portal_url"], "title": row["title"], "url": row["url"],
            "organization": row["organization"], "snippet": row["snippet"], "source_id": row["source_id"],
            "similarity": None if entry["similarity"] is None else round(entry["similarity"], 4),
            "text_rank": None if entry["text_rank"] is None else round(entry["text_rank"], 4),
            "title_match": entry.get("title_match"), "rare_match": entry.get("rare_match", False),
            "metadata_modified": row["metadata_modified"], "removed_at": row["removed_at"],
            "dataset_id": dataset_id, "group_id": group["group_id"] if group else None,
            "canonical": group is None or group["canonical_id"] == dataset_id,
            "also_on": also_on, "copies": len(also_on),
        })
    return SearchResult(model=model, items=items, note="; ".join(notes) or None, mode=mode, timings=timings)
