-- The current version's last_seen_at held once, by the dataset's row (issue 40: storage, full syncs).
--
-- Why: every run that saw a dataset moved both datasets.last_seen_at and its current version's
-- last_seen_at to the run's start (store/history.write_history), so a full sync of an unchanged
-- portal of 100,000 datasets rewrote 100,000 dataset_versions rows beside the 100,000 datasets rows
-- it must write, and left as many dead row versions; the table kept 30% of every page free for it
-- (fillfactor 70, sql/009). The two values were equal: the dataset's row already says when the
-- dataset was last seen, as 031 made it say what the current version's snapshot is.
--
-- From now on a new current version is written with last_seen_at NULL and readers take
-- `coalesce(v.last_seen_at, d.last_seen_at)` (store/history.py; `current_datasets`: sql/034): a run
-- that sees a dataset unchanged writes no dataset_versions row. A run that replaces a version sets
-- its last_seen_at as it ends its is_current: the dataset's value before this run saw it (read by
-- compute_changes before the merge moves it, staged in staging_changes.old_last_seen_at). A version
-- that is not current always holds its last_seen_at (a CHECK here).
--
-- Nothing stored changes meaning: only a current version whose last_seen_at equals its dataset's is
-- set to NULL (it reads the same value). One that differs (a run whose start was earlier than the
-- version's last sighting: the old writer kept the later one) keeps it and reads it; a run that
-- sees its dataset at or after that time sets it to NULL (write_history), as the old writer would
-- have moved it; the partial index below finds those few without reading the table.
--
-- dataset_versions goes to fillfactor 100: a version is written once as current and once more when
-- a run replaces it (1% of a portal a run, say), and no longer updated by every run; new pages are
-- filled (sql/009's 30% was for the moves). Pages already written keep their room until rewritten.
--
-- Cost of the migration: the UPDATE below writes every current version once (a new row version
-- each; the old ones left for autovacuum, sql/027, whose room later versions reuse): 0.50-0.55 s at
-- 100,000 current versions on the 2-core bench machine (PostgreSQL 18 and 15), so about 5 s at
-- 1,000,000, the table's heap growing by half meanwhile (20.5 -> 30.5 MB at 100,000: 009's free 30%
-- of each page takes some of the new row versions, the rest go to new pages). Runs under the
-- migration's ACCESS EXCLUSIVE lock: runs wait. staging_changes gains old_last_seen_at,
-- filled here for a run staged by the code before and committed by this one. Runs on PostgreSQL 15
-- to 18. What SQL users see is in 034, apart (as 031/032) so that tests of older migrations can
-- apply this part, which today's writer needs, before 020 and 023 and 034 after them.
ALTER TABLE dataset_versions
    ALTER COLUMN last_seen_at DROP NOT NULL,
    ADD CONSTRAINT dataset_versions_last_seen_kept CHECK (is_current OR last_seen_at IS NOT NULL);

-- The last_seen_at the version a run replaces takes (its dataset's before the merge).
ALTER TABLE staging_changes ADD COLUMN old_last_seen_at timestamptz;
UPDATE staging_changes c SET old_last_seen_at = d.last_seen_at
FROM sync_runs r, staging_records s, datasets d
WHERE c.new_version AND r.run_id = c.run_id AND s.run_id = c.run_id AND s.source_id = c.source_id
  AND s.outcome IN ('created', 'updated', 'reidentified', 'unchanged')
  AND d.portal_url = r.portal_url AND d.source_id = coalesce(s.previous_source_id, s.source_id);

UPDATE dataset_versions v SET last_seen_at = NULL
FROM datasets d
WHERE d.id = v.dataset_id AND v.is_current AND v.last_seen_at = d.last_seen_at;

-- The current versions that still hold a last_seen_at of their own (above: normally none), which
-- each run's write_history looks up: 1 ms at 100,000 versions once the statistics know the column
-- is mostly NULL (analyzed here: with those of before, a scan of the table, 62 ms at 100,000). A
-- new database's empty table is left unanalyzed: its first bulk run analyzes it (store/datasets.py).
CREATE INDEX dataset_versions_current_seen ON dataset_versions (dataset_id)
    WHERE is_current AND last_seen_at IS NOT NULL;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM dataset_versions) THEN
        ANALYZE dataset_versions;
    END IF;
END
$$;

ALTER TABLE dataset_versions SET (fillfactor = 100);
