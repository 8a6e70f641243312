"""Reconciliation's staging: the portal's whole list of identifiers, compared with datasets set-based.

A reconciling run COPYs every (id, metadata_modified) the portal lists into ``staging_listing``,
then one pass of SQL marks each listed id ``missing`` (we hold no live dataset with it) or
``stale`` (we hold it with another metadata_modified). Ids this run's incremental listing already
staged are left alone: they are processed anyway. The marked ids are fetched in full into
``staging_records`` (with seq from ``RECONCILE_SEQ`` on, after anything fetch_modified staged, so a
retried reconciliation can drop exactly its own records), and go through hash_compare, embedding and
history like any modified record. Datasets the listing does not hold are removed at upsert
(``history.apply_removals``), under the same guard as a full sync.

Timestamps are compared at millisecond precision: the portal's search index (Solr) keeps no more,
while a full record carries microseconds.
"""
from __future__ import annotations

from datetime import datetime
from typing import Iterable, Iterator

from harvester.domain.screening import escaped
from harvester.store import staging

# staging_records.seq of the records a reconciliation stages (fetch_modified counts up from 0).
RECONCILE_SEQ = staging.RECONCILE_SEQ


def clear(conn, run_id: int) -> None:
    """Forget what an earlier attempt of this run's reconciliation staged (a retry starts over)."""
    with conn.transaction():
        conn.execute("DELETE FROM staging_listing WHERE run_id = %s", (run_id,))
        conn.execute("DELETE FROM staging_records WHERE run_id = %s AND seq >= %s", (run_id, RECONCILE_SEQ))
        conn.execute("DELETE FROM staging_deleted WHERE run_id = %s AND seq >= %s", (run_id, RECONCILE_SEQ))


def drop(conn, run_id: int) -> None:
    """The run is over (committed, failed or cancelled): its listing goes (staging.release: the
    table truncated when no other run's listing is there)."""
    staging.release(conn, "staging_listing", run_id)


def write(conn, run_id: int, rows: Iterable[tuple[str, datetime | None]]) -> int:
    """COPY listed (source_id, metadata_modified) pairs; returns how many were written. An
    identifier holding a lone surrogate or U+0000 (which PostgreSQL cannot store, and which failed
    the whole COPY) is written escaped, as its Failed record keeps it (domain/dataset.py
    ``failed``): never altered into another dataset's identifier (U+0000 removed, ``a\\x00b``
    was ``ab``), whose removal it would withhold."""
    n = 0
    with conn.cursor() as cur:
        with cur.copy("COPY staging_listing (run_id, source_id, metadata_modified) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "text", "timestamptz"])
            for source_id, modified in rows:
                copy.write_row((run_id, escaped(source_id), modified))
                n += 1
    return n


def compare(conn, run_id: int, portal_url: str) -> dict[str, int]:
    """Mark each listed id missing or stale (see the module's docstring) and count: ``listed``
    (distinct ids), ``missing``, ``stale``."""
    params = {"run": run_id, "portal": portal_url, "first": RECONCILE_SEQ}
    conn.execute("ANALYZE staging_listing")  # planned on an empty table's statistics, the joins crawl
    with conn.transaction():
        conn.execute("UPDATE staging_listing SET state = NULL WHERE run_id = %(run)s AND state IS NOT NULL", params)
        conn.execute(
            """
            UPDATE staging_listing l SET state = 'missing'
            WHERE l.run_id = %(run)s
              AND NOT EXISTS (SELECT 1 FROM datasets d WHERE d.portal_url = %(portal)s AND d.source_id = l.source_id
                                AND d.removed_at IS NULL)
            """, params)
        conn.execute(
            """
            UPDATE staging_listing l SET state = 'stale'
            FROM datasets d
            WHERE l.run_id = %(run)s AND l.state IS NULL
              AND d.portal_url = %(portal)s AND d.source_id = l.source_id AND d.removed_at IS NULL
              AND date_trunc('milliseconds', d.metadata_modified) IS DISTINCT FROM l.metadata_modified
            """, params)
        # What this run's incremental listing fetched (as recent as listed, or more) is processed anyway.
        conn.execute(
            """
            UPDATE staging_listing l SET state = NULL
            WHERE l.run_id = %(run)s AND l.state IS NOT NULL
              AND EXISTS (SELECT 1 FROM staging_records s
                          WHERE s.run_id = l.run_id AND s.source_id = l.source_id AND s.seq < %(first)s
                            AND s.error IS NULL
                            AND (l.metadata_modified IS NULL
                                 OR date_trunc('milliseconds', s.metadata_modified) >= l.metadata_modified))
            """, params)
    listed, missing, stale = conn.execute(
        """
        SELECT count(DISTINCT source_id),
               count(DISTINCT source_id) FILTER (WHERE state = 'missing'),
               count(DISTINCT source_id) FILTER (WHERE state = 'stale')
        FROM staging_listing WHERE run_id = %(run)s
        """, params).fetchone()
    return {"listed": listed, "missing": missing, "stale": stale}


def iter_to_fetch(conn, run_id: int, batch_size: int = 1000) -> Iterator[list[str]]:
    """The missing and stale ids not staged in full yet, in batches (keyset by id, so memory stays
    flat however large the drift)."""
    after = ""
    while True:
        rows = conn.execute(
            """
            SELECT DISTINCT l.source_id FROM staging_listing l
            WHERE l.run_id = %(run)s AND l.state IS NOT NULL AND l.source_id > %(after)s
              AND NOT EXISTS (SELECT 1 FROM staging_records s WHERE s.run_id = l.run_id
                                AND s.source_id = l.source_id AND s.seq >= %(first)s)
            ORDER BY l.source_id LIMIT %(n)s
            """, {"run": run_id, "after": after, "first": RECONCILE_SEQ, "n": batch_size}).fetchall()
        if not rows:
            return
        ids = [r[0] for r in rows]
        yield ids
        after = ids[-1]


def next_seq(conn, run_id: int) -> int:
    """Where the reconciliation's next staged record goes."""
    row = conn.execute("SELECT max(seq) FROM staging_records WHERE run_id = %s AND seq >= %s",
                       (run_id, RECONCILE_SEQ)).fetchone()
    return RECONCILE_SEQ if row[0] is None else row[0] + 1
