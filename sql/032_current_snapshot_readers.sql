-- Readers of a version's title and description for a current version that holds no snapshot (031:
-- the dataset's row is its snapshot).
--
-- `v.title` and `v.description` (sql/020, 023) read the dataset's row for a current version that
-- holds no snapshot; a version that holds one reads it, as before (a stored current snapshot, kept by
-- 031, gives what it gave). The functions are STABLE now (they read a table): a version without a
-- snapshot costs a lookup of its dataset by primary key.
--
-- `current_datasets` reads title and description from the dataset's row (a stored current
-- snapshot's are the same strings: both came from the row the run merged) and has no `snapshot`
-- column any more: the snapshot is built in Python (changes.snapshot over the raw record), and a
-- column of NULLs would have read as "no tracked metadata". The cost: SQL of one's own that read
-- `current_datasets.snapshot` fails with "column snapshot does not exist"; the tracked fields are
-- in `datasets` (title, description, tags, organization, raw), the snapshot in `harvester versions
-- --json` / `harvester diff` and the UI's diff API (docs/history.md).
--
-- Cost of the migration: catalogue changes only. Runs on PostgreSQL 15 to 18.
DROP VIEW current_datasets;

-- `v.title` / `v.description` (sql/020, 023): the snapshot's, or the dataset's for a current version
-- that holds none.
CREATE OR REPLACE FUNCTION title(v dataset_versions) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN CASE WHEN v.snapshot IS NULL
                THEN coalesce((SELECT d.title FROM datasets d WHERE d.id = v.dataset_id), '')
                ELSE coalesce(v.snapshot ->> 'title', '') END;
CREATE OR REPLACE FUNCTION description(v dataset_versions) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN CASE WHEN v.snapshot IS NULL
                THEN coalesce((SELECT d.description FROM datasets d WHERE d.id = v.dataset_id), '')
                ELSE coalesce(v.snapshot ->> 'description', '') END;

-- As in 023, title and description from the dataset's row (a stored current snapshot's are the
-- same strings: both came from the row the run merged), without `snapshot`.
CREATE VIEW current_datasets AS
SELECT d.id AS dataset_id, d.portal_url, d.source_id, d.name, d.url,
       v.version_number, d.title, d.description, v.content_hash, v.metadata_hash,
       v.change_type, v.first_seen_at AS version_first_seen_at, v.last_seen_at AS version_last_seen_at,
       d.first_seen_at, d.last_seen_at
FROM datasets d
JOIN dataset_versions v ON v.dataset_id = d.id AND v.is_current
WHERE d.removed_at IS NULL;
