-- The lookups by a text's content hash go through hash indexes instead of B-trees (issue 40: bytes a
-- dataset). datasets.content_hash and dataset_search.content_hash are only ever compared for
-- equality: from a vector to the datasets holding its text (search's vector side, per candidate),
-- a failed text to its datasets (the embedding-failure reports), a text invalidated or pruned, and
-- joins that PostgreSQL plans as hash joins. No statement sorts or ranges over them. A B-tree stores
-- each 64-character hexadecimal key whole (about 80 bytes an entry, 131-140 bytes a dataset after the
-- storage bench's runs, with the splits of random keys); a hash index stores the key's 4-byte hash
-- code and the row's address (53 bytes a dataset at 20,000 datasets, buckets allocated in powers of
-- two), and a probe reads one bucket page instead of descending a tree. Equal hash codes of different
-- texts are told apart by the heap row's value, as PostgreSQL rechecks every hash index match.
-- Hash indexes are WAL-logged and crash-safe since PostgreSQL 10. Built in the migration's
-- transaction (writes to the two tables wait for it: about a second a table at 1,000,000 datasets).
CREATE INDEX datasets_content_hash_h ON datasets USING hash (content_hash);
DROP INDEX datasets_content_hash;
ALTER INDEX datasets_content_hash_h RENAME TO datasets_content_hash;

CREATE INDEX dataset_search_content_hash_h ON dataset_search USING hash (content_hash);
DROP INDEX dataset_search_content_hash;
ALTER INDEX dataset_search_content_hash_h RENAME TO dataset_search_content_hash;
