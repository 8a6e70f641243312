"""Dataset history: versions, change rows, removals and restorations (sql/003_history.sql).

A run's history is written in two steps, like its datasets:

1. ``compute_changes`` (after hash_compare, outside any long transaction): streams the run's
   created and updated records with the dataset's current version, works out each change in
   Python with the pure ``harvester.domain.changes`` and stages the result in ``staging_changes``.
2. ``write_history`` and, after a clean full sync, ``apply_removals``: inside the upsert's
   transaction, after ``datasets.merge``, with set-based SQL: versions closed and opened,
   ``dataset_changes`` rows written; the staged changes are dropped with the run's other staging
   at the end of the commit (``staging.clear``).

Rules
    A dataset gets a new version when its snapshot (``changes.snapshot``) differs from its current
    version's, i.e. when its text or tracked metadata changed; a run that sees it unchanged writes
    no version (the merge marks the dataset seen: ``dataset_seen``, sql/044). Versions are
    numbered 1, 2, 3... and exactly one is current (a partial unique index), also for a removed
    dataset: its last known state.

    A record hash_compare calls updated whose snapshot equals its current version's (``detect``
    returns None) gets neither a version nor a change row: nothing a user can see changed. That
    happens when the hashes change but the tracked fields do not, e.g. a new text recipe
    (``dataset.TEXT_RECIPE``) changes every content_hash. The current version's hashes are
    refreshed in place so they keep matching the dataset (its title and description are its
    snapshot's, sql/020, and did not change).

    The current version stores no snapshot (sql/031): the dataset's row (title, description, raw)
    is its snapshot, built when read (``get_version``, ``list_versions``, and the comparison of
    ``compute_changes``), and a new dataset's snapshot is never built. When a run makes a new
    version, the version it replaces takes the snapshot it had (built by ``compute_changes`` from the
    row before the merge, staged as ``old_snapshot``) in the statement that ends its ``is_current``.
    A current snapshot stored before sql/031 is kept and read first; a run that sees its dataset
    unchanged drops it when it equals the one the row gives (``forget_snapshot``).

    Likewise the current version's ``last_seen_at`` is its dataset's (sql/033): a current version
    is written with NULL and read as its dataset's, so a run that sees its dataset unchanged writes
    no version. A dataset's is ``greatest(d.updated_at, k.last_seen_at)`` (sql/044): its last
    change, or a later sighting unchanged in ``dataset_seen k`` (LEFT JOIN). The version a run
    replaces takes the value it had as current, the dataset's before the merge (read by
    ``compute_changes``, staged as ``old_last_seen_at``), in the statement that ends its
    ``is_current``. A current version whose stored value differed from its dataset's at the upgrade
    keeps it until a run sees the dataset at or after it.

    Datasets harvested before this history existed have no version. The first run that sees one
    gives it a version: an edit or a restoration is detected against the dataset's row (its title,
    description and raw package) and recorded as usual, with ``old_version`` NULL; a dataset seen
    unchanged gets a baseline version 1 (change_type ``new``) and no change row: it is not news.

    Removal: only after a clean full sync (``apply_removals``), a live dataset of the portal whose
    id is not among the run's staged records gets ``removed_at`` and a ``removed`` change; its
    current version stays current (old_version = new_version). When that would remove more than
    ``max_share`` of the portal's live datasets, nothing is removed unless ``force``. A removed
    dataset that comes back (hash_compare calls it updated, merge clears removed_at) gets a
    ``restored`` change: a new version if it changed while gone, else old_version = new_version.
"""
from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime
from decimal import Decimal

from harvester.config.secrets import redact_url
from harvester.domain import changes as ch
from harvester.domain.dataset import normalize_url, sha256_hex
from harvester.pipeline.readahead import read_ahead
from harvester.store import deletions, duplicates, outcomes, staging
from harvester.store.staging import as_jsonb

log = logging.getLogger(__name__)

RECORDED_TYPES = (ch.NEW, ch.CONTENT_UPDATED, ch.TITLE_CHANGED, ch.DATE_CHANGED, ch.METADATA_UPDATED, ch.RESTORED,
                  ch.REIDENTIFIED)

_STAGED_COLUMNS = ("run_id", "source_id", "change_type", "changed_fields", "significance", "requires_review",
                   "old_snapshot", "new_version", "record_change", "forget_snapshot", "old_last_seen_at")
# The columns of staging_changes that the upsert's statements filter and join on (analyzed).
_PLANNED_CHANGE_COLUMNS = ("run_id", "source_id", "new_version", "record_change")
_STAGED_TYPES = ("int8", "text", "text", "jsonb", "numeric", "bool", "jsonb", "bool", "bool", "bool", "timestamptz")

