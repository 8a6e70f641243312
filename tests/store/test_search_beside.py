"""Hybrid search runs its vector side on a second connection to the same database while its text
side runs on the caller's (issue 40: a 1% filter at a million, where the two sides took 25 ms and
2-60 ms one after the other). The same statements on either connection: the results are those of
the two sides one after the other (``SearchSettings(beside=False)``), compared here item for item
(ids, scores, ranks, matched sides, snippets) under a small filter (the vector side's exact path,
the text side's one read of the filter's rows) and without one (the HNSW scan, the full-text
index). A caller's connection inside a transaction keeps both sides (the second connection would not
see its uncommitted rows). Real PostgreSQL and pgvector; datasets and 3-dimension vectors written
directly (the catalogue of test_search_one_pass.py)."""
from __future__ import annotations

import pytest

from harvester.store import duplicates, search as search_module
from harvester.store.search import SearchFilters, SearchSettings, search
from harvester.testing.search_rows import GivenVectors, spiral_vector

from .test_search_one_pass import MODEL, SMALL, Recording, catalogue  # noqa: F401 - the fixture

QUERIES = [
    "water quality river",      # strict finds 2 in the small portal: all-but-one, then any word
    "river water",              # two words: strict, then any word
    "water",                    # one word
    "quality -water",           # an excluded word, in every stage
    '"water quality" river',    # a phrase
    "IFPA",                     # a code found once: a rare exact match
    "!!! ...",                  # no word: the vector side alone (on the caller's connection)
    "nothing matches this",     # no text match: the vector side alone fills the results
]


def _search(conn, query: str, filters: SearchFilters, beside: bool, vector=None, **kwargs):
    return search(conn, query, mode="hybrid", filters=filters, limit=10, settings=SearchSettings(beside=beside),
                  query_vector=vector or spiral_vector(3), provider=GivenVectors(MODEL), **kwargs).items


def _vector_statements(statements: list[str]) -> int:
    """How many of ``statements`` are the vector side's (the exact path's or the HNSW scan's)."""
    return sum("dataset_vectors v" in s or "FROM embeddings e" in s for s in statements)


@pytest.mark.parametrize("filters", [SearchFilters(portal_url=SMALL), SearchFilters()], ids=["small filter", "none"])
@pytest.mark.parametrize("query", QUERIES)
def test_the_vector_side_beside_gives_what_one_side_after_the_other_gives(catalogue, query, filters):
    statements: list[str] = []
    beside = _search(Recording(catalogue, statements), query, filters, beside=True)
    # the vector side ran on the other connection when the text side had words to search
    assert _vector_statements(statements) == (0 if query != "!!! ..." else 1), statements
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
    idle = [b for besides in search_module._besides.values() for b in besides]
    assert idle, "the second connection is kept for the next search"
    for beside in idle:
        catalogue.execute("SELECT pg_terminate_backend(%s)", (beside.conn.info.backend_pid,))
    assert _search(catalogue, "water quality river", SearchFilters(portal_url=SMALL), beside=True) == found
    assert _search(catalogue, "water quality river", SearchFilters(portal_url=SMALL), beside=True) == found
    assert [b for besides in search_module._besides.values() for b in besides if not b.conn.closed]
