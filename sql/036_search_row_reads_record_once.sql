-- A dataset's search row reads its raw record once, not once for each field it takes from it
-- (issue 40: the first sync's upsert).
--
-- The record is held compressed (TOAST, pglz), and every operator PostgreSQL applies to it
-- (`raw -> 'organization'`, `raw ->> 'license_id'`, the formats' path, the translations) fetched
-- and decompressed the whole of it again: five times a row. `raw || '{}'` decompresses it once and,
-- for an object, returns it as it is (PostgreSQL's jsonb_concat returns the non-empty side when the
-- other is an empty object), and the subquery (OFFSET 0: kept apart, evaluated once a row) hands
-- that value to every field. For a record that is not an object (never written by Harvester's
-- sources, but a stored value could be) the result is an array holding it and `{}`: each field
-- reads NULL or nothing from it, exactly as from the record itself (tests/store/test_search_row.py
-- compares every field with 025's definition). Measured on 100,000 stored synthetic records of
-- about 8 KB (bench/README.md): 26.4 -> 19.2 s to compute every row on one core, the same rows.
--
-- Only the function changes: every stored row stays as it is, and the same.
CREATE OR REPLACE FUNCTION harvester_search_row(d datasets) RETURNS SETOF dataset_search
    LANGUAGE sql STABLE AS
$$
    SELECT d.id, d.portal_url, d.content_hash, d.removed_at, d.metadata_modified, d.search_config,
           harvester_distinct_keys(ARRAY[harvester_search_key(d.organization),
                                         harvester_search_key(x.raw -> 'organization' ->> 'name')]),
           harvester_distinct_keys(ARRAY(
               SELECT harvester_search_key(t #>> '{}') FROM jsonb_array_elements(
                   CASE WHEN jsonb_typeof(d.tags) = 'array' THEN d.tags ELSE '[]' END) t
               WHERE jsonb_typeof(t) = 'string')),
           harvester_distinct_keys(ARRAY(
               SELECT harvester_format_key(f #>> '{}') FROM jsonb_path_query(x.raw, 'lax $.resources[*].format') f
               WHERE jsonb_typeof(f) = 'string')),
           harvester_distinct_keys(ARRAY[lower(btrim(x.raw ->> 'license_id')), lower(btrim(x.raw ->> 'license_title'))]),
           harvester_search_document(d.search_config, d.title, d.tags, d.description, d.organization)
           || setweight(to_tsvector(d.search_config, coalesce(harvester_fold(
                  harvester_translated(x.raw -> 'translations', 'title', d.title, 10000)), '')), 'A')
    FROM (SELECT d.raw || '{}'::jsonb AS raw OFFSET 0) x
$$;