# The run's updated and reidentified records of datasets we have (the latter with the dataset under
# its old id; classify leaves one per source_id: older copies are 'duplicate'; a new dataset's change
# is staged set-based, _STAGE_NEW), records seen unchanged whose dataset has no version yet
# (harvested before history existed), and records seen unchanged whose current version still holds
# a snapshot (stored before sql/031), to prove it equal to the row's and drop it. Each with whether the dataset has a version, its current version's stored
# snapshot, removed_at and, when no snapshot is stored, the dataset's row, which stands in for it; and
# the dataset's last_seen_at before this run's merge (the one a replaced version takes, sql/033).
_TO_COMPARE = """
    SELECT s.source_id, s.title, s.description, s.raw, s.outcome, d.id, d.removed_at, v.dataset_id IS NOT NULL,
           v.snapshot,
           CASE WHEN v.snapshot IS NULL OR s.outcome = 'unchanged' THEN d.title END,
           CASE WHEN v.snapshot IS NULL OR s.outcome = 'unchanged' THEN d.description END,
           CASE WHEN v.snapshot IS NULL OR s.outcome = 'unchanged' THEN d.raw END,
           s.previous_source_id, greatest(d.updated_at, k.last_seen_at)
    FROM staging_records s
    JOIN datasets d ON d.portal_url = %(portal)s AND d.source_id = coalesce(s.previous_source_id, s.source_id)
    LEFT JOIN dataset_seen k ON k.dataset_id = d.id
    LEFT JOIN dataset_versions v ON v.dataset_id = d.id AND v.is_current
    WHERE s.run_id = %(run)s
      AND (s.outcome IN ('created', 'updated', 'reidentified')
           OR (s.outcome = 'unchanged' AND (v.dataset_id IS NULL OR v.snapshot IS NOT NULL)))
    ORDER BY s.seq
"""
# A new dataset's change ('new': a first version, no field changes, the portal's weight for new):
# no snapshot is built, nor staged, since its version stores none (sql/031).
_STAGE_NEW = """
    INSERT INTO staging_changes (run_id, source_id, change_type, changed_fields, significance, requires_review,
        new_version, record_change)
    SELECT %(run)s, s.source_id, %(type)s, '{}', %(significance)s, %(review)s, true, true
    FROM staging_records s
    WHERE s.run_id = %(run)s AND s.outcome IN ('created', 'updated', 'reidentified')
      AND NOT EXISTS (SELECT 1 FROM datasets d
                      WHERE d.portal_url = %(portal)s AND d.source_id = coalesce(s.previous_source_id, s.source_id))
"""


def clear(conn, run_id: int) -> None:
    """Drop a run's staged changes (a failed or cancelled run's too): the table truncated when no
    other run's are there (staging.release: a first sync's snapshots are KBs a dataset)."""
    staging.release(conn, "staging_changes", run_id)


def _staged_row(run_id: int, row: tuple, config: ch.SignificanceConfig) -> tuple:
    source_id, title, description, raw, outcome, dataset_id, removed_at, has_version, stored, row_title, \
        row_description, row_raw, previous_source_id, last_seen_at = row
    # The current version's snapshot: the one it stores (a version written before sql/031), else the
    # dataset's row's (its row before this run's merge: what the current version holds).
    from_row = None if row_title is None else ch.snapshot(row_title, row_description, row_raw or {}, decoded=True)
    old = stored if stored is not None else from_row
    if outcome == "unchanged" and has_version:  # a stored current snapshot to prove equal to the row's
        if from_row != stored:  # kept (the row gives another today): nothing to stage
            return None
        return (run_id, source_id, ch.METADATA_UPDATED, as_jsonb({}), Decimal(0), False, None, False, False, True,
                None)
    new = ch.snapshot(title, description, raw, decoded=True)
    if outcome == "reidentified":
        change = ch.reidentification(old, new, previous_source_id, source_id, config)
    elif removed_at is not None:
        change = ch.restoration(old, new, config)
    else:
        change = ch.detect(old, new, config)
    new_version = not has_version or old != new
    record_change = change is not None and outcome != "unchanged"
    if record_change:
        change_type, fields, significance, review = (change.change_type, change.changed_fields,
                                                     change.significance, change.requires_review)
    else:  # a baseline version, or a hash change no snapshot field shows
        change_type = ch.NEW if not has_version else ch.METADATA_UPDATED
        fields, significance, review = {}, 0.0, False
    # The version this one replaces gets the snapshot it had, when it stores none, and the last_seen_at
    # it had as current: its dataset's, which the merge moves (write_history; sql/031, 033).
    replaced = new_version and has_version
    return (run_id, source_id, change_type, as_jsonb(fields), Decimal(str(significance)), review,
            as_jsonb(old) if replaced and stored is None else None, new_version, record_change, False,
            last_seen_at if replaced else None)


