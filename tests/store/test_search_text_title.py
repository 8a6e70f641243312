"""The text side's cap ranks the title's matches first (sql/030, issue 40: hybrid's recall at a
million datasets). A stage with more matches than text_cap ranks a bounded set of them; that set
holds the datasets whose title has the query's words (ts_rank's best: a title word weighs five
times a description's) before any other, wherever they lie in the table. A stage with fewer
matches than the cap is ranked exactly as uncapped. Real PostgreSQL; a few hundred datasets written
directly (no run, no vectors: text mode)."""
from __future__ import annotations

from harvester.store.search import _TITLE_WORDS, SearchFilters, SearchSettings, _text_side, filter_sql, search, text_query
from harvester.testing.search_rows import insert_texts

PORTALS = ("https://a.example", "https://b.example")


def fill(conn) -> None:
    """Per portal, first (in table order) 60 datasets holding "reservoir" in the description only,
    then 10 whose title holds "reservoir levels" and 5 whose title holds "reservoir" alone; 100
    others about rivers."""
    rows = []
    for portal in PORTALS:
        rows += [(portal, f"desc {i}", f"Dataset {i}", f"Yearly table {i}; the reservoir levels of the county, "
                  "measured at the dam every week with the flow of each river") for i in range(60)]
        rows += [(portal, f"title {i}", f"Reservoir levels {i}", f"Table {i}") for i in range(10)]
        rows += [(portal, f"word {i}", f"Reservoir {i}", f"Levels of table {i}") for i in range(5)]
        rows += [(portal, f"river {i}", f"River flow {i}", f"Flow of the river, station {i}") for i in range(100)]
    insert_texts(conn, rows)


def _found(conn, query: str, cap: int, **filters) -> list[tuple]:
    result = search(conn, query, mode="text", limit=10, filters=SearchFilters(**filters),
                    settings=SearchSettings(text_cap=cap, exact_limit=0))
    return [(i["source_id"], i["portal_url"], i["text_rank"]) for i in result.items]


def test_a_capped_stage_ranks_the_titles_matches_first(db):
    fill(db)
    # "reservoir levels": 150 matches, more than the cap (20: at least the candidates fetched);
    # the 120 met first in table order hold the words in the description only
    for filters in ({}, {"portal_url": PORTALS[1]}):
        capped = _found(db, "reservoir levels", 1, **filters)
        assert capped == _found(db, "reservoir levels", 0, **filters)  # the uncapped ranking's top 10
        assert all(source.startswith(("title ", "word ")) for source, _, _ in capped), capped
    # a relaxed stage ("any word", the strict one finding none) is capped the same way
    capped = _found(db, "reservoir submarine", 1)
    assert capped == _found(db, "reservoir submarine", 0)
    assert all(source.startswith(("title ", "word ")) for source, _, _ in capped), capped


def test_a_stage_under_the_cap_is_ranked_exactly(db):
    fill(db)
    for query in ("reservoir levels", "river", '"reservoir levels"', "reservoir -dam", "flow -reservoir",
                  "flow river reservoir", "dam county week", "submarine reservoir"):
        for filters in ({}, {"portal_url": PORTALS[0]}):
            exact = _found(db, query, 0, **filters)
            assert exact, query
            assert _found(db, query, 10000, **filters) == exact, query
            assert len({source for source, _, _ in exact}) == len(exact)


def test_the_titles_words_are_read_from_their_index(db):
    fill(db)
    db.execute("SET enable_seqscan = off")  # a small table: what a large one's plan is
    plan = "\n".join(r[0] for r in db.execute(
        f"EXPLAIN SELECT s.dataset_id FROM dataset_search s WHERE {_TITLE_WORDS} @@ to_tsquery('english', 'reservoir')"
    ).fetchall())
    assert "dataset_search_title" in plan, plan


def test_one_read_past_the_cap_ranks_the_titles_matches_first_too(db):
    """The one read of a stage's matches (search() asks for it when PostgreSQL expects them under
    the cap; its estimates of words found together are often several times too low) counts them as
    it reads: past the cap, the titles' matches are read first, as when asked at once."""
    fill(db)
    stage = text_query(db, "reservoir levels").stages[0]
    for filters in ({}, {"portal_url": PORTALS[1]}):
        where, params = filter_sql(SearchFilters(**filters))
        one_read = _text_side(db, stage, where, params, 10, cap=20, titles=False)
        assert one_read == _text_side(db, stage, where, params, 10, cap=20, titles=True)
        assert one_read == _text_side(db, stage, where, params, 10, cap=0)[:10]  # the uncapped ranking's top 10
        # under the cap, the one read ranks every match: the same as titles first
        assert _text_side(db, stage, where, params, 10, cap=400, titles=False) == \
            _text_side(db, stage, where, params, 10, cap=400, titles=True)


def test_the_text_side_leaves_the_callers_settings_as_they_were(db):
    """The titles-first statement under a filter is planned without sequential scans (a LIMIT over
    a portal's rows lying together read most of a million-row table), set for it alone: a caller's
    open transaction and its session keep their enable_seqscan."""
    fill(db)
    for setting in ("on", "off"):
        db.execute("SELECT set_config('enable_seqscan', %s, false)", (setting,))
        with db.transaction():
            assert _found(db, "reservoir levels", 1, portal_url=PORTALS[1])  # titles first
            assert _found(db, "reservoir levels", 1)
            assert _found(db, "river", 0, portal_url=PORTALS[0])
            assert db.execute("SELECT current_setting('enable_seqscan')").fetchone()[0] == setting
        assert _found(db, "reservoir levels", 10000)
        assert db.execute("SELECT current_setting('enable_seqscan')").fetchone()[0] == setting


def test_text_statements_are_planned_for_their_values_never_prepared(db):
    """psycopg prepares a query text run five times on a connection, and PostgreSQL may then plan it
    once for any value; a text statement's best plan depends on how common its words are and how
    large its filter is (a plan for none of them doubled hybrid's p50 under a 0.1% portal at a
    million datasets): searched ten times, none of them is a prepared statement."""
    fill(db)
    for _ in range(10):
        for query, filters in (("reservoir levels", {}), ("reservoir levels", {"portal_url": PORTALS[1]}),
                               ("river", {"portal_url": PORTALS[0]})):
            for cap in (1, 10000):
                assert _found(db, query, cap, **filters)
    prepared = [r[0] for r in db.execute("SELECT statement FROM pg_prepared_statements").fetchall()]
    assert not [s for s in prepared if "ts_rank" in s], prepared
