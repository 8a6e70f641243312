"""The datasets table: classifying a run's staged records against it, and merging them in.

Everything is set-based: one statement per step for the whole run, never one per dataset.
"""
from __future__ import annotations

from harvester.store import outcomes, vectors

# The version of the search text (dataset_search.document) the merge keeps: sql/025's, with every
# language's title (portal_sync_status.search_text: the one a portal's datasets are indexed with).
SEARCH_TEXT = 25
OUTCOMES = ("created", "updated", "unchanged", "failed", "reidentified")
# The columns of staging_records that statements filter, join, group or sort on (classify analyzes them).
_PLANNED_COLUMNS = ("run_id", "seq", "source_id", "error", "outcome", "content_changed", "content_hash",
                    "metadata_modified", "previous_source_id")


def classify(conn, run_id: int, portal_url: str) -> dict[str, int]:
    """Set each staged record's outcome: failed (unusable), duplicate (an older copy of a record
    fetched twice in the run), created, updated (content or metadata changed, or a removed dataset
    back again), unchanged, or reidentified (see ``_reidentify``). Returns the counts per outcome,
    and ``fetched``: usable records the
    run fetched in full (by its listing and by a reconciliation), duplicates included."""
    params = {"run": run_id, "portal": portal_url}
    # Fresh statistics after the bulk load: planned on an empty staging table's, the self-joins
    # below become nested loops that take minutes on a 20k-record run instead of a second. Only of
    # the columns that statements over staging filter, join, group or sort on: sampling the large
    # ones (the portal's record, the description) would read tens of megabytes for no plan.
    conn.execute(f"ANALYZE staging_records ({', '.join(_PLANNED_COLUMNS)})")
    whole = conn.execute("SELECT mode = 'full' OR reconcile_reason IS NOT NULL FROM sync_runs WHERE run_id = %(run)s",
                         params).fetchone()
    with conn.transaction():
        _classify(conn, params)
        if whole and whole[0]:
            _reidentify(conn, params)
    counts = dict(conn.execute(
        "SELECT outcome, count(*) FROM staging_records WHERE run_id = %(run)s GROUP BY outcome", params).fetchall())
    out = {key: int(counts.get(key, 0)) for key in OUTCOMES}
    out["fetched"] = int(sum(counts.values())) - out["failed"]
    return out


def _classify(conn, params: dict) -> None:
    # (a classify that ran before, e.g. a retried task; a fresh run's rows are not rewritten)
    conn.execute("UPDATE staging_records SET outcome = NULL, content_changed = NULL WHERE run_id = %(run)s"
                 " AND (outcome IS NOT NULL OR content_changed IS NOT NULL)", params)
    conn.execute("UPDATE staging_records SET outcome = 'failed' WHERE run_id = %(run)s AND error IS NOT NULL", params)
    conn.execute(
        """
        UPDATE staging_records s SET outcome = 'duplicate'
        FROM (
            SELECT seq, row_number() OVER (
                PARTITION BY source_id
                ORDER BY metadata_modified DESC NULLS LAST, seq DESC) AS rank
            FROM staging_records WHERE run_id = %(run)s AND error IS NULL
        ) r
        WHERE s.run_id = %(run)s AND s.seq = r.seq AND r.rank > 1
        """, params)
    # Records of datasets we hold, then the rest (new): two statements that each read the run's
    # records once, instead of one that joined them to themselves to reach datasets by LEFT JOIN.
    conn.execute(
        """
        UPDATE staging_records s SET
            outcome = CASE
                WHEN d.content_hash = s.content_hash AND d.metadata_hash = s.metadata_hash
                     AND d.removed_at IS NULL THEN 'unchanged'
                ELSE 'updated' END,
            content_changed = d.content_hash <> s.content_hash
        FROM datasets d
        WHERE s.run_id = %(run)s AND s.outcome IS NULL AND d.portal_url = %(portal)s AND d.source_id = s.source_id
        """, params)
    conn.execute("UPDATE staging_records SET outcome = 'created', content_changed = true"
                 " WHERE run_id = %(run)s AND outcome IS NULL", params)


