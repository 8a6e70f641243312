"""The full-text index holds each document with its portal as one more lexeme (sql/035, issue 40:
the text side under a portal filter at a million datasets), so that GIN gives a portal's matches
itself instead of ANDing every match of the catalogue with a bitmap of the portal's rows. The
lexeme narrows nothing the filter does not: the same rows as the document alone under the same
filters. Real PostgreSQL; datasets written directly (no run, no vectors)."""
from __future__ import annotations

import pytest

from harvester.store.search import _matches, filter_sql, portal_lexeme, SearchFilters, text_query
from harvester.testing.search_rows import insert_texts

# three portals, one of them a prefix of another's URL, one with a non-ASCII path
PORTALS = ("https://a.example", "https://a.example/sub", "https://dados.example/organização")
QUERIES = ("reservoir levels", "river", '"reservoir levels"', "reservoir -dam", "flow -river",
           "flow river reservoir", "dam county week", "reservoir submarine", "nothing-here")


def fill(conn) -> None:
    """On each portal, datasets about reservoirs (in the title or the description only), rivers
    and dams, and 400 census tables; the portals differ in how many reservoirs they hold."""
    rows = []
    for n, portal in enumerate(PORTALS, 1):
        rows += [(portal, f"lake {i}", f"Reservoir levels {i}", "Weekly levels at the dam of the county")
                 for i in range(5 * n)]
        rows += [(portal, f"desc {i}", f"Table {i}", "The reservoir and the river flow, measured every week")
                 for i in range(7 * n)]
        rows += [(portal, f"river {i}", f"River flow {i}", f"Flow of the river at station {i}") for i in range(30)]
        # many other datasets: the portal's rows far outnumber a query's matches, as on a large portal
        rows += [(portal, f"census {i}", f"Census table {i}", f"Households of district {i}") for i in range(400)]
    insert_texts(conn, rows)


@pytest.mark.parametrize("url", [*PORTALS, "http://127.0.0.1:8765"])
def test_the_portal_lexeme_is_the_one_postgresql_indexes(db, url):
    # Python's md5 of the URL's UTF-8 bytes and PostgreSQL's md5 of the text (a UTF-8 database) agree
    assert db.execute("SELECT array_to_tsvector(ARRAY['p:' || md5(%s)]) @@ %s::tsquery",
                      (url, portal_lexeme(url))).fetchone()[0] is True
    assert db.execute("SELECT array_to_tsvector(ARRAY['p:' || md5(%s)]) @@ %s::tsquery",
                      (url + "/", portal_lexeme(url))).fetchone()[0] is False


def test_a_portal_filtered_read_matches_the_same_rows_through_the_portal_lexeme(db):
    fill(db)
    found = 0
    for portal in PORTALS:
        where, params = filter_sql(SearchFilters(portal_url=portal))
        assert "f_portal_lexeme" in params
        for query in QUERIES:
            for stage in text_query(db, query).stages:
                values = {**params, "tsq": stage}
                through_lexeme = db.execute(f"SELECT s.dataset_id FROM dataset_search s WHERE {_matches(params)}"
                                            f" AND {where} ORDER BY 1", values).fetchall()
                document_alone = db.execute(f"SELECT s.dataset_id FROM dataset_search s WHERE s.document @@"
                                            f" %(tsq)s::tsquery AND {where} ORDER BY 1", values).fetchall()
                assert through_lexeme == document_alone, (portal, query, stage)
                found += len(through_lexeme)
    assert found > 100  # the queries do match
    # and without a portal filter, the words alone
    where, params = filter_sql(SearchFilters())
    assert "f_portal_lexeme" not in params and "f_portal_lexeme" not in _matches(params)


def test_a_portal_filtered_read_is_planned_through_the_portal_lexeme(db):
    fill(db)
    where, params = filter_sql(SearchFilters(portal_url=PORTALS[1]))
    db.execute("SET enable_seqscan = off")  # a small table: what a large one's plan is
    plan = "\n".join(r[0] for r in db.execute(
        f"EXPLAIN SELECT s.dataset_id FROM dataset_search s WHERE {_matches(params)} AND {where}",
        {**params, "tsq": text_query(db, "reservoir levels").stages[0]}).fetchall())
    assert "dataset_search_document_portal" in plan, plan
    assert portal_lexeme(PORTALS[1]).strip("'") in plan, plan  # the portal's lexeme is in the index condition
    assert "dataset_search_portal_rows" not in plan, plan  # no bitmap of the portal's rows beside it
    indexes = {r[0] for r in db.execute("SELECT indexrelid::regclass::text FROM pg_index"
                                        " WHERE indrelid = 'dataset_search'::regclass").fetchall()}
    assert "dataset_search_document" not in indexes  # replaced, not kept beside it


def test_a_users_words_never_form_a_portal_lexeme(db):
    lexeme = portal_lexeme(PORTALS[0]).strip("'")
    for typed in (lexeme, f"'{lexeme}'", lexeme.replace(":", "\\:"), f'"{lexeme}"', lexeme.upper()):
        for stage in text_query(db, typed).stages:
            assert db.execute("SELECT array_to_tsvector(ARRAY['p:' || md5(%s)]) @@ %s::tsquery",
                              (PORTALS[0], stage)).fetchone()[0] is False, (typed, stage)
