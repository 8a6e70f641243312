"""The text side under a filter that leaves few datasets reads the filter's rows once (issue 40:
search at a million datasets): one statement tells each row's first matching stage (every word;
all but one; any word) and its rank, and search() takes each stage's hits from it as the staged
loop did. Results are those of the staged loop: compared with the same query under exact_limit=0
(the filter is then not "few": each stage through the full-text index, as before). Equal by
construction: a stage under text_cap is ranked whole on both paths (the same ts_rank, ties by id),
and the portal holds fewer datasets than the vector side's candidates, so that side ranks them all
exactly on both paths (the HNSW scan ends short and falls back to the exact statement).

Hybrid search runs its vector side on a second connection to the same database while its text side
runs on the caller's (issue 40: under a 1% filter at a million the two took 25 ms and 2-60 ms one
after the other). The same statements on either connection: the results are those of the two sides
one after the other (``SearchSettings(beside=False)``), compared item for item (ids, scores, ranks,
matched sides, snippets) under the small filter (the vector side's exact path, the text side's one
read of the filter's rows) and without one (the HNSW scan, the full-text index). A caller's
connection inside a transaction keeps both sides (the second connection would not see its
uncommitted rows). Real PostgreSQL and pgvector; datasets and 3-dimension vectors written directly."""
from __future__ import annotations

import pytest

from harvester.store import beside as second, duplicates, vectors
from harvester.store.search import SearchFilters, SearchSettings, search
from harvester.testing.search_rows import GivenVectors, insert_datasets, insert_vectors, spiral_vector

MODEL = "test-one-pass-3"
SMALL, BIG = "https://small.example", "https://big.example"
N = 400
# the small portal's datasets (every 25th, 16 of them): titles and descriptions chosen so that the
# strict stage of a three-word query finds fewer than 10 and the relaxed stages run
SMALL_TEXTS = [
    ("Water quality of the river", "Samples taken monthly at river stations"),
    ("River water levels", "Daily gauge readings"),
    ("Water quality index", "Lakes and reservoirs"),
    ("County budget", "Spending by department, water included"),
    ("Fish counts in the river", "Salmon and trout surveys"),
    ("Air quality stations", "Ozone and particles"),
    ("IFPA grants", "Funding of the IFPA programme by year"),
    ("Road works", "Closures and detours"),
    ("Quality of drinking water", "Tap water tests by the river authority"),
    ("School enrolment", "Pupils per school"),
    ("River crossings", "Bridges and ferries"),
    ("Water permits", "Abstraction licences"),
    ("Parks", "Green spaces and their quality"),
    ("Flood risk", "Areas near the river at risk"),
    ("Population", "Census counts"),
    ("Bus routes", "Timetables"),
]


@pytest.fixture
def catalogue(db):
    small = [n for n in range(N) if n % 25 == 0]
    insert_datasets(db, [SMALL if n % 25 == 0 else BIG for n in range(N)])
    for n, (title, description) in zip(small, SMALL_TEXTS):
        db.execute("UPDATE datasets SET title = %s, description = %s WHERE source_id = %s",
                   (title, description, f"ds-{n}"))
    # the big portal says the same words, so that the index path has many more matches to filter
    db.execute("UPDATE datasets SET title = 'River water quality ' || source_id, description = 'county data'"
               " WHERE portal_url = %s", (BIG,))
    _vectors_for_search(db)
    return db


def _vectors_for_search(db):
    """Every dataset's vector, its copy for search on both portals, and fresh statistics."""
    insert_vectors(db, N, MODEL)
    for portal in (SMALL, BIG):
        vectors.copy_for_search(db, portal, MODEL)
    db.execute("ANALYZE dataset_search")


class Recording:
    """A connection that records what search() sends (no behaviour of ours replaced)."""
    def __init__(self, conn, statements: list[str]):
        self.conn, self.statements = conn, statements

    def __getattr__(self, name):
        return getattr(self.conn, name)

    def execute(self, query, params=None, **kwargs):
        self.statements.append(query if isinstance(query, str) else query.as_string(self.conn))
        return self.conn.execute(query, params, **kwargs)


def _both(conn, query: str, mode: str, vector=None, **settings):
    """The query's items on the one-pass path (the filter is few) and on the staged path."""
    def run(exact_limit):
        return search(conn, query, mode=mode, filters=SearchFilters(portal_url=SMALL), limit=10,
                      settings=SearchSettings(exact_limit=exact_limit, **settings),
                      query_vector=vector or spiral_vector(3), provider=GivenVectors(MODEL)).items
    return run(SearchSettings().exact_limit), run(0)


