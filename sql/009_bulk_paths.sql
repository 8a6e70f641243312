-- The data path of large runs (a first sync, a full re-sync of a big portal): less work per record
-- for the same rows.

-- The insert trigger of dataset_search reads the statement's transition table directly. 007's
-- passed the inserted ids to harvester_search_refresh, which joined them back to datasets (a lookup
-- by id per inserted row, and every row read twice). The values are the same: the select list is
-- harvester_search_refresh's, over the inserted rows instead of datasets (keep the two alike; the
-- tests compare them).
CREATE OR REPLACE FUNCTION harvester_search_inserted() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    INSERT INTO dataset_search AS s (dataset_id, portal_url, content_hash, removed_at, metadata_modified, config,
                                     organizations, tags, formats, licenses, document)
    SELECT d.id, d.portal_url, d.content_hash, d.removed_at, d.metadata_modified, d.search_config,
           harvester_distinct_keys(ARRAY[harvester_search_key(d.organization),
                                         harvester_search_key(d.raw -> 'organization' ->> 'name')]),
           harvester_distinct_keys(ARRAY(
               SELECT harvester_search_key(t #>> '{}') FROM jsonb_array_elements(
                   CASE WHEN jsonb_typeof(d.tags) = 'array' THEN d.tags ELSE '[]' END) t
               WHERE jsonb_typeof(t) = 'string')),
           harvester_distinct_keys(ARRAY(
               SELECT harvester_format_key(f #>> '{}') FROM jsonb_path_query(d.raw, 'lax $.resources[*].format') f
               WHERE jsonb_typeof(f) = 'string')),
           harvester_distinct_keys(ARRAY[lower(btrim(d.raw ->> 'license_id')), lower(btrim(d.raw ->> 'license_title'))]),
           harvester_search_document(d.search_config, d.title, d.tags, d.description, d.organization)
    FROM inserted d
    ON CONFLICT (dataset_id) DO UPDATE SET
        portal_url = EXCLUDED.portal_url, content_hash = EXCLUDED.content_hash, removed_at = EXCLUDED.removed_at,
        metadata_modified = EXCLUDED.metadata_modified, config = EXCLUDED.config,
        organizations = EXCLUDED.organizations, tags = EXCLUDED.tags, formats = EXCLUDED.formats,
        licenses = EXCLUDED.licenses, document = EXCLUDED.document;
    RETURN NULL;
END
$$;

-- Staged records are written once and read once or twice before the run drops them: compressing
-- their large values (the portal's record, ~8 KB; a long description) cost PostgreSQL about half
-- of a COPY's time, for nothing. They are kept out of line, uncompressed (datasets still compresses
-- what the merge copies into it). Values are unchanged; the table takes more room while a run holds it.
ALTER TABLE staging_records ALTER COLUMN raw SET STORAGE EXTERNAL;
ALTER TABLE staging_records ALTER COLUMN description SET STORAGE EXTERNAL;

-- Room on every page for rows to be updated where they are (HOT: no new index entries, the old
-- version pruned in place). hash_compare sets every staged record's outcome once: at 50% its pages
-- (filled by COPY, emptied by TRUNCATE at commit, see store/staging.py) take each row's new version.
-- Every run sets last_seen_at on every dataset it sees and on its current version: at 70% most of
-- those updates stay on their page instead of moving the row and adding an entry to every index
-- (datasets has five). Pages already full get the room as rows move (no rewrite here).
ALTER TABLE staging_records SET (fillfactor = 50);
ALTER TABLE datasets SET (fillfactor = 70);
ALTER TABLE dataset_versions SET (fillfactor = 70);
