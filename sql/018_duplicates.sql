-- The same dataset on several portals (store/duplicates.py): the evidence each dataset carries,
-- the duplicate groups worked out from it, and the operators' overrides.

-- The host of an http(s) URL as harvester_link_key writes it ('' for anything else).
CREATE FUNCTION harvester_link_host(value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$
    SELECT coalesce(regexp_replace(lower(substring(btrim(value) FROM '(?i)^https?://([^/?#\s]+)')),
                                   '^www\.|:(80|443)$', '', 'g'), '')
$$;

-- A link-like value as a key: an http(s) URL without its scheme, "www.", a default port or a
-- trailing slash, the host lower-cased (NULL for a bare host); a URN, a DOI or a UUID lower-cased.
-- NULL for anything else: a bare identifier such as "population-2020" names different datasets on
-- different portals, so it is no evidence. (Both functions are single expressions, which
-- PostgreSQL inlines into the query calling them: a function with a FROM clause is called row by
-- row, and keying 40,000 datasets took 5.1 s instead of 3.2 s.)
CREATE FUNCTION harvester_link_key(value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$
    SELECT CASE
        -- a site's home page (no path, no query) is where many datasets live, not one of them
        WHEN btrim(value) ~* '^https?://[^/?#\s]+' THEN
            nullif(harvester_link_host(value)
                   || rtrim(coalesce(substring(btrim(value) FROM '(?i)^https?://[^/?#\s]+([^\s]*)'), ''), '/'),
                   harvester_link_host(value))
        WHEN btrim(value) ~* '^(urn|doi):\S+$' THEN lower(btrim(value))
        WHEN btrim(value) ~ '^10\.[0-9]{4,9}/\S+$' THEN 'doi:' || lower(btrim(value))
        WHEN btrim(value) ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN lower(btrim(value))
    END
$$;

-- Extras that hold the identity of the dataset a record copies: DCAT's dct:identifier and
-- adms:identifier, CKAN harvesters' guid / identifier / uri / harvest_object_id / harvest_url.
CREATE FUNCTION harvester_identity_extras() RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT ARRAY['dct:identifier', 'adms:identifier', 'identifier', 'guid', 'uri', 'harvest_object_id',
                'harvest_url', 'original_identifier', 'source_identifier'] $$;

-- The evidence of the datasets ``ids``, as (dataset_id, key, evidence, claimed):
--   identifier     its own identifier (source_id) when link-like, and the identifiers its record
--                  states (extras above): claimed, i.e. pointing at the dataset it copies
--   landing_page   its page (datasets.url; claimed when on another host than its portal's), the
--                  portal's page of it by id, and a CKAN record's own url field (claimed)
--   distributions  the set of its distributions' URLs (at least one http(s) URL)
--   content        its title and description (content_hash) with its publisher (none: no key)
-- Keys are md5 digests (uuid: 16 bytes), each prefixed by its space before hashing: identifiers and
-- landing pages share one space, since an aggregator's dct:identifier is often the source's page.
-- Set-based over all the datasets at once (one sort for all, not one per dataset: twice as fast as
-- a function of one row called per row); OFFSET 0 keeps each key from being computed twice (once
-- for the filter on it, once for the output).
CREATE FUNCTION harvester_keys_of(ids bigint[])
    RETURNS TABLE (dataset_id bigint, key uuid, evidence text, claimed boolean)
    LANGUAGE sql STABLE AS
$$
    WITH d AS NOT MATERIALIZED (
        SELECT id, portal_url, source_id, url, raw, content_hash, organization FROM datasets WHERE id = ANY(ids)
    ), link(id, value, evidence, claimed) AS (
        SELECT d.id, d.source_id, 'identifier', false FROM d
        UNION ALL
        SELECT d.id, d.url, 'landing_page', harvester_link_host(d.url) <> harvester_link_host(d.portal_url) FROM d
        UNION ALL
        SELECT d.id, rtrim(d.portal_url, '/') || '/dataset/' || d.source_id, 'landing_page', false FROM d
        WHERE d.source_id !~ '://'
        UNION ALL
        SELECT d.id, d.raw ->> 'url', 'landing_page', true FROM d WHERE jsonb_typeof(d.raw -> 'url') = 'string'
        UNION ALL
        SELECT d.id, s #>> '{}', 'identifier', true
        FROM d
        CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(d.raw -> 'extras') = 'array'
                                                     THEN d.raw -> 'extras' ELSE '[]' END) e
        CROSS JOIN LATERAL jsonb_path_query(e -> 'value', 'strict $.**') s
        WHERE e ->> 'key' = ANY(harvester_identity_extras()) AND jsonb_typeof(s) = 'string'
    ), keyed AS (
        SELECT id, harvester_link_key(value) AS k, evidence, claimed FROM link OFFSET 0
    )
    (SELECT DISTINCT ON (id, k) id, md5('link:' || k)::uuid, evidence, claimed FROM keyed
     WHERE k IS NOT NULL
     -- one row per key: an identifier before a landing page, the dataset's own before a claim
     ORDER BY id, k, evidence <> 'identifier', claimed)
    UNION ALL
    SELECT id, md5('distributions:' || string_agg(DISTINCT k, ' ' ORDER BY k))::uuid, 'distributions', false
    FROM (SELECT d.id, harvester_link_key(r ->> 'url') AS k
          FROM d
          CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(d.raw -> 'resources') = 'array'
                                                       THEN d.raw -> 'resources' ELSE '[]' END) r
          WHERE jsonb_typeof(r -> 'url') = 'string' AND r ->> 'url' ~* '^https?://' OFFSET 0) u
    WHERE k IS NOT NULL
    GROUP BY id
    UNION ALL
    SELECT d.id, md5('content:' || d.content_hash || ' ' || harvester_search_key(d.organization))::uuid,
           'content', false
    FROM d WHERE nullif(harvester_search_key(d.organization), '') IS NOT NULL
$$;

-- The evidence of every dataset (store/duplicates.refresh_keys rewrites a dataset's rows whenever
-- a run changes, removes or restores it). live: the dataset is not removed; a removed dataset keeps
-- its keys, and so its group.
CREATE TABLE dataset_keys (
    dataset_id bigint NOT NULL REFERENCES datasets (id) ON DELETE CASCADE,
    key        uuid NOT NULL,
    portal_url text NOT NULL,
    evidence   text NOT NULL CHECK (evidence IN ('identifier', 'landing_page', 'distributions', 'content')),
    claimed    boolean NOT NULL,
    live       boolean NOT NULL
);
-- A dataset's keys, to rewrite them (harvester_keys_of gives a dataset each key once: no unique
-- index to keep, which made writing a 100,000-dataset portal's keys a quarter slower).
CREATE INDEX dataset_keys_dataset ON dataset_keys (dataset_id);
-- The lookup every match makes: who else holds this key.
CREATE INDEX dataset_keys_key ON dataset_keys (key);

-- Duplicate groups: a row per dataset that is in one (a dataset in none is alone). One member of
-- each group is its canonical one. evidence/confidence: the strongest link of this member to
-- another of its group (matched_id), or 'override' when an operator merged it.
CREATE SEQUENCE duplicate_group_ids;
CREATE TABLE duplicate_members (
    dataset_id   bigint PRIMARY KEY REFERENCES datasets (id) ON DELETE CASCADE,
    group_id     bigint NOT NULL,
    portal_url   text NOT NULL,
    is_canonical boolean NOT NULL DEFAULT false,
    evidence     text NOT NULL CHECK (evidence IN ('identifier', 'landing_page', 'distributions', 'content',
                                                   'override')),
    confidence   real NOT NULL CHECK (confidence > 0 AND confidence <= 1),
    matched_id   bigint,
    -- the member's record points at matched_id's (it is the copy; the other is first-hand)
    copy_of      boolean NOT NULL DEFAULT false,
    grouped_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX duplicate_members_group ON duplicate_members (group_id);
CREATE INDEX duplicate_members_portal ON duplicate_members (portal_url) WHERE NOT is_canonical;
CREATE UNIQUE INDEX duplicate_members_one_canonical ON duplicate_members (group_id) WHERE is_canonical;

-- Operators' decisions, kept across runs: 'same' puts two datasets in one group whatever the
-- evidence says, 'different' keeps them apart (a split writes one per other member). a < b.
CREATE TABLE duplicate_overrides (
    a          bigint NOT NULL REFERENCES datasets (id) ON DELETE CASCADE,
    b          bigint NOT NULL REFERENCES datasets (id) ON DELETE CASCADE,
    decision   text NOT NULL CHECK (decision IN ('same', 'different')),
    decided_by text NOT NULL,
    decided_at timestamptz NOT NULL DEFAULT now(),
    note       text,
    PRIMARY KEY (a, b),
    CHECK (a < b)
);
CREATE INDEX duplicate_overrides_b ON duplicate_overrides (b);

-- Portals whose datasets have all been keyed once. A portal missing here (its first run, or every
-- portal of a database migrated from before duplicates existed) has all its datasets examined by
-- its next committed run; afterwards a run examines only the datasets it changed.
CREATE TABLE duplicate_scans (
    portal_url text PRIMARY KEY,
    scanned_at timestamptz NOT NULL DEFAULT now()
);