def _write_staged(conn, rows: list[tuple]) -> None:
    with conn.cursor() as cur:
        with cur.copy(f"COPY staging_changes ({', '.join(_STAGED_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(list(_STAGED_TYPES))
            for row in rows:
                copy.write_row(row)


def compute_changes(conn, reader, run_id: int, portal_url: str, config: ch.SignificanceConfig = ch.DEFAULT, *,
                    batch_size: int = 200) -> dict[str, int]:
    """Work out the run's changes into ``staging_changes``; run after hash_compare, before upsert.

    ``reader`` is a connection of its own: it streams the records through a server-side cursor
    while ``conn`` writes each batch with binary COPY (``batch_size`` records; three batches are held
    at once, each record's raw JSON and snapshot, twice for an update: batches of 1,000 real records
    with their resources lists were 120 MB of a 10,000-dataset first sync's 405 MB peak, issue 40).
    A retry starts over (the run's staged changes are deleted first), and staged changes of runs no
    longer running are swept away.

    Returns the changes to be recorded per change type (``new``, ``content_updated``,
    ``title_changed``, ``date_changed``, ``metadata_updated``, ``restored``), ``review``: how many
    of them require review, ``baseline``: versions for datasets harvested before history existed
    (no change row), ``unchanged_snapshot``: updated records whose snapshot did not change, and
    ``snapshots_dropped``: current versions seen unchanged whose stored snapshot (written before
    sql/031) equals the one their dataset's row gives, which write_history drops (a stored one that
    differs is kept: readers prefer it).

    A new dataset's change is staged by one statement, with no snapshot: its version stores none
    (the dataset's row is its current snapshot, sql/031), and nothing compares against it.
    """
    conn.execute("DELETE FROM staging_changes s USING sync_runs r WHERE r.run_id = s.run_id AND r.status <> 'running'"
                 " AND NOT r.resumable")
    clear(conn, run_id)  # (after the sweep: the table is then truncated when no other run's changes are left)
    counts: Counter = Counter()
    params = {"run": run_id, "portal": portal_url}
    first = ch.detect(None, {}, config)  # (a new dataset's change reads no snapshot)
    new = conn.execute(_STAGE_NEW, {**params, "type": first.change_type, "significance": Decimal(str(first.significance)),
                                    "review": first.requires_review}).rowcount
    if new:
        counts[first.change_type] += new
        counts["review"] += new * int(first.requires_review)
    with reader.transaction():
        with reader.cursor(name=f"harvester_changes_{run_id}") as cur:
            cur.itersize = batch_size
            cur.execute(_TO_COMPARE, params)
            # The next batch is fetched (PostgreSQL reads it, psycopg decodes its JSON) in a thread
            # of its own while this one is worked out and written (see sources/readahead.py).
            with read_ahead(iter(lambda: cur.fetchmany(batch_size), []), depth=1,
                            name=f"harvester-changes-{run_id}") as batches:
                for rows in batches:
                    staged = [r for r in (_staged_row(run_id, row, config) for row in rows) if r is not None]
                    _write_staged(conn, staged)
                    for row in staged:
                        change_type, review, new_version, record_change, forget = row[2], row[5], row[7], row[8], row[9]
                        if forget:
                            counts["snapshots_dropped"] += 1
                        elif record_change:
                            counts[change_type] += 1
                            counts["review"] += int(review)
                        elif new_version:
                            counts["baseline"] += 1
                        else:
                            counts["unchanged_snapshot"] += 1
    # The upsert joins it: plan on its real size. Only the columns its statements filter and join
    # on: sampling the snapshots (KBs a dataset) took 0.2-0.4 s of a 20,000-dataset first sync for no plan.
    conn.execute(f"ANALYZE staging_changes ({', '.join(_PLANNED_CHANGE_COLUMNS)})")
    out = {key: counts.get(key, 0) for key in (*RECORDED_TYPES, "review", "baseline", "unchanged_snapshot",
                                               "snapshots_dropped")}
    # Only the kinds that occurred: a short line the log viewer does not cut (the full dict at DEBUG).
    log.info("changes of run %s: %s", run_id,
             ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in out.items() if v) or "none")
    log.debug("compute_changes run %s: %s", run_id, out)
    return out


_STAGED_DATASETS = """
    FROM staging_changes c
    JOIN datasets d ON d.portal_url = %(portal)s AND d.source_id = c.source_id
"""


