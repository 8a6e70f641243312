-- When a run last saw a dataset it found unchanged is kept apart from the dataset's row, in
-- dataset_seen (issue 40: bytes a dataset; full syncs).
--
-- Why: every run that saw a dataset unchanged set datasets.last_seen_at to its start, a new version
-- of the whole row (about 700 bytes in line) for one timestamp. sql/009 left 30% of each page free
-- for those updates to stay on their page (HOT), and that room was a third of the table's heap:
-- 1,037 bytes a dataset on the storage bench, of which about 300 empty. It was not enough either: a
-- full sync, which sees every dataset of its portal in one statement, found room on its page for
-- fewer than half of the new versions (measured at 20,000: 9,050 of 20,000 updates HOT, the heap
-- 20.7 -> 31.4 MB at the first full sync and 35.5 MB at the second after a VACUUM), and every other
-- one went to another page with an entry in each of the table's five indexes.
--
-- Now no run sets datasets.last_seen_at (045 drops it). A run writes a dataset's row only when it
-- changed (the upsert sets updated_at, the run's start) and, for a dataset seen unchanged, its row
-- in dataset_seen: 44 bytes a dataset that a full sync updates in place (fillfactor 50: room on its page for every
-- row's next version; the table's only index, its key, never changes). When a run last saw a
-- dataset is greatest(datasets.updated_at, dataset_seen.last_seen_at): a dataset no run has seen
-- unchanged since its last change has no row there (a portal synced incrementally adds none: its
-- runs list what changed), and a row a later change made older than updated_at reads as updated_at.
-- The unchanged datasets' language and modified time (which a full sync also takes) are written to
-- datasets only where they differ. datasets goes to fillfactor 100: a row is written as it changes;
-- new pages are filled, pages already written keep their room until rewritten (`VACUUM FULL
-- datasets`, which locks the table, rewrites them at once).
--
-- Cost of the migration: one read of datasets and a row in dataset_seen for each dataset last seen
-- after its last change (every dataset of a portal that had full syncs). Runs under the migration
-- lock: runs wait. Runs on PostgreSQL 15 to 18. What SQL users see, and the column dropped, is in
-- 045, apart (as 031/032 and 033/034) so that tests of older migrations can apply this part, which
-- today's writer needs, before 034 and 045 after them: until 045 the column stays, NULL in the rows
-- today's writer inserts.
CREATE TABLE dataset_seen (
    dataset_id   bigint PRIMARY KEY REFERENCES datasets (id) ON DELETE CASCADE,
    last_seen_at timestamptz NOT NULL
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02);

INSERT INTO dataset_seen (dataset_id, last_seen_at)
SELECT id, last_seen_at FROM datasets WHERE last_seen_at > updated_at ORDER BY id;

ALTER TABLE datasets ALTER COLUMN last_seen_at DROP NOT NULL;
ALTER TABLE datasets SET (fillfactor = 100);

-- Statistics at once where there are rows (a new database's empty table is left to its first bulk
-- run, store/datasets.py).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM dataset_seen) THEN
        ANALYZE dataset_seen;
    END IF;
END
$$;