def _reidentify(conn, params: dict) -> None:
    """In a run that listed the whole portal: a new record with exactly the text (content_hash) of
    a live dataset the listing no longer shows is that dataset under a new identifier (portals
    re-key: UUIDs replaced by codes). Its outcome becomes ``reidentified`` with the old id, so the
    merge renames the dataset (history, versions and vector carried over) instead of creating one
    and removing the other. Pairs are one to one: several with the same text pair in id order."""
    conn.execute(
        """
        WITH gone AS (
            SELECT d.source_id, d.content_hash,
                   row_number() OVER (PARTITION BY d.content_hash ORDER BY d.source_id) AS n
            FROM datasets d
            WHERE d.portal_url = %(portal)s AND d.removed_at IS NULL
              AND NOT EXISTS (SELECT 1 FROM staging_records s WHERE s.run_id = %(run)s AND s.source_id = d.source_id)
              AND NOT EXISTS (SELECT 1 FROM staging_listing l WHERE l.run_id = %(run)s AND l.source_id = d.source_id)
        ), appeared AS (
            SELECT seq, content_hash, row_number() OVER (PARTITION BY content_hash ORDER BY source_id) AS n
            FROM staging_records WHERE run_id = %(run)s AND outcome = 'created'
        )
        UPDATE staging_records s SET outcome = 'reidentified', previous_source_id = g.source_id,
            content_changed = false
        FROM appeared a JOIN gone g ON g.content_hash = a.content_hash AND g.n = a.n
        WHERE s.run_id = %(run)s AND s.seq = a.seq
        """, params)


def merge(conn, run_id: int, portal_url: str, seen_at, model: str, search_config: str = "simple", *,
          prelink: bool = False, unchanged: int | None = None) -> dict[str, int]:
    """Inside the caller's transaction: created and updated records into datasets, unchanged ones
    only marked seen, and every dataset of the portal linked to its vector where one exists for
    ``model`` (search's copy of each vector linked now written beside it: dataset_vectors).
    ``search_config`` (the portal's language) is the text-search configuration its datasets are
    indexed with (dataset_search, kept by triggers), but for those whose record declares a language
    PostgreSQL stems (staged ``language``, kept in datasets.language): theirs. Returns ``skipped``:
    changed datasets left without a vector (embedding deferred).

    ``prelink``: the caller writes search's copies of the portal's vectors after the merge
    (vectors.copy_for_search over every dataset: a run that listed the whole portal, or the first
    of a model). New datasets are then inserted already linked to their vector instead of inserted
    and then updated by vectors.link: on a first sync, every row of datasets written once, not
    twice, and no dead row version left for the next run's lookups to skip until a vacuum (the
    link's update of 1,000,000 datasets took 51 s, issue 40).

    ``unchanged``: how many of the run's records classify found unchanged (its counts, in the run's
    stats), when the caller knows; 0 skips marking them seen, a pass over the run's staged records
    that finds none (a first sync: 4.6 s at 100,000 with other work beside it, issue 40)."""
    params = {"run": run_id, "portal": portal_url, "seen": seen_at, "model": model, "config": search_config,
              "text": SEARCH_TEXT, "prelink": prelink}
    # Re-identified datasets take their new id first; the upsert below then updates them in place.
    conn.execute(
        """
        UPDATE datasets d SET source_id = s.source_id
        FROM staging_records s
        WHERE s.run_id = %(run)s AND s.outcome = 'reidentified'
          AND d.portal_url = %(portal)s AND d.source_id = s.previous_source_id
        """, params)
    # The portal's language changed: its other datasets without a language of their own are
    # indexed again (once, set-based). They are looked at only when the configuration the last run
    # noted (sql/013; runs.commit notes it from the first commit on) is not this one; before the
    # insert below, so that a first sync has none to look at.
    conn.execute(
        """
        UPDATE datasets SET search_config = %(config)s::regconfig
        WHERE portal_url = %(portal)s AND language IS NULL AND search_config <> %(config)s::regconfig
          AND NOT EXISTS (SELECT 1 FROM portal_sync_status p
                          WHERE p.portal_url = %(portal)s AND p.search_config = %(config)s::regconfig)
        """, params)
    conn.execute(
        """
        INSERT INTO datasets AS d (portal_url, source_id, name, url, url_hash, content_hash, metadata_hash, title,
            description, tags, organization, metadata_modified, first_seen_at, updated_at,
            removed_at, embedded_content_hash, raw, language, search_config)
        SELECT %(portal)s, s.source_id, s.name, s.url, s.url_hash, s.content_hash, s.metadata_hash, s.title,
            s.description, s.tags, s.organization, s.metadata_modified, %(seen)s, %(seen)s,
            NULL,
            -- a new dataset whose vector is there is linked as it is written (see ``prelink``)
            CASE WHEN %(prelink)s AND EXISTS (SELECT 1 FROM embeddings e
                                                WHERE e.content_hash = decode(s.content_hash, 'hex')
                                                  AND e.model = """ + vectors.MODEL_ID + """) THEN s.content_hash END,
            s.raw, s.language::regconfig, coalesce(s.language::regconfig, %(config)s::regconfig)
        FROM staging_records s
        WHERE s.run_id = %(run)s AND s.outcome IN ('created', 'updated', 'reidentified')
        ON CONFLICT (portal_url, source_id) DO UPDATE SET
            name = EXCLUDED.name, url = EXCLUDED.url, url_hash = EXCLUDED.url_hash,
            content_hash = EXCLUDED.content_hash, metadata_hash = EXCLUDED.metadata_hash,
            title = EXCLUDED.title, description = EXCLUDED.description, tags = EXCLUDED.tags,
            organization = EXCLUDED.organization, metadata_modified = EXCLUDED.metadata_modified,
            updated_at = EXCLUDED.updated_at, removed_at = NULL, raw = EXCLUDED.raw, language = EXCLUDED.language,
            search_config = EXCLUDED.search_config,
            -- a dataset back from removal is linked again below, to a vector of this run's model:
            -- its old link may be to a model the portal has since left (see vectors._pending)
            embedded_content_hash = CASE WHEN d.removed_at IS NULL THEN d.embedded_content_hash END
        """, params)
    # Datasets indexed before the search text held their other languages' titles (sql/025) are
    # indexed again, once per portal, by its first run since: those with translations.
    stale = conn.execute("SELECT 1 FROM portal_sync_status WHERE portal_url = %(portal)s"
                         " AND search_text IS DISTINCT FROM %(text)s", params).fetchone()
    if stale:
        conn.execute("SELECT harvester_search_refresh(ARRAY(SELECT id FROM datasets"
                     " WHERE portal_url = %(portal)s AND raw ? 'translations'))", params)
        conn.execute("UPDATE portal_sync_status SET search_text = %(text)s WHERE portal_url = %(portal)s", params)
    conn.execute("UPDATE portal_sync_status SET search_config = %(config)s::regconfig"
                 " WHERE portal_url = %(portal)s AND search_config IS DISTINCT FROM %(config)s::regconfig", params)
    if unchanged != 0:
        _mark_unchanged_seen(conn, params)
    # A vector is linked only when it is of the dataset's current text: a dataset whose text
    # changed never keeps its old vector. Search's copy of each newly linked vector goes beside it.
    vectors.link(conn, portal_url, model)
    # Each of them is a row of the run's report (embedding-deferred), written as it is counted.
    skipped = outcomes.record_deferred(conn, run_id, portal_url, model)
    return {"skipped": int(skipped)}


