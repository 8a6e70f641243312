-- The duplicate keys of a run's datasets are computed on every core, with one regular-expression
-- match a link instead of six (issue 40: the first sync's upsert, where keying 100,000 datasets ran
-- on one backend while the other core was idle).
--
-- harvester_link_key: the same key from the same value, now a PL/pgSQL function that matches an
-- http(s) URL once (scheme, host, the rest) instead of testing it, taking its host twice and its rest
-- once, each a regular expression of its own (the SQL function was inlined into every use, and
-- PostgreSQL evaluates each use). 607,748 values of 100,000 real-shaped records: 4.7 -> 2.7 s.
--
-- harvester_keys_of: the same rows. Its link values come from the datasets through lateral VALUES
-- and function calls (jsonb_object_field is `->`), which PostgreSQL plans at the query's own level:
-- parallel workers can run them (the subqueries before, planned apart with the outer row as a
-- parameter, kept the plan in one process), and each record is read (decompressed) once for its
-- landing page, once for its extras and once for its resources (twice each before). Its rows cost
-- regular expressions the planner cannot see, so the function lowers parallel_tuple_cost for its
-- own query: the distributions' branch, 400,000 resource URLs at 100,000 datasets, is then run by
-- the workers too. max_parallel_workers_per_gather still decides (0: one process, as before). And
-- it plans its query for the ids it is given each time (plan_cache_mode): PostgreSQL 18 caches a SQL
-- function's plan, and from a session's sixth call on took a generic one, planned for any ids, which
-- ran no workers (on 100,000 ids, 018's definition 10.2 s the first calls, 15.0 s from the sixth).
-- Measured on 100,000 stored records of the first sync's bench (bench/README.md): writing every key
-- of them (refresh_keys' statement) 10.2 -> 7.4 s at a session's first call, 15.0 -> 7.4-7.6 s from its
-- sixth; a scope of 1,000 of them 162-172 -> 118-127 ms. tests/store/test_keys_definition.py compares
-- both functions with sql/018's definitions over the CKAN samples and odd-shaped records.
--
-- Only the functions change: every stored key stays as it is, and the same.
CREATE OR REPLACE FUNCTION harvester_link_key(value text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS
$$
DECLARE
    v text := btrim(value);
    url text[] := regexp_match(v, '^https?://([^/?#\s]+)(\S*)', 'i');
BEGIN
    IF url IS NOT NULL THEN
        -- a site's home page (no path, no query) is where many datasets live, not one of them
        RETURN regexp_replace(lower(url[1]), '^www\.|:(80|443)$', '', 'g') || nullif(rtrim(url[2], '/'), '');
    END IF;
    RETURN CASE
        WHEN v ~* '^(urn|doi):\S+$' THEN lower(v)
        WHEN v ~ '^10\.[0-9]{4,9}/\S+$' THEN 'doi:' || lower(v)
        WHEN v ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN lower(v)
    END;
END
$$;

-- rank: the order in which one dataset's rows of the same key are preferred (sql/018's ORDER BY
-- evidence <> 'identifier', claimed): 0 its identifier, 1 an identifier it claims, 2 its landing
-- page, 3 a landing page it claims.
CREATE OR REPLACE FUNCTION harvester_keys_of(ids bigint[])
    RETURNS TABLE (dataset_id bigint, key uuid, evidence text, claimed boolean)
    LANGUAGE sql STABLE SET parallel_tuple_cost = 0.01 SET plan_cache_mode = force_custom_plan AS
$$
    (SELECT DISTINCT ON (l.id, kk.k) l.id, md5('link:' || kk.k)::uuid,
            CASE WHEN l.rank < 2 THEN 'identifier' ELSE 'landing_page' END, l.rank % 2 = 1
     FROM (SELECT d.id, v.value, v.rank
           FROM datasets d
           CROSS JOIN LATERAL jsonb_object_field(d.raw, 'url') AS r(url)
           CROSS JOIN LATERAL (VALUES
               (d.source_id, 0),
               (d.url, 2 + (harvester_link_host(d.url) <> harvester_link_host(d.portal_url))::int),
               (CASE WHEN d.source_id !~ '://' THEN rtrim(d.portal_url, '/') || '/dataset/' || d.source_id END, 2),
               (CASE WHEN jsonb_typeof(r.url) = 'string' THEN r.url #>> '{}' END, 3)) AS v(value, rank)
           WHERE d.id = ANY(ids)
           UNION ALL
           SELECT d.id, s #>> '{}', 1
           FROM datasets d
           CROSS JOIN LATERAL jsonb_object_field(d.raw, 'extras') AS x(extras)
           CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(x.extras) = 'array'
                                                        THEN x.extras ELSE '[]' END) e
           CROSS JOIN LATERAL jsonb_path_query(e -> 'value', 'strict $.**') s
           WHERE d.id = ANY(ids) AND e ->> 'key' = ANY(harvester_identity_extras()) AND jsonb_typeof(s) = 'string') l
     CROSS JOIN LATERAL harvester_link_key(l.value) AS kk(k)
     WHERE kk.k IS NOT NULL
     ORDER BY l.id, kk.k, l.rank)
    UNION ALL
    SELECT d.id, md5('distributions:' || string_agg(DISTINCT kk.k, ' ' ORDER BY kk.k))::uuid, 'distributions', false
    FROM datasets d
    CROSS JOIN LATERAL jsonb_object_field(d.raw, 'resources') AS x(resources)
    CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(x.resources) = 'array'
                                                 THEN x.resources ELSE '[]' END) r
    CROSS JOIN LATERAL harvester_link_key(r ->> 'url') AS kk(k)
    WHERE d.id = ANY(ids) AND jsonb_typeof(r -> 'url') = 'string' AND r ->> 'url' ~* '^https?://'
      AND kk.k IS NOT NULL
    GROUP BY d.id
    UNION ALL
    SELECT d.id, md5('content:' || d.content_hash || ' ' || harvester_search_key(d.organization))::uuid,
           'content', false
    FROM datasets d WHERE d.id = ANY(ids) AND nullif(harvester_search_key(d.organization), '') IS NOT NULL
$$;
