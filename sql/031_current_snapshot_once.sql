-- The current version's snapshot is held once, by the dataset's row (issue 40: storage).
--
-- Why: a version's snapshot (changes.snapshot: the cleaned title and description and the tracked
-- metadata) is built in Python from the dataset's row (title, description, raw), and the current
-- version's repeated what that row holds: 2.2-2.4 KB a dataset of dataset_versions' 2.6-2.9 KB at
-- 20,000 datasets (bench/storage_bench.py). From now on a new current version stores no snapshot
-- (NULL) and readers build it from the dataset's row (store/history.py); a run that makes a new
-- version writes the replaced version's snapshot (the old snapshot its comparison built, from the
-- row before the merge overwrote it; staged in staging_changes.old_snapshot) in the statement that
-- ends its is_current. A version that is not current always holds its snapshot (a CHECK here).
--
-- Nothing stored is lost: this migration NULLs no snapshot. A current version that holds one (every
-- current version of a database harvested before 031) keeps it, and every reader takes a stored
-- snapshot before the one built from the row: a stored snapshot can differ from what the row gives
-- today (tracked_metadata or a cleaner changed since it was stored), and what the history showed is
-- what it shows. A run drops a stored current snapshot only when it proves it equal to the row's
-- (store/history.compute_changes, for each record it sees unchanged whose current version holds
-- one; written by write_history in the run's transaction). The cost: an upgraded database saves
-- nothing for a dataset until a run replaces its version or sees it unchanged; the first full sync
-- after the upgrade builds the snapshot of every dataset it sees unchanged (about the work of a
-- first sync's comparison, once); a stored snapshot that differs stays and is compared again by
-- each run that sees its dataset unchanged.
--
-- What SQL users see changes in 032 (`v.title`, `v.description`, `current_datasets`), apart so
-- that tests of older migrations can apply this part (which today's writer needs) before 020 and
-- 023 and 032 after them. staging_changes loses `snapshot` (a new dataset's snapshot is no longer
-- built, nor staged: a first sync stages kilobytes less a dataset) for `old_snapshot` and
-- `forget_snapshot`; a run staged by the code before and committed by this one needs neither
-- (every current version it replaces holds its snapshot).
--
-- Cost of the migration itself: catalogue changes and the CHECK's scan of dataset_versions (seconds
-- at a million versions, under an ACCESS EXCLUSIVE lock: runs wait). Runs on PostgreSQL 15 to 18.
ALTER TABLE dataset_versions
    ALTER COLUMN snapshot DROP NOT NULL,
    ADD CONSTRAINT dataset_versions_snapshot_kept CHECK (is_current OR snapshot IS NOT NULL);

-- old_snapshot: the snapshot the version a run replaces takes (NULL: none to write); forget_snapshot:
-- the current version's stored snapshot proved equal to its row's, to be dropped.
ALTER TABLE staging_changes DROP COLUMN snapshot, ADD COLUMN old_snapshot jsonb,
    ADD COLUMN forget_snapshot boolean NOT NULL DEFAULT false;

