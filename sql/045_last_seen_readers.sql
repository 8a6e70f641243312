-- The readers of sql/044's dataset_seen: `current_datasets` reads a dataset's last sighting as
-- greatest(datasets.updated_at, dataset_seen.last_seen_at) (the same columns, the same values as
-- before), and datasets.last_seen_at, which no writer sets any more, is dropped.
--
-- SQL users: `current_datasets.last_seen_at` reads as before; SQL of one's own that read
-- `datasets.last_seen_at` takes greatest(d.updated_at, s.last_seen_at) from a LEFT JOIN of
-- dataset_seen s ON s.dataset_id = d.id (docs/history.md).
--
-- Cost: changes of the catalogue only (a dropped column's bytes stay in rows until they are
-- written again). Runs on PostgreSQL 15 to 18.

-- sql/034's view, the dataset's last sighting read as above (the same columns, the same values).
CREATE OR REPLACE VIEW current_datasets AS
SELECT d.id AS dataset_id, d.portal_url, d.source_id, d.name, d.url,
       v.version_number, d.title, d.description, v.content_hash, v.metadata_hash,
       v.change_type, v.first_seen_at AS version_first_seen_at,
       coalesce(v.last_seen_at, greatest(d.updated_at, s.last_seen_at)) AS version_last_seen_at,
       d.first_seen_at, greatest(d.updated_at, s.last_seen_at) AS last_seen_at
FROM datasets d
JOIN dataset_versions v ON v.dataset_id = d.id AND v.is_current
LEFT JOIN dataset_seen s ON s.dataset_id = d.id
WHERE d.removed_at IS NULL;

ALTER TABLE datasets DROP COLUMN last_seen_at;
