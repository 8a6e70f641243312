-- Search's copies of the vectors (dataset_vectors, sql/010) packed five to a page instead of four
-- (issue 40: bytes a dataset). A copy's row held the dataset's id, its model and portal as text, its
-- text's content hash as 64 hexadecimal characters and the halfvec: 1,691 bytes at 768 dimensions
-- with a 24-character model and a 22-character portal, so four rows filled a page of 8 KB (each
-- takes its row and a 4-byte line pointer; five need rows of at most 1,624 bytes) and a quarter of
-- every page was empty: 2,074 bytes a dataset for a 1,544-byte vector.
--
-- Now a row is the dataset's id (8 bytes), its scope (4: the id of its portal and model in
-- vector_scopes), the halfvec, and the content hash as its 32 bytes: 1,616 bytes at 768 dimensions,
-- whatever the length of the portal's URL or of the model's name. Search and the runs compare the
-- copy's hash with decode(dataset_search.content_hash, 'hex') (content hashes are SHA-256 in
-- hexadecimal, domain/dataset.py), and find a model's or a portal's copies through their scopes. The
-- per-portal HNSW indexes (sql/029) are partial indexes WHERE scope = <id>.
--
-- The table is written anew in dataset order (the order search's exact path reads it in), in the
-- migration's transaction: at 1,000,000 datasets about 1.6 GB written, 15.8 s on a 2-core machine
-- (bench/README.md). Runs wait at the migration lock; searches read the old table while the new one
-- is written, and wait for the last steps (the old table dropped, the new one's key and cascade).
-- The per-portal indexes go with the old table; their rows in portal_indexes stay, so that
-- `harvester embeddings portal-indexes` lists each as missing (not searched) until the portal's
-- next run builds it again under its name (CREATE INDEX CONCURRENTLY, as after a model switch), or
-- `harvester embeddings portal-indexes --build` does; until then searches filtered on that portal
-- scan the model's shared index, as before sql/029. A copy whose hash is not one of ours
-- (hand-made rows) is not carried over, and its portal is no longer marked checked: the next run
-- copies what is missing. A copy is never the source (embeddings is): nothing is lost.
CREATE TABLE vector_scopes (
    id         integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    portal_url text NOT NULL,
    model      text NOT NULL,
    UNIQUE (portal_url, model)
);

INSERT INTO vector_scopes (portal_url, model)
SELECT DISTINCT portal_url, model FROM dataset_vectors ORDER BY 1, 2;

DELETE FROM dataset_vectors_checked k
WHERE EXISTS (SELECT 1 FROM dataset_vectors v
              WHERE v.portal_url = k.portal_url AND v.content_hash !~ '^([0-9a-fA-F]{2})+$');

-- Column order matters: the 8-byte id, the 4-byte scope, then the halfvec (4-byte aligned) and the
-- hash (a 1-byte header: no padding) leave no gap. The vector column keeps the old one's type. Rows
-- of up to 8 KB stay on their page as before (sql/010), set before any row is written.
CREATE TABLE dataset_vectors_new WITH (toast_tuple_target = 8160, autovacuum_vacuum_scale_factor = 0.02) AS
SELECT v.dataset_id,
       c.id AS scope,                                     -- vector_scopes.id: the copy's portal and model
       v.embedding,
       decode(v.content_hash, 'hex') AS content_hash     -- the text the vector is of, as bytes
FROM dataset_vectors v JOIN vector_scopes c ON c.portal_url = v.portal_url AND c.model = v.model
WHERE v.content_hash ~ '^([0-9a-fA-F]{2})+$'
ORDER BY v.dataset_id;

DROP TABLE dataset_vectors;
ALTER TABLE dataset_vectors_new RENAME TO dataset_vectors;
ALTER TABLE dataset_vectors ALTER COLUMN scope SET NOT NULL, ALTER COLUMN embedding SET NOT NULL,
    ALTER COLUMN content_hash SET NOT NULL, ADD PRIMARY KEY (dataset_id),
    ADD FOREIGN KEY (dataset_id) REFERENCES datasets (id) ON DELETE CASCADE;

-- A vector deleted from embeddings (`harvester embeddings invalidate`) takes its copies with it, and
-- the checked marks of its model (sql/012).
CREATE OR REPLACE FUNCTION harvester_vectors_deleted() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    DELETE FROM dataset_vectors v
    USING gone g, dataset_search s, vector_scopes c
    WHERE s.content_hash = g.content_hash AND v.dataset_id = s.dataset_id
      AND c.id = v.scope AND c.model = g.model;
    DELETE FROM dataset_vectors_checked c
    USING gone g, datasets d
    WHERE d.content_hash = g.content_hash AND c.portal_url = d.portal_url AND c.model = g.model;
    RETURN NULL;
END
$$;

-- Statistics for search's plans at once (a new database's empty table is left unanalyzed: its first
-- bulk run analyzes it, store/datasets.py).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM dataset_vectors) THEN
        ANALYZE dataset_vectors;
    END IF;
END
$$;
