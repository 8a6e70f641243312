-- A search row holds its text's content hash as its 32 bytes, not as 64 hexadecimal characters
-- (issue 40: bytes a dataset; search's vector side).
--
-- dataset_search.content_hash is what search's vector side compares with the vectors' hashes, which
-- are bytes since sql/041 (dataset_vectors) and sql/042 (embeddings): each candidate of an HNSW scan
-- over the model's index is checked against the filters by a probe of dataset_search_content_hash
-- with encode(<the vector's hash>, 'hex'), and every copy a filtered exact scan or a portal's own
-- index reads is matched with decode(<the row's hash>, 'hex'). Now both sides are bytes, compared as
-- they are (a bytea comparison is a memcmp, whatever the database's collation: a text one under a
-- collation like en_US.UTF-8 goes through strcoll). Bytes a dataset of the storage bench after its
-- 10 runs (bench/README.md): the row 32 fewer, the hash's B-tree (random keys, split as they come)
-- about half, and dataset_search_portal_rows, which includes the hash, 32 fewer an entry.
--
-- The table is written anew by the ALTER (every index of it built again: the full-text GIN ones are
-- the longest), in the migration's transaction: bench/README.md has its time at 1,000,000 datasets.
-- Runs wait at the migration lock, and searches wait for the table until the migration commits.
-- The table written anew has no page marked all-visible (nor rows autovacuum would count), so
-- search's portal filters, index-only scans of dataset_search_portal_rows, would read the heap for
-- every row until a VACUUM: migrate runs one once this has committed (1.9 s at 1,000,000 datasets).
--! vacuum after: dataset_search
-- Content hashes are SHA-256 in hexadecimal (domain/dataset.py; runs write nothing else): a dataset
-- whose content_hash is not hexadecimal stops the migration with an error that names it, before
-- anything is changed (only a hand-made row can be one; sql/041 and sql/042 left such rows' vectors
-- behind, and a dataset's search row cannot be left behind).
DO $$
DECLARE
    bad text;
BEGIN
    SELECT string_agg(format('%s (%L)', id, left(content_hash, 80)), ', ') INTO bad
    FROM (SELECT id, content_hash FROM datasets WHERE content_hash !~ '^([0-9a-fA-F]{2})+$' ORDER BY id LIMIT 5) x;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'datasets whose content_hash is not hexadecimal: % (at most 5 shown)', bad
            USING HINT = 'Harvester writes nothing else there: set each to encode(sha256(convert_to(<its text>, ''UTF8'')), ''hex''), or delete the dataset, then migrate again (sql/043).';
    END IF;
END
$$;

ALTER TABLE dataset_search ALTER COLUMN content_hash TYPE bytea USING decode(content_hash, 'hex');

-- sql/036's row with the hash as bytes.
CREATE OR REPLACE FUNCTION harvester_search_row(d datasets) RETURNS SETOF dataset_search
    LANGUAGE sql STABLE AS
$$
    SELECT d.id, d.portal_url, decode(d.content_hash, 'hex'), d.removed_at, d.metadata_modified, d.search_config,
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

-- sql/042's trigger of deleted vectors, the search rows' hashes compared as bytes.
CREATE OR REPLACE FUNCTION harvester_vectors_deleted() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    DELETE FROM dataset_vectors v
    USING gone g, embedding_models m, dataset_search s, vector_scopes c
    WHERE m.id = g.model AND s.content_hash = g.content_hash AND v.dataset_id = s.dataset_id
      AND c.id = v.scope AND c.model = m.name;
    DELETE FROM dataset_vectors_checked c
    USING gone g, embedding_models m, datasets d
    WHERE m.id = g.model AND d.content_hash = encode(g.content_hash, 'hex') AND c.portal_url = d.portal_url
      AND c.model = m.name;
    RETURN NULL;
END
$$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM dataset_search) THEN
        ANALYZE dataset_search;
    END IF;
END
$$;
