-- Hybrid search (plugins/harvester/search.py): full text next to the vectors.
--
-- datasets.search_config: the text-search configuration of the dataset's portal (its `language:`
-- in portals.yaml, 'simple' by default), set at merge.
--
-- dataset_search: one narrow row per dataset, what search reads. The full text (title A > tags B >
-- description C > organization D, accent-folded) and the filters' values, folded once here:
-- organizations (title and name), tags, resource formats and licences (id and title), lower-case
-- and accent-free. Kept apart from datasets (whose rows carry the portal's whole record) so that
-- ranking thousands of matches or checking a filter on every vector an HNSW scan visits reads a
-- small row, never the record. Triggers keep it in step with datasets whatever writes them: a
-- statement trigger for inserts (set-based, a first sync of 100k is one statement), a row trigger
-- for updates of the columns it derives from (a run's other updates, such as last_seen_at on
-- every listed dataset, do not fire it), and deletes cascade.
--
-- Accents are folded here (NFKD, combining marks dropped) and the same way on the query in Python
-- (harvester.search.fold), so no unaccent extension is needed.

-- NFKD, then combining marks dropped: "informações" -> "informacoes". The same ranges as
-- harvester.search.fold().
CREATE FUNCTION harvester_fold(t text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS
    $$ SELECT regexp_replace(normalize(t, NFKD), '[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]', '', 'g') $$;

-- A filter value as stored and as compared: folded, lower-case, spaces trimmed.
CREATE FUNCTION harvester_search_key(t text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS
    $$ SELECT nullif(btrim(lower(harvester_fold(t))), '') $$;

-- A resource format as stored and as compared: "CSV", ".csv" and " csv " are all "csv".
CREATE FUNCTION harvester_format_key(t text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS
    $$ SELECT nullif(ltrim(btrim(lower(t)), '.'), '') $$;

CREATE FUNCTION harvester_search_document(config regconfig, title text, tags jsonb, description text,
                                          organization text) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
    $$ SELECT setweight(to_tsvector(config, coalesce(harvester_fold(title), '')), 'A')
           || setweight(to_tsvector(config, coalesce(harvester_fold(tags::text), '')), 'B')
           -- a tsvector holds at most 1 MB: a huge description is indexed by its start
           || setweight(to_tsvector(config, coalesce(harvester_fold(left(description, 100000)), '')), 'C')
           || setweight(to_tsvector(config, coalesce(harvester_fold(organization), '')), 'D') $$;

CREATE FUNCTION harvester_distinct_keys(keys text[]) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
    $$ SELECT coalesce(array_agg(DISTINCT k ORDER BY k) FILTER (WHERE k IS NOT NULL), '{}') FROM unnest(keys) k $$;

ALTER TABLE datasets ADD COLUMN search_config regconfig NOT NULL DEFAULT 'simple';

CREATE TABLE dataset_search (
    dataset_id        bigint PRIMARY KEY REFERENCES datasets (id) ON DELETE CASCADE,
    portal_url        text NOT NULL,
    content_hash      text NOT NULL,            -- the dataset's vector: embeddings.content_hash
    removed_at        timestamptz,
    metadata_modified timestamptz,
    config            regconfig NOT NULL,       -- datasets.search_config
    organizations     text[] NOT NULL,          -- keys of the organization's title and name
    tags              text[] NOT NULL,
    formats           text[] NOT NULL,          -- of the resources
    licenses          text[] NOT NULL,          -- license_id and license_title
    document          tsvector NOT NULL
);

-- The row of dataset_search for each row of datasets (aliased d): the one definition the
-- triggers and the backfill below share.
CREATE FUNCTION harvester_search_refresh(ids bigint[]) RETURNS void
    LANGUAGE sql AS
$$
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
    FROM datasets d
    WHERE d.id = ANY(ids)
    ON CONFLICT (dataset_id) DO UPDATE SET
        portal_url = EXCLUDED.portal_url, content_hash = EXCLUDED.content_hash, removed_at = EXCLUDED.removed_at,
        metadata_modified = EXCLUDED.metadata_modified, config = EXCLUDED.config,
        organizations = EXCLUDED.organizations, tags = EXCLUDED.tags, formats = EXCLUDED.formats,
        licenses = EXCLUDED.licenses, document = EXCLUDED.document
$$;

CREATE FUNCTION harvester_search_inserted() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    PERFORM harvester_search_refresh(ARRAY(SELECT id FROM inserted));
    RETURN NULL;
END
$$;

CREATE FUNCTION harvester_search_updated() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    PERFORM harvester_search_refresh(ARRAY[NEW.id]);
    RETURN NULL;
END
$$;

CREATE TRIGGER datasets_search_insert AFTER INSERT ON datasets
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION harvester_search_inserted();

CREATE TRIGGER datasets_search_update
    AFTER UPDATE OF portal_url, content_hash, title, description, tags, organization, metadata_modified,
                    removed_at, raw, search_config ON datasets
    FOR EACH ROW
    WHEN ((OLD.portal_url, OLD.content_hash, OLD.title, OLD.description, OLD.tags, OLD.organization,
           OLD.metadata_modified, OLD.removed_at, OLD.raw, OLD.search_config)
          IS DISTINCT FROM
          (NEW.portal_url, NEW.content_hash, NEW.title, NEW.description, NEW.tags, NEW.organization,
           NEW.metadata_modified, NEW.removed_at, NEW.raw, NEW.search_config))
    EXECUTE FUNCTION harvester_search_updated();

-- The datasets already held (their portals' languages apply from their next run).
SELECT harvester_search_refresh(ARRAY(SELECT id FROM datasets));

CREATE INDEX dataset_search_document ON dataset_search USING gin (document);
CREATE INDEX dataset_search_content_hash ON dataset_search (content_hash);
CREATE INDEX dataset_search_portal ON dataset_search (portal_url);
CREATE INDEX dataset_search_organizations ON dataset_search USING gin (organizations);
CREATE INDEX dataset_search_tags ON dataset_search USING gin (tags);
CREATE INDEX dataset_search_formats ON dataset_search USING gin (formats);
CREATE INDEX dataset_search_licenses ON dataset_search USING gin (licenses);
CREATE INDEX dataset_search_modified ON dataset_search (metadata_modified);
-- the configurations in use, read by a skip scan (a handful of probes, not a table scan)
CREATE INDEX dataset_search_config ON dataset_search ((config::oid));
