-- A version's title and description are kept once, in its snapshot. changes.snapshot holds the
-- cleaned title and description the columns held besides (the same strings: both come from the
-- dataset's row as the run merged it), so each version carried its description twice, once in the
-- snapshot and once in its own column: about 410 bytes a version (bench/storage_bench.py). The
-- columns are dropped; `v.title` and `v.description` still read as before (store/history.py, the
-- current_datasets view, SQL of one's own that names the table, as in `SELECT v.title FROM
-- dataset_versions v`): two functions of the row compute them from the snapshot, which PostgreSQL
-- calls for `v.title` when the table has no such column, on every supported version (15 to 18).
--
-- (This migration first made them generated VIRTUAL columns, which only PostgreSQL 18 has: on 15 to
-- 17 it failed and was rolled back, so those databases stopped at 019 and apply this text. A
-- database on 18 that applied the first text has the virtual columns; 023 drops them, and both
-- reach the same schema.)
--
-- A version whose columns and snapshot disagree (none is known to) keeps what its columns said: its
-- snapshot takes them first, so that what the history shows is unchanged.
UPDATE dataset_versions
SET snapshot = snapshot || jsonb_build_object('title', title, 'description', description)
WHERE snapshot ->> 'title' IS DISTINCT FROM title OR snapshot ->> 'description' IS DISTINCT FROM description;

DROP VIEW current_datasets;
ALTER TABLE dataset_versions DROP COLUMN title, DROP COLUMN description;

-- A dropped column's values stay in the rows until each is written again; a rewrite of the whole
-- table hands their room back now. (ALTER COLUMN ... TYPE with an expression rewrites every row; the
-- values are unchanged. A million versions: about a minute, during which runs wait for the table.)
ALTER TABLE dataset_versions ALTER COLUMN first_seen_at TYPE timestamptz USING first_seen_at + interval '0';

-- `v.title` for a row v of dataset_versions (what the dropped column held: '' when the snapshot has
-- none). SQL functions this simple are inlined into the query that calls them. Created after the rewrite
-- above: while a function takes the table's row type, ALTER COLUMN ... TYPE on the table is refused
-- (a later migration that needs one drops and creates them again around it).
CREATE FUNCTION title(v dataset_versions) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN coalesce(v.snapshot ->> 'title', '');
CREATE FUNCTION description(v dataset_versions) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN coalesce(v.snapshot ->> 'description', '');

-- As in 003, reading the functions above.
CREATE VIEW current_datasets AS
SELECT d.id AS dataset_id, d.portal_url, d.source_id, d.name, d.url,
       v.version_number, v.title, v.description, v.content_hash, v.metadata_hash, v.snapshot,
       v.change_type, v.first_seen_at AS version_first_seen_at, v.last_seen_at AS version_last_seen_at,
       d.first_seen_at, d.last_seen_at
FROM datasets d
JOIN dataset_versions v ON v.dataset_id = d.id AND v.is_current
WHERE d.removed_at IS NULL;
