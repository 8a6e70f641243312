-- One schema for a version's title and description on every PostgreSQL (see 020). A database on
-- PostgreSQL 18 that applied 020's first text has them as generated VIRTUAL columns: they are
-- dropped (nothing is stored in a virtual column: no rows are rewritten) and the functions 020 now
-- creates take their place, so `v.title` reads the same value. Elsewhere there is nothing to drop
-- and the functions are there already.
DROP VIEW current_datasets;
ALTER TABLE dataset_versions DROP COLUMN IF EXISTS title, DROP COLUMN IF EXISTS description;

CREATE OR REPLACE FUNCTION title(v dataset_versions) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN coalesce(v.snapshot ->> 'title', '');
CREATE OR REPLACE FUNCTION description(v dataset_versions) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN coalesce(v.snapshot ->> 'description', '');

CREATE VIEW current_datasets AS
SELECT d.id AS dataset_id, d.portal_url, d.source_id, d.name, d.url,
       v.version_number, v.title, v.description, v.content_hash, v.metadata_hash, v.snapshot,
       v.change_type, v.first_seen_at AS version_first_seen_at, v.last_seen_at AS version_last_seen_at,
       d.first_seen_at, d.last_seen_at
FROM datasets d
JOIN dataset_versions v ON v.dataset_id = d.id AND v.is_current
WHERE d.removed_at IS NULL;
