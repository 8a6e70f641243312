-- Search at a million datasets (issue 40): the vector side pre-ranks by the vectors' binary
-- quantization (one bit a dimension, the sign: pgvector's binary_quantize, Hamming distance) and
-- ranks its best few hundred exactly by the cosine of the stored half-precision vectors.
--
-- embeddings is unchanged: every stored vector stays valid, nothing is embedded again.
--
-- dataset_vectors, search's copy of each dataset's vector for filters that leave few datasets
-- (sql/010), now holds the bit vector instead of a halfvec copy: 96 bytes at 768 dimensions
-- instead of 1,536 (about 2 KB a dataset less with its row overhead), and a Hamming distance
-- instead of a cosine over each dataset a filter leaves (the exact ranking of 37,000-126,000
-- datasets took 240-590 ms at a million; bench/README.md). The column is rewritten in place, in
-- one pass over the table (about 20 s at a million datasets on the bench's machine; the table goes
-- from about 2.1 GB to about 0.2 GB), each copy quantized from the halfvec it held, which is the
-- vector of the dataset's text in embeddings (copy_for_search keeps them equal).
--
-- The models' HNSW indexes are not touched here: the next upsert of any portal (or `harvester
-- embeddings reindex`) builds each model's binary index concurrently and with the memory its graph
-- needs (store/vectors.ensure_index), then drops the halfvec one; about 3-4 minutes at a million
-- vectors of 768 dimensions, where the halfvec index took 10. Until the binary index is valid,
-- searches without a selective filter rank by exact scans: the same results, slower.
ALTER TABLE dataset_vectors ALTER COLUMN embedding TYPE varbit USING binary_quantize(embedding)::varbit;
ALTER TABLE dataset_vectors RENAME COLUMN embedding TO bits;
-- Rows are small now: PostgreSQL's default TOAST target again.
ALTER TABLE dataset_vectors RESET (toast_tuple_target);
