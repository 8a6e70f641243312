-- Space a run frees is reused by the next runs, not added to (issue 40: bytes per dataset after 10
-- incremental runs of 1% changes).
--
-- Every changed dataset leaves dead row versions behind in the tables that hold a row a dataset:
-- its row of datasets (and, out of line, its raw record: about 3.5 KB a dataset), its search row,
-- its duplicate keys, its current version (closed when a new one comes). PostgreSQL reuses that
-- room only once a vacuum has marked it free, and autovacuum comes by when a table's dead rows
-- reach 20% of it (autovacuum_vacuum_scale_factor's default): until then each run's changes take
-- new pages, so a catalogue where 1% of the datasets change a day grows by up to a fifth before
-- any of it is reused (bench/storage_bench.py: about 1.3 KB a dataset after ten such runs).
-- At 2% (and for their TOAST tables, where the raw records and snapshots are), a vacuum follows
-- every run or two of that size, and the next runs write into the room it freed.
--
-- What it costs: a vacuum of these tables more often, each of which reads only the pages changed
-- since the last one (the visibility map) and each of the table's indexes once (at a million
-- datasets, a few seconds of reading in the background; nobody waits for it: autovacuum gives way
-- to any lock a run asks for). embeddings is left as it is: vacuuming an HNSW graph is the costly
-- part, and its rows are deleted only by `harvester embeddings prune`.
--
-- Storage parameters only: nothing is rewritten, the tables are locked for an instant (SHARE UPDATE
-- EXCLUSIVE: reads and writes go on). The same on PostgreSQL 15 to 18.
ALTER TABLE datasets SET (autovacuum_vacuum_scale_factor = 0.02, toast.autovacuum_vacuum_scale_factor = 0.02);
ALTER TABLE dataset_search SET (autovacuum_vacuum_scale_factor = 0.02, toast.autovacuum_vacuum_scale_factor = 0.02);
ALTER TABLE dataset_versions SET (autovacuum_vacuum_scale_factor = 0.02, toast.autovacuum_vacuum_scale_factor = 0.02);
ALTER TABLE dataset_keys SET (autovacuum_vacuum_scale_factor = 0.02);
ALTER TABLE dataset_vectors SET (autovacuum_vacuum_scale_factor = 0.02);