def _mark_unchanged_seen(conn, params: dict) -> None:
    """The datasets of the run's unchanged records marked seen (dataset_seen, sql/044), and their
    declared language and modified time taken where they differ.

    A dataset's row is not written for the sighting itself: a full sync sees every dataset of its
    portal, and a new version of each whole row (about 700 bytes in line, five indexes) was the cost
    of one timestamp. Its row in dataset_seen (44 bytes, fillfactor 50) is updated in place instead;
    when a run last saw a dataset is greatest(datasets.updated_at, dataset_seen.last_seen_at)."""
    conn.execute(
        """
        INSERT INTO dataset_seen AS k (dataset_id, last_seen_at)
        SELECT DISTINCT d.id, %(seen)s::timestamptz
        FROM staging_records s
        JOIN datasets d ON d.portal_url = %(portal)s AND d.source_id = s.source_id
        WHERE s.run_id = %(run)s AND s.outcome = 'unchanged'
        ORDER BY d.id  -- (new keys in order: the key's pages filled, not split in halves)
        ON CONFLICT (dataset_id) DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at
        """, params)
    conn.execute(
        """
        UPDATE datasets d SET
            -- (the declared language is in no hash: a record that starts or stops declaring one,
            -- or declares another, is unchanged; the row trigger indexes it again only then)
            language = s.language::regconfig,
            search_config = coalesce(s.language::regconfig, %(config)s::regconfig),
            -- (the modified time the portal gives now, though nothing tracked changed: what a
            -- reconciliation compares with the portal's listing, a WAF file touched and re-listed)
            metadata_modified = s.metadata_modified
        FROM staging_records s
        WHERE s.run_id = %(run)s AND s.outcome = 'unchanged'
          AND d.portal_url = %(portal)s AND d.source_id = s.source_id
          AND (d.language, d.search_config, d.metadata_modified)
              IS DISTINCT FROM (s.language::regconfig, coalesce(s.language::regconfig, %(config)s::regconfig),
                                s.metadata_modified)
        """, params)


def live_count(conn, portal_url: str) -> int:
    return conn.execute("SELECT count(*) FROM datasets WHERE portal_url = %s AND removed_at IS NULL",
                        (portal_url,)).fetchone()[0]


