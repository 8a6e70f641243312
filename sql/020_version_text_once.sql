-- A version's title and description are kept once, in its snapshot. changes.snapshot holds the
-- cleaned title and description the columns held besides (the same strings: both come from the
-- dataset's row as the run merged it), so each version carried its description twice, once in the
-- snapshot and once in its own column: about 410 bytes a version (bench/storage_bench.py). They are
-- now virtual generated columns, computed from the snapshot when read (PostgreSQL 18): every reader
-- (store/history.py, the current_datasets view, SQL of one's own) sees the same values as before.
--
-- A version whose columns and snapshot disagree (none is known to) keeps what its columns said: its
-- snapshot takes them first, so that what the history shows is unchanged.
UPDATE dataset_versions
SET snapshot = snapshot || jsonb_build_object('title', title, 'description', description)
WHERE snapshot ->> 'title' IS DISTINCT FROM title OR snapshot ->> 'description' IS DISTINCT FROM description;

DROP VIEW current_datasets;
ALTER TABLE dataset_versions DROP COLUMN title, DROP COLUMN description;
ALTER TABLE dataset_versions
    ADD COLUMN title text GENERATED ALWAYS AS (coalesce(snapshot ->> 'title', '')) VIRTUAL,
    ADD COLUMN description text GENERATED ALWAYS AS (coalesce(snapshot ->> 'description', '')) VIRTUAL;

-- A dropped column's values stay in the rows until each is written again; a rewrite of the whole
-- table hands their room back now. (ALTER COLUMN ... TYPE with an expression rewrites every row; the
-- values are unchanged. A million versions: about a minute, during which runs wait for the table.)
ALTER TABLE dataset_versions ALTER COLUMN first_seen_at TYPE timestamptz USING first_seen_at + interval '0';

-- As in 003, reading the columns above.
CREATE VIEW current_datasets AS
SELECT d.id AS dataset_id, d.portal_url, d.source_id, d.name, d.url,
       v.version_number, v.title, v.description, v.content_hash, v.metadata_hash, v.snapshot,
       v.change_type, v.first_seen_at AS version_first_seen_at, v.last_seen_at AS version_last_seen_at,
       d.first_seen_at, d.last_seen_at
FROM datasets d
JOIN dataset_versions v ON v.dataset_id = d.id AND v.is_current
WHERE d.removed_at IS NULL;