@pytest.mark.parametrize("mode", ["hybrid", "text"])
@pytest.mark.parametrize("query", [
    "water quality river",      # strict finds 2: all-but-one, then any word follow
    "river water",              # two words: strict, then any word
    "water",                    # one word
    "quality -water",           # an excluded word, in every stage
    '"water quality" river',    # a phrase
    "IFPA",                     # a code found once: rare exact match in hybrid
    "!!! ...",                  # no word
    "nothing matches this",     # no match at all
])
def test_a_small_filter_gives_what_the_staged_path_gives(catalogue, query, mode):
    one_pass, staged = _both(catalogue, query, mode)
    assert one_pass == staged
    ids = [i["dataset_id"] for i in one_pass]
    assert len(ids) == len(set(ids))  # a dataset of an earlier stage is not found again by a later one
    assert all(i["portal_url"] == SMALL for i in one_pass)


def test_the_relaxed_stages_follow_the_strict_one_in_order(catalogue):
    items = search(catalogue, "water quality river", mode="text", filters=SearchFilters(portal_url=SMALL),
                   limit=10, settings=SearchSettings()).items
    titles = [i["title"] for i in items]
    # every word first (best rank first), then two of the three, then any one
    assert titles[:2] == ["Water quality of the river", "Quality of drinking water"]
    assert set(titles[2:4]) == {"Water quality index", "River water levels"}
    assert len(items) == 10


def test_hybrid_under_a_small_filter_reads_the_filters_rows_once(catalogue):
    """One read of the filter's rows for every stage from the strict one on (its words are in many
    datasets of the other portal: PostgreSQL's estimate says read the rows) and two estimates
    (whether the filter is few, and that one): none for the relaxed stages, none again for the rare
    matches. The staged loop made one per stage and one for the rare matches, and read the rows
    once per stage."""
    statements: list[str] = []
    found = search(Recording(catalogue, statements), "water quality river", mode="hybrid", filters=SearchFilters(portal_url=SMALL),
                   limit=10, settings=SearchSettings(), query_vector=spiral_vector(3), provider=GivenVectors(MODEL))
    assert len(found.items) == 10
    assert sum("EXPLAIN" in s for s in statements) == 2, statements
    assert sum("s.document @@" in s and "EXPLAIN" not in s for s in statements) == 1, statements


def test_a_filter_over_the_cap_reads_its_rows_where_the_index_would_read_titles_first(db):
    """A filter leaving more datasets than text_cap (here 20: text_cap 1, at least the candidates),
    still few: a stage the index would read title matches first of (sql/030; PostgreSQL may scan
    the whole table for the rest) is read from the filter's rows; under the cap both rank every
    match, so the results are the index path's (exact_limit=0)."""
    insert_datasets(db, [SMALL if n % 5 == 0 else BIG for n in range(N)])  # 80 on the small portal
    db.execute("UPDATE datasets SET title = 'River levels ' || source_id WHERE id % 7 = 0")
    db.execute("UPDATE datasets SET description = 'water of the river' WHERE id % 3 = 0")
    db.execute("ANALYZE dataset_search")
    for query in ("river", "river water", "levels river water"):
        found = [search(db, query, mode="text", filters=SearchFilters(portal_url=SMALL), limit=10,
                        settings=SearchSettings(text_cap=1, exact_limit=limit)).items for limit in (20000, 0)]
        assert found[0] == found[1] and len(found[0]) == 10


def test_a_rare_code_under_a_small_filter_is_put_first_from_the_one_pass_strict_stage(db):
    """The strict stage's hits and whether they are all of them (rare exact matches, hybrid) come
    from the one read as from the staged loop: a code found in one of the portal's 134 datasets (and
    in 50 of the other portal's: with text_cap 1, a cap of 20, the index would read its title matches
    first, so the rows are read) is first on both paths, its dataset's vector far from the query's."""
    insert_datasets(db, [SMALL if n % 3 == 0 else BIG for n in range(N)])
    db.execute("UPDATE datasets SET description = 'report of the agency' WHERE id % 2 = 0")
    db.execute("UPDATE datasets SET description = 'QZX9 grants report'"
               " WHERE source_id = 'ds-30' OR (portal_url = %s AND id %% 5 = 0 AND id < 330)", (BIG,))
    _vectors_for_search(db)
    statements: list[str] = []
    one_pass, staged = _both(Recording(db, statements), "QZX9", "hybrid", vector=spiral_vector(100),
                             text_cap=1)
    assert sum("r.stage" in s for s in statements) == 1  # the one read, on the few path only
    assert [(i["source_id"], i["rare_match"]) for i in one_pass[:2]] == [("ds-30", True), (one_pass[1]["source_id"], False)]
    assert [(i["source_id"], i["rare_match"]) for i in one_pass[:2]] == \
        [(i["source_id"], i["rare_match"]) for i in staged[:2]]


