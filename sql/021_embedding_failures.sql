-- Texts whose vectors the provider answered unusable (not finite, of the wrong size, empty, all
-- zeros, or a batch answered with another count of vectors than texts sent): issue 36. The rest of
-- the batch is stored; such a text stays pending, and is not sent again before retry_at, alone in
-- its request then; after a few refusals in a row retry_at is NULL: given up, never sent again
-- until its text changes (another content hash) or an operator resets it (`harvester embeddings
-- invalidate`, or deleting its row). A vector written for it deletes its row (store/vectors.py
-- write). See plugins/harvester/store/claims.py (refuse) and docs/embeddings.md.
CREATE TABLE embedding_failures (
    content_hash    text NOT NULL,
    model           text NOT NULL,
    failures        integer NOT NULL,      -- refusals in a row (one per run that sent it)
    reason          text NOT NULL,         -- not-finite, out-of-range, wrong-dimension, empty, zero, count-mismatch
    message         text NOT NULL,
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    retry_at        timestamptz,           -- NULL: given up
    run_id          bigint,                -- the run that sent it last
    PRIMARY KEY (content_hash, model)
);