def write_history(conn, run_id: int, portal_url: str, seen_at: datetime) -> dict[str, int]:
    """Inside the upsert's transaction, after ``datasets.merge`` and before the run's staging
    records are dropped: the staged changes into ``dataset_versions`` and ``dataset_changes``.
    Set-based: a few statements for the whole run. Returns ``versions`` (new versions), ``changes``
    (change rows), ``refreshed`` (versions updated in place), ``snapshots_dropped`` (stored current
    snapshots compute_changes proved equal to their row's) and ``last_seen_cleared`` (current
    versions seen by this run that held a last_seen_at of their own, now their dataset's).

    A dataset seen unchanged gets no write here: its current version's last_seen_at is its
    dataset's (sql/033), which the merge moved (dataset_seen, sql/044).

    Raises RuntimeError when a created or updated record has no staged change: compute_changes
    did not run for this run (writing on would leave datasets without a current version)."""
    params = {"run": run_id, "portal": portal_url, "seen": seen_at}
    missing = conn.execute(
        """
        SELECT count(*) FROM staging_records s
        WHERE s.run_id = %(run)s AND s.outcome IN ('created', 'updated', 'reidentified')
          AND NOT EXISTS (SELECT 1 FROM staging_changes c WHERE c.run_id = s.run_id AND c.source_id = s.source_id)
        """, params).fetchone()[0]
    if missing:
        raise RuntimeError(f"run {run_id}: {missing} created or updated records have no computed change;"
                           " run history.compute_changes after hash_compare")
    # The current versions being superseded are closed first: the partial unique index allows one
    # current version per dataset at any moment.
    # The replaced version takes its snapshot (staged by compute_changes from the dataset's row before
    # the merge) unless it stores one: only the current version's is the dataset's row (sql/031); and
    # likewise its last_seen_at, the dataset's before the merge moved it (sql/033).
    conn.execute(
        f"""
        UPDATE dataset_versions v SET is_current = false, snapshot = coalesce(v.snapshot, c.old_snapshot),
            last_seen_at = coalesce(v.last_seen_at, c.old_last_seen_at)
        {_STAGED_DATASETS}
        WHERE c.run_id = %(run)s AND c.new_version AND v.dataset_id = d.id AND v.is_current
        """, params)
    # A new current version's last_seen_at is its dataset's (NULL here, sql/033).
    versions = conn.execute(
        f"""
        INSERT INTO dataset_versions (dataset_id, version_number, content_hash, metadata_hash, is_current,
            change_type, first_seen_at)
        SELECT d.id, coalesce(m.last, 0) + 1, d.content_hash, d.metadata_hash, true, c.change_type, %(seen)s
        {_STAGED_DATASETS}
        CROSS JOIN LATERAL (SELECT max(version_number) AS last FROM dataset_versions p WHERE p.dataset_id = d.id) m
        WHERE c.run_id = %(run)s AND c.new_version
        """, params).rowcount
    changes = conn.execute(
        f"""
        INSERT INTO dataset_changes (dataset_id, run_id, change_type, changed_fields, significance_score,
            requires_review, old_version, new_version, detected_at)
        SELECT d.id, %(run)s, c.change_type, c.changed_fields, c.significance, c.requires_review,
            CASE WHEN c.new_version THEN nullif(v.version_number - 1, 0) ELSE v.version_number END,
            v.version_number, %(seen)s
        {_STAGED_DATASETS}
        JOIN dataset_versions v ON v.dataset_id = d.id AND v.is_current
        WHERE c.run_id = %(run)s AND c.record_change
        """, params).rowcount
    refreshed = conn.execute(
        f"""
        UPDATE dataset_versions v SET content_hash = d.content_hash, metadata_hash = d.metadata_hash
        {_STAGED_DATASETS}
        WHERE c.run_id = %(run)s AND NOT c.new_version AND NOT c.forget_snapshot AND v.dataset_id = d.id
          AND v.is_current
        """, params).rowcount
    # Stored current snapshots proven equal to their row's (compute_changes) are dropped.
    dropped = conn.execute(
        f"""
        UPDATE dataset_versions v SET snapshot = NULL
        {_STAGED_DATASETS}
        WHERE c.run_id = %(run)s AND c.forget_snapshot AND v.dataset_id = d.id AND v.is_current
        """, params).rowcount
    # A current version holding a last_seen_at of its own (kept by sql/033: one later than its
    # dataset's) whose dataset this run saw (the merge made its last sighting this run's start) at
    # or after it: the dataset's reads as the old writer's greatest(own, seen) would. Found by the
    # partial index of such versions (normally empty), whatever the run's size.
    cleared = conn.execute(
        """
        UPDATE dataset_versions v SET last_seen_at = NULL
        FROM datasets d
        WHERE v.is_current AND v.last_seen_at IS NOT NULL AND v.last_seen_at <= %(seen)s
          AND d.id = v.dataset_id AND d.portal_url = %(portal)s
          AND greatest(d.updated_at, (SELECT k.last_seen_at FROM dataset_seen k WHERE k.dataset_id = d.id)) = %(seen)s
        """, params).rowcount
    # The staged changes go with the run's other staging at the end of the commit (staging.clear):
    # the table truncated there, its lock held for the commit's last statements only.
    return {"versions": versions, "changes": changes, "refreshed": refreshed, "snapshots_dropped": dropped,
            "last_seen_cleared": cleared}


