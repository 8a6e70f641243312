-- The lookups of datasets by their text's content hash go through a hash index instead of a B-tree
-- (issue 40: bytes a dataset). datasets.content_hash is only ever compared for equality, by
-- statements outside search: a failed text to its datasets (the embedding-failure reports), a text
-- invalidated (`harvester embeddings invalidate`), vectors pruned (`harvester embeddings prune`), and
-- joins. No statement sorts or ranges over it. A B-tree stores each 64-character hexadecimal key
-- whole (about 80 bytes an entry: 133 bytes a dataset after the storage bench's runs, 125 at a
-- million, with the splits of random keys); a hash index stores the key's 4-byte hash code and the
-- row's address (61 and 34), and a probe reads one bucket page instead of descending a tree. Equal
-- hash codes of different texts are told apart by the heap row's value, as PostgreSQL rechecks every
-- hash index match. Hash indexes are WAL-logged and crash-safe since PostgreSQL 10.
--
-- dataset_search.content_hash keeps its B-tree: search's vector side probes it for each candidate
-- of a filtered HNSW scan, and a hash index's cheaper probe changed the plans PostgreSQL chose there
-- (under a 1% portal without an index of its own, at a million datasets, an HNSW scan that stopped
-- at HARVESTER_SEARCH_MAX_SCAN_TUPLES instead of ranking the portal's datasets: bench/README.md).
--
-- Built in the migration's transaction (writes to datasets wait for it: 2.4 s at 1,000,000).
CREATE INDEX datasets_content_hash_h ON datasets USING hash (content_hash);
DROP INDEX datasets_content_hash;
ALTER INDEX datasets_content_hash_h RENAME TO datasets_content_hash;
