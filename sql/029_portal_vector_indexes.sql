-- Per-portal HNSW indexes over search's copies of the vectors (issue 40: a portal filter that leaves
-- 5-50% of a million datasets is over exact_limit, so search scanned the shared HNSW index of
-- embeddings with the filter checked per vector; the iterative scan's recall under such a filter
-- was 0.84-0.94 and its p95 64-120 ms). A partial HNSW index on dataset_vectors per large portal
-- and model (WHERE portal_url = '<portal>' AND model = '<model>') holds only that portal's vectors:
-- a portal-filtered query scans it with nothing to reject. store/portal_indexes.py builds them
-- after a large portal's run commits (CREATE INDEX CONCURRENTLY) and records them here.
--
-- dataset_vectors gets each copy's portal, the column those predicates name. The backfill is one
-- UPDATE: it writes a new version of every row (the table's size again while it runs, the old
-- versions left to vacuum): at 1,000,000 datasets of 768 dimensions (about 3.3 GB) expect a few
-- minutes and that much free disk; the rows are not re-embedded (the vectors are copied as they are).
-- A dataset never changes portal (datasets.portal_url is part of its identity), so the copy's
-- portal is the dataset's for good; every writer of dataset_vectors (store/vectors.py _copy) sets it.
ALTER TABLE dataset_vectors ADD COLUMN portal_url text;

UPDATE dataset_vectors v SET portal_url = d.portal_url FROM datasets d WHERE d.id = v.dataset_id;

ALTER TABLE dataset_vectors ALTER COLUMN portal_url SET NOT NULL;

-- The per-portal indexes built, one per (portal, model) at most; search uses one only when it is
-- listed here, valid in pg_index, and the portal's copies were last checked complete for the model
-- (dataset_vectors_checked). index_name: dataset_vectors_p_<hash of portal and model>.
CREATE TABLE portal_indexes (
    portal_url    text NOT NULL,
    model         text NOT NULL,
    index_name    text NOT NULL UNIQUE,
    dimension     integer NOT NULL,
    datasets      bigint NOT NULL,              -- the portal's live datasets when it was built
    build_seconds double precision NOT NULL,
    bytes         bigint NOT NULL,              -- the index's size when it was built
    built_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (portal_url, model)
);
