-- The vectors (embeddings, the cache every run reads and writes) packed five to a page instead of
-- four (issue 40: bytes a dataset), as sql/041 packed search's copies of them. A row held the text's
-- content hash as 64 hexadecimal characters, the model's name, its dimension, the halfvec, when it
-- was written and by which run: 1,680 bytes at 768 dimensions with a 24-character model name, so
-- four rows filled a page of 8 KB (five need rows of at most 1,624 bytes) and a fifth of every page
-- was empty: 2,255 bytes a dataset of the storage bench for a 1,544-byte vector.
--
-- Now a row is the model's id (4 bytes: embedding_models, below), the dimension (2: a smallint, at
-- most pgvector's 16,000), the content hash as its 32 bytes, the halfvec, created_at and run_id:
-- 1,624 bytes at 768 dimensions, whatever the length of the model's name. The key is
-- (content_hash, model) as before; statements compare it with decode(<hex hash>, 'hex') (content
-- hashes are SHA-256 in hexadecimal, domain/dataset.py) and find a model through its name in
-- embedding_models. The models' HNSW indexes are partial indexes WHERE model = <id>. Vectors of 384,
-- 1,024 or 1,536 dimensions fit as many rows a page as before (nine, three, two); models' names of
-- more than 24 characters gain more.
--
-- The table is written anew, in the migration's transaction: at 1,000,000 vectors about 1.6 GB
-- written (bench/README.md). Runs wait at the migration lock; searches read the old table while the
-- new one is written, and wait for its last steps. The models' HNSW indexes go with the old table,
-- as with sql/019 (built here they would take the session's maintenance_work_mem, an order of
-- magnitude slower at a million, while every run waited): the next upsert of any portal builds each
-- model's index again, concurrently and with the memory its graph needs (store/vectors.ensure_index),
-- or at once `harvester embeddings reindex`. Until then searches without a portal filter rank by
-- exact scans: the same results, slower (the per-portal indexes, on dataset_vectors, stay). A vector
-- whose hash is not lowercase hexadecimal (a hand-made row) is not carried over: no dataset's text
-- has that hash (runs write SHA-256 in lowercase hexadecimal), so none loses its vector. Nothing a
-- run wrote is lost.
CREATE TABLE embedding_models (
    id   integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE
);

INSERT INTO embedding_models (name) SELECT DISTINCT model FROM embeddings ORDER BY 1;

-- Column order matters: the 4-byte model and the 2-byte dimension, then the hash (a 1-byte header:
-- no padding), the halfvec (4-byte aligned), the two 8-byte values: no gap. The vector column keeps
-- the old one's type.
CREATE TABLE embeddings_new AS
SELECT m.id AS model,                                  -- embedding_models.id
       e.dimension::smallint AS dimension,
       decode(e.content_hash, 'hex') AS content_hash,  -- the text the vector is of, as bytes
       e.embedding,
       e.created_at,
       e.run_id
FROM embeddings e JOIN embedding_models m ON m.name = e.model
WHERE e.content_hash ~ '^([0-9a-f]{2})+$';

DROP TABLE embeddings;
ALTER TABLE embeddings_new RENAME TO embeddings;
ALTER TABLE embeddings ALTER COLUMN model SET NOT NULL, ALTER COLUMN dimension SET NOT NULL,
    ALTER COLUMN content_hash SET NOT NULL, ALTER COLUMN embedding SET NOT NULL,
    ALTER COLUMN created_at SET NOT NULL, ALTER COLUMN created_at SET DEFAULT now(),
    ADD CONSTRAINT embeddings_dimension_check CHECK (dimension > 0),
    ADD CONSTRAINT embeddings_check CHECK (vector_dims(embedding) = dimension),
    ADD PRIMARY KEY (content_hash, model);
-- No foreign key to embedding_models: its check would lock the model's one row (FOR KEY SHARE) for
-- every vector written, by every run of every portal embedding with that model at once. Ids come
-- only from that table (store/vectors.model_id), and no statement deletes a model's row.

-- A vector deleted (`harvester embeddings invalidate`) takes its copies for search with it, and the
-- checked marks of its model (sql/012, sql/041).
CREATE OR REPLACE FUNCTION harvester_vectors_deleted() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    DELETE FROM dataset_vectors v
    USING gone g, embedding_models m, dataset_search s, vector_scopes c
    WHERE m.id = g.model AND s.content_hash = encode(g.content_hash, 'hex') AND v.dataset_id = s.dataset_id
      AND c.id = v.scope AND c.model = m.name;
    DELETE FROM dataset_vectors_checked c
    USING gone g, embedding_models m, datasets d
    WHERE m.id = g.model AND d.content_hash = encode(g.content_hash, 'hex') AND c.portal_url = d.portal_url
      AND c.model = m.name;
    RETURN NULL;
END
$$;

CREATE TRIGGER embeddings_deleted AFTER DELETE ON embeddings
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION harvester_vectors_deleted();

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM embeddings) THEN
        ANALYZE embeddings;
    END IF;
END
$$;