# -- the vector side beside the text side -----------------------------------------------------------
BESIDE_QUERIES = [
    "water quality river",      # strict finds 2 in the small portal: all-but-one, then any word
    "river water",              # two words: strict, then any word
    "water",                    # one word
    "quality -water",           # an excluded word, in every stage
    '"water quality" river',    # a phrase
    "IFPA",                     # a code found once: a rare exact match
    "!!! ...",                  # no word: the vector side alone
    "nothing matches this",     # no text match: the vector side alone fills the results
]


def _search(conn, query: str, filters: SearchFilters, beside: bool, vector=None, **kwargs):
    return search(conn, query, mode="hybrid", filters=filters, limit=10, settings=SearchSettings(beside=beside),
                  query_vector=vector or spiral_vector(3), provider=GivenVectors(MODEL), **kwargs).items


def _vector_statements(statements: list[str]) -> int:
    """How many of ``statements`` are the vector side's (the exact path's or the HNSW scan's)."""
    return sum("dataset_vectors v" in s or "FROM embeddings e" in s for s in statements)


@pytest.mark.parametrize("filters", [SearchFilters(portal_url=SMALL), SearchFilters()], ids=["small filter", "none"])
@pytest.mark.parametrize("query", BESIDE_QUERIES)
def test_the_vector_side_beside_gives_what_one_side_after_the_other_gives(catalogue, query, filters):
    statements: list[str] = []
    beside = _search(Recording(catalogue, statements), query, filters, beside=True)
    # the vector side ran on the other connection
    assert _vector_statements(statements) == 0, statements
    after = _search(catalogue, query, filters, beside=False)
    assert beside == after
    assert len(beside) == 10
    assert any("vector" in i["matched"] for i in beside)


def test_duplicate_groups_collapse_alike_beside(catalogue):
    """Both sides fetch twice their candidates while the database holds a group, and the group's
    members are one result: the same on both paths."""
    ids = [r[0] for r in catalogue.execute(
        "SELECT id FROM datasets WHERE portal_url = %s ORDER BY id LIMIT 3", (SMALL,)).fetchall()]
    big = catalogue.execute("SELECT id FROM datasets WHERE portal_url <> %s ORDER BY id LIMIT 1", (SMALL,)).fetchone()[0]
    duplicates.merge(catalogue, ids[0], big, by="test")
    duplicates.merge(catalogue, ids[1], ids[2], by="test")
    for filters in (SearchFilters(portal_url=SMALL), SearchFilters()):
        for all_copies in (False, True):
            found = [_search(catalogue, "water quality river", filters, beside, all_copies=all_copies)
                     for beside in (True, False)]
            assert found[0] == found[1]
            assert any(i["group_id"] for i in found[0])


def test_a_caller_inside_a_transaction_keeps_both_sides(catalogue):
    """A dataset removed in the caller's open transaction is not found: its vector side ran on the
    caller's connection (the second one would still see the dataset live and bring it back)."""
    before = _search(catalogue, "nothing matches this", SearchFilters(), beside=True)
    best = before[0]["dataset_id"]
    statements: list[str] = []
    with catalogue.transaction():
        catalogue.execute("UPDATE datasets SET removed_at = now() WHERE id = %s", (best,))
        inside = _search(Recording(catalogue, statements), "nothing matches this", SearchFilters(), beside=True)
        assert best not in [i["dataset_id"] for i in inside]
        assert _vector_statements(statements) == 1
        assert [i["dataset_id"] for i in inside][:9] == [i["dataset_id"] for i in before[1:]]


