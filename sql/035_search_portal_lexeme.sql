-- The full-text index holds each document with its portal as one more lexeme, so that the text
-- side under a portal filter reads the matches of its words on that portal from this one index
-- (issue 40: hybrid search at a million datasets under a portal filter).
--
-- Before, a filtered stage's matches came from two bitmaps ANDed: the words' entries in the
-- full-text index (every match in the catalogue) and the portal's rows in sql/028's index (every
-- row of the portal: 150,000 of a 15% portal at a million), then the heap rows. GIN intersects
-- posting lists itself: asked `words && 'p:<md5 of the portal>'`, it gives only the rows holding
-- both. Measured at a million datasets (bench/README.md, "eighth round"): the read of every match
-- under a portal a third to two thirds faster (a 5% portal's slowest query 114 -> 33 ms).
--
-- The lexeme is 'p:' and the md5 of the portal URL: a user's words never form it (the query parser
-- splits at the colon: `p:<md5>` typed as a query becomes 'p' & '<md5>'). Search ranks with
-- ts_rank on the document column itself, never on this expression, so ranks are as before.
--
-- It replaces the index of the document alone (every text statement that read that index asks
-- this expression, store/search.py _MATCHED): the same size but for the portals' entries (about
-- a megabyte at a million). Built here, in the migration's transaction (writes to dataset_search
-- wait for the build, reads do not: 13 s at a million on 2 cores); the same on PostgreSQL 15 to 18.
CREATE INDEX dataset_search_document_portal ON dataset_search
    USING gin ((document || array_to_tsvector(ARRAY['p:' || md5(portal_url)])));
DROP INDEX dataset_search_document;
-- The expression's statistics (its lexemes' frequencies, the portals' among them): without them
-- PostgreSQL guesses how many rows a condition on it keeps until autovacuum analyzes the table,
-- and at a million datasets that guess made the text side under a 1% portal twice as slow. Only a
-- table with rows (an upgrade): a new database keeps no statistics until its first bulk run
-- gathers them (store/datasets.py ANALYZED_AFTER_BULK; tests/pipeline/test_bulk_statistics.py).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM dataset_search) THEN
        ANALYZE dataset_search;
    END IF;
END
$$;
