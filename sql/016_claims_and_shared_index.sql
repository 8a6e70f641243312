-- Many portals, one database: paid work claimed across runs, and a shared vector index that no
-- run drops. See plugins/harvester/store/claims.py and store/vectors.py.

-- A text being embedded by one run is claimed first: another run that meets the same text (another
-- portal republishing it, at the same moment) waits for the vector instead of paying for it again.
-- A claim ends when the vector is written (in the same transaction), when its run releases it
-- (the batch kept failing), when it expires, or when its run is no longer running. UNLOGGED: a
-- claim only matters while its run lives; after a server crash every run starts over anyway.
CREATE UNLOGGED TABLE embedding_claims (
    content_hash text NOT NULL,
    model        text NOT NULL,
    run_id       bigint NOT NULL,
    claimed_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (content_hash, model)
);
CREATE INDEX embedding_claims_run ON embedding_claims (run_id);

-- Which run wrote a vector: a run's stats count as reused every text whose vector it did not pay
-- for (another portal's run, even one that wrote it while this run was waiting for its claim).
-- NULL for vectors written before this migration. Adding a nullable column rewrites nothing.
ALTER TABLE embeddings ADD COLUMN run_id bigint;

-- The model a running run bulk-loads: its vectors are written while the model has no index yet,
-- and the index is built once, by the last bulk load's upsert, never while one is still loading.
ALTER TABLE sync_runs ADD COLUMN bulk_model text;
