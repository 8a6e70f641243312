-- Vectors stored in half precision (pgvector's halfvec: 2 bytes a dimension instead of 4).
--
-- Search already ranked by half-precision copies: every model's HNSW index holds halfvec, and a
-- query is cast to it. The tables kept full precision besides, in two copies (embeddings, the cache
-- runs read and write, and dataset_vectors, search's copy by dataset): at 768 dimensions 3 KB each,
-- which PostgreSQL moved out of line (TOAST) in embeddings. In half precision a 768-dimension
-- vector is 1.5 KB and stays on its row: 6.6 + 4.2 KB a dataset become 3.9 + 1.7
-- (bench/storage_bench.py, 20,000 datasets). What a half-precision value loses is below what
-- ranking can tell apart: cosine similarity of a vector and its halfvec is above 0.9999, and
-- recall@10 of exact search over halfvec against exact search over the full-precision vectors is
-- in bench/README.md. Vectors arrive as they did (float32, from the providers) and are rounded
-- once, as they are stored; a value beyond halfvec's range (65,504) is refused with its model
-- named (store/vectors.write).
--
-- The HNSW indexes are dropped here, not rebuilt with the table: rebuilt inside this migration they
-- would be built with the session's maintenance_work_mem (a million vectors: an order of magnitude
-- slower than with their graph in memory) while every run waited for the table. The next upsert of
-- any portal builds each model's index again, concurrently and with the memory its graph needs
-- (store/vectors.ensure_index), or at once `harvester embeddings reindex`. Until then searches
-- rank by exact scans: the same results, slower.
DO $$
DECLARE
    idx record;
BEGIN
    FOR idx IN
        SELECT n.nspname, c.relname FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_am am ON am.oid = c.relam AND am.amname = 'hnsw'
        WHERE i.indrelid = 'embeddings'::regclass
    LOOP
        EXECUTE format('DROP INDEX %I.%I', idx.nspname, idx.relname);
    END LOOP;
END
$$;

-- Both rewrite their table (the space of the full-precision values is handed back at once).
ALTER TABLE embeddings ALTER COLUMN embedding TYPE halfvec USING embedding::halfvec;
ALTER TABLE dataset_vectors ALTER COLUMN embedding TYPE halfvec USING embedding::halfvec;