def page_live(conn, portal_url: str | None, *, limit: int = 10) -> tuple[list[dict], int]:
    """The portal's live datasets (every portal's: None), most recently modified first, at most
    ``limit``, and how many it has in all. ``embedded``: its current text has its vector linked."""
    keys = ("title", "organization", "url", "metadata_modified", "content_hash", "embedded", "tags")
    params = {"portal": portal_url, "limit": limit}
    where = "removed_at IS NULL" + ("" if portal_url is None else " AND portal_url = %(portal)s")
    rows = conn.execute(
        f"SELECT title, organization, url, metadata_modified, content_hash,"
        f" coalesce(embedded_content_hash = content_hash, false) AS embedded, tags FROM datasets WHERE {where}"
        f" ORDER BY metadata_modified DESC NULLS LAST, id LIMIT %(limit)s", params).fetchall()
    total = conn.execute(f"SELECT count(*) FROM datasets WHERE {where}", params).fetchone()[0]
    return [dict(zip(keys, row)) for row in rows], int(total)


def new_in_run(conn, run_id: int, portal_url: str) -> int:
    """Distinct usable records this run staged that are not live datasets yet (new or restored):
    what this run adds to the portal's live count."""
    return conn.execute(
        """
        SELECT count(DISTINCT s.source_id) FROM staging_records s
        WHERE s.run_id = %(run)s AND s.error IS NULL
          AND NOT EXISTS (SELECT 1 FROM datasets d WHERE d.portal_url = %(portal)s AND d.source_id = s.source_id
                            AND d.removed_at IS NULL)
        """, {"run": run_id, "portal": portal_url}).fetchone()[0]


# The tables a run writes in proportion to what it changed. After a bulk load (a first sync, a
# large re-sync) they have no statistics for their new rows until autovacuum analyzes them, minutes
# later: meanwhile PostgreSQL plans the next run's statements, and searches, for a table of another
# size. Measured at 1,000,000 datasets (bench/scale_bench.py): the incremental run right after the
# first sync spent over three minutes on new_in_run's count of 1,000 staged records, planned on the
# statistics of an empty datasets table.
ANALYZED_AFTER_BULK = ("datasets", "dataset_search", "dataset_versions", "dataset_changes", "embeddings",
                       "dataset_vectors")
ANALYZE_MIN_ROWS = 10_000
ANALYZE_SHARE = 0.1   # as autovacuum_analyze_scale_factor's default


# Vacuumed, not only analyzed: the table whose counts (a portal's live datasets, several a run)
# are index-only scans, which read the heap for every row of a page the visibility map does not
# mark all-visible. Until autovacuum came by (minutes after a first sync of 1,000,000), each count
# of the next run read every row: 0.5 s each at 1,000,000 (issue 40). Its TOAST table (the
# records, written once) is left to autovacuum: the counts never read it.
VACUUMED_AFTER_BULK = ("datasets",)


def analyze_after_bulk(conn, changed: int) -> list[str]:
    """After a run's commit (``conn`` in autocommit): ANALYZE the tables the run wrote when it
    changed at least ANALYZE_MIN_ROWS datasets and at least ANALYZE_SHARE of what ``datasets``
    held by the last statistics (always when it has none), VACUUM (ANALYZE) those of
    VACUUMED_AFTER_BULK. SKIP_LOCKED: a table someone vacuums, analyzes or indexes concurrently
    (the HNSW build) is left to them. Returns the tables analyzed (and vacuumed)."""
    if changed < ANALYZE_MIN_ROWS:
        return []
    estimated = conn.execute("SELECT reltuples FROM pg_class WHERE oid = 'datasets'::regclass").fetchone()[0]
    if 0 <= estimated and changed < ANALYZE_SHARE * estimated:
        return []
    skipped: list[str] = []

    def notice(diag) -> None:  # 'skipping analyze of "embeddings" --- lock not available'
        if "skipping analyze" in (diag.message_primary or ""):
            skipped.append(diag.message_primary)

    _wait_for_wal_flush(conn)
    conn.add_notice_handler(notice)
    done = []
    try:
        for table in ANALYZED_AFTER_BULK:
            del skipped[:]
            if table in VACUUMED_AFTER_BULK:
                conn.execute(f"VACUUM (ANALYZE, SKIP_LOCKED, PROCESS_TOAST FALSE) {table}")
            else:
                conn.execute(f"ANALYZE (SKIP_LOCKED) {table}")
            if not skipped:
                done.append(table)
    finally:
        conn.remove_notice_handler(notice)
    return done


def _wait_for_wal_flush(conn, timeout: float = 2.0) -> None:
    """Wait (at most ``timeout`` seconds) until the WAL written so far is flushed. Until the run's
    commit is flushed, no row it wrote can be hinted committed and a vacuum marks no page
    all-visible: with synchronous_commit off (the embedded server's setting), a vacuum right after
    the commit marked none, one 0.6 s later every page. The WAL writer flushes every 200 ms."""
    import time

    target = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    deadline = time.monotonic() + timeout
    while not conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (target,)).fetchone()[0]:
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)