def apply_removals(conn, run_id: int, portal_url: str, seen_at: datetime, *, max_share: float = 0.2,
                   force: bool = False, removed_significance: float = ch.DEFAULT.removed,
                   review_threshold: float = ch.DEFAULT.review_threshold,
                   deleted_only: bool = False) -> dict[str, int]:
    """Inside the upsert's transaction, after ``datasets.merge``, only after a clean full sync or
    reconciliation (or, ``deleted_only``, after any run that staged deletions):
    every live dataset of the portal whose id is not among the run's staged records gets
    ``removed_at = seen_at`` and a ``removed`` change (``removed_significance``, review when it
    reaches ``review_threshold``). Its current version stays current.

    The guard: when the datasets to remove are more than ``max_share`` of the portal's live
    datasets (counted after the merge), nothing is removed and a WARNING says so, unless
    ``force``. Returns ``removed``, ``would_remove`` and ``removal_guard_tripped`` (0 or 1).
    A reconciling run (``sync_runs.reconcile_reason`` set) listed every identifier of the portal
    into ``staging_listing`` (store/listing.py): a dataset in neither that listing nor the run's
    staged records is gone, under the same guard.

    The records the portal said it deleted (store/deletions.py: an OAI-PMH ``status="deleted"``)
    are removed too, by any run: ``deleted_only`` removes those alone (an incremental run), under
    the same guard.

    Raises ValueError for a run that neither was a full sync nor reconciled, unless
    ``deleted_only``: an incremental listing's absences say nothing about what is gone."""
    if not 0 <= max_share <= 1:
        raise ValueError(f"max_share {max_share!r} must be a number from 0 to 1")
    row = conn.execute("SELECT mode, reconcile_reason FROM sync_runs WHERE run_id = %s", (run_id,)).fetchone()
    if row is None:
        raise LookupError(f"no run with run_id {run_id}")
    if row[0] != "full" and row[1] is None and not deleted_only:
        raise ValueError(f"run {run_id} is an {row[0]} sync that did not reconcile: only a full sync or a "
                         "reconciliation can tell which datasets are gone")
    params = {"run": run_id, "portal": portal_url, "seen": seen_at}
    unlisted = """
        NOT EXISTS (SELECT 1 FROM staging_records s WHERE s.run_id = %(run)s AND s.source_id = d.source_id)
        AND NOT EXISTS (SELECT 1 FROM staging_listing l WHERE l.run_id = %(run)s AND l.source_id = d.source_id)
    """
    gone_where = f"""
        d.portal_url = %(portal)s AND d.removed_at IS NULL
        AND ({deletions.DELETED_WHERE if deleted_only else f"({unlisted}) OR {deletions.DELETED_WHERE}"})
    """
    live, would_remove = conn.execute(
        f"SELECT count(*), count(*) FILTER (WHERE {gone_where}) FROM datasets d"
        " WHERE d.portal_url = %(portal)s AND d.removed_at IS NULL", params).fetchone()
    out = {"removed": 0, "would_remove": would_remove, "removal_guard_tripped": 0}
    if not would_remove:
        return out
    share = would_remove / live
    if share > max_share and not force:
        kind = "full sync" if row[0] == "full" else "reconciliation" if row[1] is not None else "incremental run"
        gone = "was told of the deletion of" if deleted_only else "did not list"
        log.warning(
            "removal guard: this %s of %s %s %d of its %d live datasets (%.1f%%, more than"
            " the allowed %.1f%%), so none was removed; if the portal really dropped them, trigger a run"
            " with force_removals (and full_sync or reconcile)", kind, portal_url, gone, would_remove, live,
            share * 100, max_share * 100)
        outcomes.record_withheld(
            conn, run_id, portal_url, gone_where, params,
            f"{'deleted by the portal' if deleted_only else 'not listed by this ' + kind}; not removed: the "
            f"removal guard withheld all {would_remove} removals "
            f"({share * 100:.1f}% of {live} live datasets, more than the allowed {max_share * 100:.1f}%)")
        return {**out, "removal_guard_tripped": 1}
    change = ch.removal(ch.SignificanceConfig(removed=removed_significance, review_threshold=review_threshold))
    removed = conn.execute(
        f"""
        WITH gone AS (
            UPDATE datasets d SET removed_at = %(seen)s WHERE {gone_where} RETURNING d.id
        )
        INSERT INTO dataset_changes (dataset_id, run_id, change_type, changed_fields, significance_score,
            requires_review, old_version, new_version, detected_at)
        SELECT g.id, %(run)s, 'removed', '{{}}', %(significance)s, %(review)s, v.version_number, v.version_number,
            %(seen)s
        FROM gone g LEFT JOIN dataset_versions v ON v.dataset_id = g.id AND v.is_current
        """, {**params, "significance": Decimal(str(change.significance)),
              "review": change.requires_review}).rowcount
    if force and share > max_share:
        log.warning("removed %d of %d live datasets of %s (%.1f%%): the removal guard was overridden (force)",
                    removed, live, redact_url(portal_url), share * 100)
    else:
        log.info("removed %d datasets of %s %s", removed, redact_url(portal_url),
                 "the portal says it deleted" if deleted_only else "no longer listed by the portal")
    return {**out, "removed": removed}


