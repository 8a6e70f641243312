-- The index on datasets.url_hash is dropped: no statement used it (issue 40: bytes a dataset). The one
-- reader of url_hash, `harvester history --url` (store/history.find_dataset), asks for
-- `url_hash = <hash> OR url = <url>` within a portal; url has no index, so PostgreSQL reads the
-- portal's rows either way (a sequential scan at 20,000 datasets, 20 ms), and no other statement
-- names the column. Every dataset write kept the index up to date all the same, and it took 126
-- bytes a dataset of the storage bench's 16,788 (bench/README.md). The column stays: it is part of
-- each record's staged hashes and of that lookup.
DROP INDEX IF EXISTS datasets_url_hash;
