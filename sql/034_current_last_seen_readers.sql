-- The current version's last_seen_at read from its dataset's row where it holds none (sql/033).
--
-- `current_datasets.version_last_seen_at` is `coalesce(v.last_seen_at, d.last_seen_at)`: the same
-- values as before 033 (a current version held its dataset's last_seen_at, or a later one, which
-- it keeps). SQL of one's own that reads `dataset_versions.last_seen_at` directly finds NULL for a
-- current version and should read the view, or take the coalesce with its dataset's
-- (docs/history.md). Cost: catalogue changes only. Runs on PostgreSQL 15 to 18.
CREATE OR REPLACE VIEW current_datasets AS
SELECT d.id AS dataset_id, d.portal_url, d.source_id, d.name, d.url,
       v.version_number, d.title, d.description, v.content_hash, v.metadata_hash,
       v.change_type, v.first_seen_at AS version_first_seen_at,
       coalesce(v.last_seen_at, d.last_seen_at) AS version_last_seen_at,
       d.first_seen_at, d.last_seen_at
FROM datasets d
JOIN dataset_versions v ON v.dataset_id = d.id AND v.is_current
WHERE d.removed_at IS NULL;
