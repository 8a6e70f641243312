-- Hybrid search (plugins/harvester/search.py): full text next to the vectors.
--
-- search_config: the text-search configuration of the dataset's portal (its `language:` in
-- portals.yaml, 'simple' by default), set at merge. search_vector: a generated tsvector over the
-- accent-folded title (weight A), tags (B), description (C) and organization (D), GIN-indexed.
-- Accents are folded here (NFKD, combining marks dropped) and the same way on the query in
-- Python, so no unaccent extension is needed.

-- NFKD, then combining marks dropped: "informações" -> "informacoes". The same ranges as
-- harvester.search.fold().
CREATE FUNCTION harvester_fold(t text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS
    $$ SELECT regexp_replace(normalize(t, NFKD), '[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]', '', 'g') $$;

-- Backfill: every existing dataset gets 'simple' (the next run of its portal sets its language).
ALTER TABLE datasets
    ADD COLUMN search_config regconfig NOT NULL DEFAULT 'simple',
    ADD COLUMN search_vector tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector(search_config, coalesce(harvester_fold(title), '')), 'A')
        || setweight(to_tsvector(search_config, coalesce(harvester_fold(tags::text), '')), 'B')
        -- a tsvector holds at most 1 MB: a huge description is indexed by its start
        || setweight(to_tsvector(search_config, coalesce(harvester_fold(left(description, 100000)), '')), 'C')
        || setweight(to_tsvector(search_config, coalesce(harvester_fold(organization), '')), 'D')
    ) STORED;

CREATE INDEX datasets_search_vector ON datasets USING gin (search_vector);
-- the configurations in use, read by a skip scan (a handful of probes, not a table scan)
CREATE INDEX datasets_search_config ON datasets ((search_config::oid));
-- modified since / until
CREATE INDEX datasets_metadata_modified ON datasets (metadata_modified);