# -- queries for the CLI ------------------------------------------------------------------------
_CHANGE_COLUMNS = ("id", "dataset_id", "run_id", "change_type", "changed_fields", "significance_score",
                   "requires_review", "old_version", "new_version", "detected_at", "portal_url", "portal_name",
                   "source_id", "name", "title", "url", "removed_at")


def _change_dict(row: tuple) -> dict:
    out = dict(zip(_CHANGE_COLUMNS, row))
    out["significance"] = float(out.pop("significance_score"))
    out["summary"] = describe(out["change_type"], out["changed_fields"])
    return out


def describe(change_type: str, changed_fields: dict) -> str:
    """``changes.summarize``, or what a change with no field changes means."""
    text = ch.summarize(changed_fields or {})
    if text:
        return text
    return {ch.NEW: "first version", ch.REMOVED: "removed from the portal",
            ch.RESTORED: "back on the portal, unchanged",
            ch.REIDENTIFIED: "listed under a new identifier"}.get(change_type, "no field changes")


def list_changes(conn, portal_url: str | None = None, *, review_only: bool = False, since: datetime | None = None,
                 limit: int | None = None) -> list[dict]:
    """Changes newest first (``recent_dataset_changes``), each with its dataset's title, url and a summary."""
    rows = conn.execute(
        f"""
        SELECT {', '.join(_CHANGE_COLUMNS)} FROM recent_dataset_changes
        WHERE (%(portal)s::text IS NULL OR portal_url = %(portal)s)
          AND (NOT %(review)s OR requires_review)
          AND (%(since)s::timestamptz IS NULL OR detected_at >= %(since)s)
        ORDER BY detected_at DESC, id DESC
        LIMIT %(limit)s
        """, {"portal": portal_url, "review": review_only, "since": since, "limit": limit}).fetchall()
    return [_change_dict(r) for r in rows]


def find_dataset(conn, portal_url: str, *, url: str | None = None, source_id: str | None = None) -> dict | None:
    """A dataset of the portal by its landing page URL (compared normalized) or its CKAN id."""
    if (url is None) == (source_id is None):
        raise ValueError("give exactly one of url and source_id")
    where = "d.source_id = %(key)s" if source_id is not None else "(d.url_hash = %(hash)s OR d.url = %(key)s)"
    row = conn.execute(
        f"SELECT d.id, d.source_id, d.name, d.title, d.url, d.removed_at FROM datasets d"
        f" WHERE d.portal_url = %(portal)s AND {where} ORDER BY d.id LIMIT 1",
        {"portal": portal_url, "key": source_id if source_id is not None else url,
         "hash": sha256_hex(normalize_url(url)) if url else None}).fetchone()
    if row is None:
        return None
    return dict(zip(("id", "source_id", "name", "title", "url", "removed_at"), row))


# Read as v.<name> (v: a row of dataset_versions): title and description are functions of the row
# that read its snapshot, or the dataset's row for a current version that stores none (sql/020,
# 031), which PostgreSQL calls for the qualified name only.
_VERSION_COLUMNS = ("version_number", "is_current", "change_type", "content_hash", "metadata_hash", "title",
                    "description", "snapshot", "first_seen_at", "last_seen_at")
