"""The text side at a million datasets (issue 40): a stage's matches are ranked by ts_rank up to
HARVESTER_SEARCH_TEXT_CAP; a query whose words match fewer datasets is ranked exactly as without a
cap. Real PostgreSQL; 2,000 datasets written directly (text mode: no vectors)."""
from __future__ import annotations

from harvester.store.search import SearchSettings, search

N = 2000


def fill(conn) -> None:
    words = ["water", "roads", "schools", "budget", "census"]
    conn.execute(
        """
        INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title, description,
                              first_seen_at, updated_at, raw)
        SELECT 'https://p.example', 'ds-' || n, 'https://x/' || n, md5('u' || n), md5('c' || n), md5('m' || n),
               'dataset ' || n || ' ' || w, 'common words for all ' || w || repeat(' ' || w, (n %% 7)::int) || ' rare' || n,
               now(), now(), '{}'
        FROM unnest(%s::text[]) WITH ORDINALITY AS t(w, k), LATERAL (SELECT k - 1 AS n) i
        """, ([words[n % len(words)] for n in range(N)],))
    conn.execute("ANALYZE dataset_search")


def text_ids(conn, query, cap):
    return [i["dataset_id"] for i in search(conn, query, mode="text", limit=10,
                                            settings=SearchSettings(text_cap=cap)).items]


def test_a_common_words_matches_are_ranked_within_the_cap(db):
    fill(db)
    # "schools": 400 datasets; ranked among the first 50 matches only, still 10 results
    capped, full = text_ids(db, "schools", 50), text_ids(db, "schools", 0)
    assert len(capped) == len(full) == 10 and capped != full
    first = {r[0] for r in db.execute("SELECT dataset_id FROM dataset_search WHERE document @@ "
                                      "plainto_tsquery('simple', 'schools') LIMIT 50")}
    assert set(capped) <= first
    assert SearchSettings().text_cap == 10000  # the default


def test_rare_words_are_ranked_as_without_a_cap(db):
    fill(db)
    # (every stage of these finds few: a relaxed stage of a common word, "dataset 5", is capped too)
    for query in ("rare17", "rare17 rare18", "rare3 rare4 rare5", '"rare1999"'):
        assert text_ids(db, query, 50) == text_ids(db, query, 0)
