-- Languages (issue 39): a record's own language chooses its text-search configuration, and the
-- titles it carries in other languages are in its search text.
--
-- Cheap on a big table: nullable columns without a default (a catalogue change, no rewrite) and a
-- function replaced. Nothing here reads datasets: the rows already held are indexed again portal
-- by portal, by each portal's next run (below).

-- The configuration of the language the record declares (config/languages.py resolves it), as
-- staged and as stored; NULL: none PostgreSQL stems, or none declared: the portal's `language:`.
-- datasets.search_config stays what the dataset is indexed with: coalesce(language, the portal's).
ALTER TABLE staging_records ADD COLUMN language text;
ALTER TABLE datasets ADD COLUMN language regconfig;

-- The texts of one field of a record's translations (raw->'translations': {"title": {"fr": "...",
-- "en": "..."}, "description": {...}}, what the sources keep of every language: sources/dcat_rdf.py,
-- csw.py, sdmx.py...) other than the one stored as the dataset's own, in language order, cut at
-- `cap` characters (a tsvector holds at most 1 MB). NULL when there are none.
CREATE FUNCTION harvester_translated(translations jsonb, field text, own text, cap integer) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$
    SELECT left(string_agg(t.value #>> '{}', ' ' ORDER BY t.key), cap)
    FROM jsonb_each(CASE WHEN jsonb_typeof(translations -> field) = 'object' THEN translations -> field
                         ELSE '{}' END) t
    WHERE jsonb_typeof(t.value) = 'string' AND btrim(t.value #>> '{}') IS DISTINCT FROM btrim(own)
$$;

-- 011's row, its document followed by the other languages' titles (weight A, as the title: a
-- title in French is as much the title as the English one), stemmed with the dataset's
-- configuration: a query is parsed with every configuration in use, this one among them, so a word
-- of any language matches the same word in the document. Descriptions in other languages are kept
-- in the record but not indexed: measured on 20,000 records with five languages of ~600-character
-- descriptions, indexing them took 2.4 times as long as the record without (its titles: 1.2 times).
CREATE OR REPLACE FUNCTION harvester_search_row(d datasets) RETURNS SETOF dataset_search
    LANGUAGE sql STABLE AS
$$
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
           || setweight(to_tsvector(d.search_config, coalesce(harvester_fold(
                  harvester_translated(d.raw -> 'translations', 'title', d.title, 10000)), '')), 'A')
$$;

-- Which search text a portal's datasets are indexed with: NULL for the portals held before this
-- migration (their next run's merge indexes again those of their datasets with translations, once,
-- and notes 25: store/datasets.py SEARCH_TEXT), 25 for those that come after (indexed so from the start).
ALTER TABLE portal_sync_status ADD COLUMN search_text integer;
ALTER TABLE portal_sync_status ALTER COLUMN search_text SET DEFAULT 25;