# A version's columns (a current version's last_seen_at its dataset's where it holds none, sql/033),
# then its dataset's title, description and raw record when it stores no snapshot (the current
# version since sql/031: the dataset's row is its snapshot).
_VERSION_SELECT = (", ".join("coalesce(v.last_seen_at, greatest(d.updated_at, k.last_seen_at))" if c == "last_seen_at"
                             else "v." + c
                             for c in _VERSION_COLUMNS)
                   + ", CASE WHEN v.snapshot IS NULL THEN d.title END, CASE WHEN v.snapshot IS NULL THEN d.description END,"
                     " CASE WHEN v.snapshot IS NULL THEN d.raw END")
_VERSION_FROM = ("FROM dataset_versions v JOIN datasets d ON d.id = v.dataset_id"
                 " LEFT JOIN dataset_seen k ON k.dataset_id = d.id")


def _version(row: tuple) -> dict:
    """A version as a dict, its snapshot built from its dataset's row when it stores none."""
    item = dict(zip(_VERSION_COLUMNS, row[:len(_VERSION_COLUMNS)]))
    if item["snapshot"] is None:
        title, description, raw = row[len(_VERSION_COLUMNS):len(_VERSION_COLUMNS) + 3]
        item["snapshot"] = ch.snapshot(title, description, raw or {})
    return item


def list_versions(conn, dataset_id: int) -> list[dict]:
    """Every version of a dataset newest first, each with the changed fields of the change that made it."""
    rows = conn.execute(
        f"""
        SELECT {_VERSION_SELECT}, c.changed_fields, c.significance_score
        {_VERSION_FROM}
        LEFT JOIN LATERAL (
            SELECT changed_fields, significance_score FROM dataset_changes c
            WHERE c.dataset_id = v.dataset_id AND c.new_version = v.version_number
              AND c.old_version IS DISTINCT FROM c.new_version
            ORDER BY c.id DESC LIMIT 1) c ON true
        WHERE v.dataset_id = %s
        ORDER BY v.version_number DESC
        """, (dataset_id,)).fetchall()
    out = []
    for row in rows:
        item = _version(row)
        item["changed_fields"] = row[-2] or {}
        item["significance"] = float(row[-1]) if row[-1] is not None else None
        out.append(item)
    return out


def get_version(conn, dataset_id: int, number: int) -> dict | None:
    row = conn.execute(f"SELECT {_VERSION_SELECT} {_VERSION_FROM}"
                       " WHERE v.dataset_id = %s AND v.version_number = %s", (dataset_id, number)).fetchone()
    return _version(row) if row else None


def current_version_number(conn, dataset_id: int) -> int | None:
    row = conn.execute("SELECT version_number FROM dataset_versions WHERE dataset_id = %s AND is_current",
                       (dataset_id,)).fetchone()
    return row[0] if row else None


def purge(conn, portal_url: str, removed_before: datetime, *, dry_run: bool = False,
          outcomes_before: datetime | None = None) -> dict[str, int]:
    """Delete for good the portal's datasets removed before ``removed_before``, with their versions
    and changes (ON DELETE CASCADE), and its runs' per-record outcomes recorded before
    ``outcomes_before`` (HARVESTER_OUTCOMES_KEEP_DAYS ago, when the caller gives it). Vectors are
    shared by text and stay. ``dry_run``: only count."""
    params = {"portal": portal_url, "before": removed_before}
    where = "d.portal_url = %(portal)s AND d.removed_at IS NOT NULL AND d.removed_at < %(before)s"
    with conn.transaction():
        if not dry_run:  # the lock a run's upsert holds: never purge under a running upsert
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%(portal)s))", params)
        datasets, versions, changes = conn.execute(
            f"""
            SELECT count(*),
                   coalesce(sum((SELECT count(*) FROM dataset_versions v WHERE v.dataset_id = d.id)), 0),
                   coalesce(sum((SELECT count(*) FROM dataset_changes c WHERE c.dataset_id = d.id)), 0)
            FROM datasets d WHERE {where}
            """, params).fetchone()
        if not dry_run and datasets:
            # the duplicate groups the purged datasets were in lose them: their other members are
            # regrouped (a group of one is no group; a purged canonical member is replaced)
            survivors = [r[0] for r in conn.execute(
                f"""
                SELECT DISTINCT o.dataset_id FROM datasets d
                JOIN duplicate_members m ON m.dataset_id = d.id
                JOIN duplicate_members o ON o.group_id = m.group_id
                JOIN datasets od ON od.id = o.dataset_id
                WHERE {where} AND NOT ({where.replace("d.", "od.")})
                """, params)]
            conn.execute(f"DELETE FROM datasets d WHERE {where}", params)
            if survivors:
                duplicates.lock(conn)
                duplicates.regroup(conn, survivors)
        pruned = outcomes.prune(conn, portal_url, outcomes_before, dry_run=dry_run) if outcomes_before else 0
    return {"datasets": int(datasets), "versions": int(versions), "changes": int(changes), "outcomes": pruned,
            "dry_run": dry_run}


