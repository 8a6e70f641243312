-- dataset_vectors: each dataset's vector of the model its last run embedded with, stored by
-- dataset id, read by search's exact path (filters that leave a few thousand datasets rank them
-- all). That path used to look each filtered dataset's vector up in embeddings by content hash: a
-- probe of a text key and a row on a random page, about 5 microseconds a dataset (25-35 ms for
-- 5,000). Here the rows sit in dataset id order, and fetching the filtered ids as one sorted list
-- reads them in that order: 8 ms for the same 5,000 (bench/search_bench.py, 100k datasets).
--
-- A copy, never the source: embeddings stays the cache runs read and write. A run's upsert writes
-- it in the run's transaction (vectors.copy_for_search): the copies of the datasets the run linked to
-- a vector (new and changed texts, vectors that came late); and on a run that lists the whole portal
-- (a full sync, a reconciliation), or the first run of a model for the portal, every copy of the
-- portal that is missing, of another model or of an older text. Search uses a copy only when its
-- model and content_hash are the dataset's current ones, and looks any other dataset's vector up in
-- embeddings as before, so a copy that is missing or behind makes a query slower, never wrong.
CREATE TABLE dataset_vectors (
    dataset_id   bigint PRIMARY KEY REFERENCES datasets (id) ON DELETE CASCADE,
    model        text NOT NULL,
    content_hash text NOT NULL,   -- the text the vector is of: embeddings.content_hash
    embedding    vector NOT NULL  -- full precision, as in embeddings
);

-- Rows up to 8 KB stay on their page (PostgreSQL moves values out of line above 2 KB by default):
-- a vector of 768 dimensions (3 KB) is read with its row, not through a second lookup. Vectors over
-- about 2,000 dimensions still go out of line.
ALTER TABLE dataset_vectors SET (toast_tuple_target = 8160);

-- The portals whose copies a pass over all their datasets last brought up to date, and for which model.
CREATE TABLE dataset_vectors_checked (
    portal_url text PRIMARY KEY,
    model      text NOT NULL,
    checked_at timestamptz NOT NULL DEFAULT now()
);

-- A vector deleted from embeddings (`harvester embeddings invalidate`) takes its copies with it.
CREATE FUNCTION harvester_vectors_deleted() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    DELETE FROM dataset_vectors v
    USING gone g, dataset_search s
    WHERE s.content_hash = g.content_hash AND v.dataset_id = s.dataset_id AND v.model = g.model;
    RETURN NULL;
END
$$;

CREATE TRIGGER embeddings_deleted AFTER DELETE ON embeddings
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION harvester_vectors_deleted();