def test_a_broken_second_connection_is_replaced(catalogue):
    """The second connection closed under search (a server restart, an administrator's
    pg_terminate_backend): the search still answers alike, and the next one opens another."""
    found = _search(catalogue, "water quality river", SearchFilters(portal_url=SMALL), beside=True)
    idle = second.idle()
    assert idle, "the second connection is kept for the next search"
    for conn in idle:
        catalogue.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    assert _search(catalogue, "water quality river", SearchFilters(portal_url=SMALL), beside=True) == found
    assert _search(catalogue, "water quality river", SearchFilters(portal_url=SMALL), beside=True) == found
    assert [conn for conn in second.idle() if not conn.closed]


def test_the_second_connection_and_the_wait_for_it_are_bounded(catalogue):
    """Every wait of the vector side beside has a bound: the second connection's connect_timeout and
    statement_timeout are set, and the search's wait for an answer that never comes ends with an
    error that says what it waited for."""
    from concurrent.futures import Future

    _search(catalogue, "water quality river", SearchFilters(portal_url=SMALL), beside=True)
    # this database's (another test's may be on a server gone since)
    idle = [conn for conn in second.idle() if not conn.closed and conn.info.dbname == catalogue.info.dbname
            and conn.info.port == catalogue.info.port]
    assert idle
    for conn in idle:
        timeout = conn.execute("SELECT current_setting('statement_timeout')::interval").fetchone()[0]
        assert timeout.total_seconds() == second.STATEMENT_S
        assert conn.info.get_parameters().get("connect_timeout")
    with pytest.raises(TimeoutError, match=r"vector side on its second connection gave no answer within 0.05s"):
        second.result(Future(), wait_s=0.05)


def test_the_kept_connections_are_keyed_without_the_password(catalogue):
    """The caller's conninfo (password included) opens the second connection but is never its key
    nor in a claim's repr (a traceback's locals, a debugger's view): the key is host:port/dbname
    user and a digest; two conninfos of one database that differ in the password are two keys."""
    import psycopg

    from harvester.store import db as store_db

    info = catalogue.info
    claims = []
    for password in ("s3cret-one", "s3cret-two"):  # the test server trusts: the password is not checked
        conn = store_db.prepare(psycopg.connect(host=info.host, port=info.port, dbname=info.dbname,
                                                user=info.user, password=password), migrate=False)
        try:
            claim = second.take(conn)
            assert claim is not None and password in claim.conninfo
            assert "s3cret" not in repr(claim) and "s3cret" not in claim.database
            assert claim.database.startswith(f"{info.host}:{info.port}/{info.dbname} {info.user} #")
            assert second.result(second.submit(claim, lambda c: c.execute("SELECT 1").fetchone()[0])) == 1
            claims.append(claim)
        finally:
            conn.close()
    assert claims[0].database != claims[1].database
    # the second connections opened with each password are kept, idle, under those keys
    assert {c.database for c in claims} <= set(second._idle)


@pytest.mark.parametrize("query", [
    "water quality river", "river water quality county", "quality river -county", '"water quality" river',
    'river "water quality" -county', "IFPA grants by year", "rivers county",
])
def test_every_stage_implies_the_last_which_the_one_read_tests_first(catalogue, query):
    """_text_one_pass tests a row against the last, broadest stage first and gives up on a row that
    misses it: right only while each stage of text_query implies the last. Over every document of
    the catalogue and documents of other configurations (english's stems beside simple's words)."""
    from harvester.store.search import text_query

    catalogue.execute("UPDATE dataset_search SET config = 'english'::regconfig,"
                      " document = to_tsvector('english', 'the rivers of the county, their water and its quality')"
                      " WHERE dataset_id IN (SELECT dataset_id FROM dataset_search ORDER BY dataset_id DESC LIMIT 5)")
    stages = text_query(catalogue, query).stages
    assert len(stages) >= 2, stages
    counts = catalogue.execute(
        "SELECT s.i, count(*) FILTER (WHERE d.document @@ s.q::tsquery),"
        " count(*) FILTER (WHERE d.document @@ s.q::tsquery AND NOT d.document @@ %s::tsquery)"
        " FROM dataset_search d, unnest(%s::text[]) WITH ORDINALITY s(q, i) GROUP BY s.i ORDER BY s.i",
        (stages[-1], list(stages))).fetchall()
    assert sum(matched for _, matched, _ in counts[:-1]) > 0, counts  # the earlier stages do match rows
    assert [missed for _, _, missed in counts] == [0] * len(stages), counts