# -- queries for the Harvester page in the Airflow UI --------------------------------------------
_PAGE_COLUMNS = ("id", "dataset_id", "run_id", "change_type", "changed_fields", "significance_score",
                 "requires_review", "old_version", "new_version", "detected_at", "reviewed_at", "reviewed_by",
                 "review_note", "review_outcome", "portal_url", "portal_name", "source_id", "name", "title", "url",
                 "removed_at")
_PAGE_FROM = """
    FROM dataset_changes c
    JOIN datasets d ON d.id = c.dataset_id
    LEFT JOIN portal_sync_status p ON p.portal_url = d.portal_url
"""
_COLUMN_OF = {"portal_url": "d.portal_url", "portal_name": "p.portal_name", "source_id": "d.source_id",
              "name": "d.name", "title": "d.title", "url": "d.url", "removed_at": "d.removed_at"}


def page_changes(conn, *, portal_urls: list[str] | None = None, queue: bool = False, change_type: str | None = None,
                 since: datetime | None = None, min_significance: float | None = None,
                 dataset_id: int | None = None, limit: int = 50, offset: int = 0) -> tuple[list[dict], int]:
    """One page of changes, newest first, and how many match in all. ``queue``: only changes that
    require review and have no review yet. The other filters narrow by portal (URLs), change
    type, detection time (at or after ``since``), significance (at least) and dataset. Each
    change comes with its dataset's portal, id, title and url, its review, and a summary."""
    where, params = ["true"], {"limit": limit, "offset": offset}
    if queue:
        where.append("c.requires_review AND c.review_outcome IS NULL")
    if portal_urls is not None:
        where.append("d.portal_url = ANY(%(portals)s)")
        params["portals"] = list(portal_urls)
    if change_type is not None:
        where.append("c.change_type = %(change_type)s")
        params["change_type"] = change_type
    if since is not None:
        where.append("c.detected_at >= %(since)s")
        params["since"] = since
    if min_significance is not None:
        where.append("c.significance_score >= %(min_significance)s")
        params["min_significance"] = Decimal(str(min_significance))
    if dataset_id is not None:
        where.append("c.dataset_id = %(dataset)s")
        params["dataset"] = dataset_id
    condition = " AND ".join(where)
    columns = ", ".join(_COLUMN_OF.get(c, f"c.{c}") for c in _PAGE_COLUMNS)
    rows = conn.execute(f"SELECT {columns} {_PAGE_FROM} WHERE {condition}"
                        " ORDER BY c.detected_at DESC, c.id DESC LIMIT %(limit)s OFFSET %(offset)s", params).fetchall()
    total = conn.execute(f"SELECT count(*) {_PAGE_FROM} WHERE {condition}", params).fetchone()[0]
    return [_page_item(row) for row in rows], int(total)


def _page_item(row: tuple) -> dict:
    item = dict(zip(_PAGE_COLUMNS, row))
    item["significance"] = float(item.pop("significance_score"))
    item["summary"] = describe(item["change_type"], item["changed_fields"])
    return item


def get_change(conn, change_id: int) -> dict | None:
    """One change, as ``page_changes`` gives it; None when there is none with that id."""
    columns = ", ".join(_COLUMN_OF.get(c, f"c.{c}") for c in _PAGE_COLUMNS)
    row = conn.execute(f"SELECT {columns} {_PAGE_FROM} WHERE c.id = %s", (change_id,)).fetchone()
    return _page_item(row) if row else None


def dataset_detail(conn, portal_url: str, source_id: str) -> dict | None:
    """A dataset of the portal by its CKAN id, live or removed; None when we never saw it."""
    columns = ("id", "source_id", "name", "title", "url", "organization", "removed_at", "first_seen_at",
               "last_seen_at", "metadata_modified")
    # when a run last saw it: its last change, or a later sighting unchanged (sql/044)
    selected = ", ".join("greatest(d.updated_at, k.last_seen_at)" if c == "last_seen_at" else "d." + c for c in columns)
    row = conn.execute(f"SELECT {selected} FROM datasets d LEFT JOIN dataset_seen k ON k.dataset_id = d.id"
                       " WHERE d.portal_url = %s AND d.source_id = %s", (portal_url, source_id)).fetchone()
    return dict(zip(columns, row)) if row else None
