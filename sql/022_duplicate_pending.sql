-- Datasets waiting for duplicate grouping (issue 36): a run's commit queues the datasets it
-- touched here (every dataset of a portal never scanned), and the grouping that follows the commit,
-- in a transaction of its own under the groups' lock (store/duplicates.py), takes the queue whole.
-- A commit thus never waits for another portal's grouping, however long that takes, and a grouping
-- that could not run (the lock held past its wait, the worker gone) leaves its rows to the next one.
-- No key, no foreign key: a commit only appends (an insert never waits on a grouping deleting the
-- rows it took), a dataset may be queued twice, and a purged dataset's row is dropped when taken.
CREATE TABLE duplicate_pending (
    dataset_id bigint NOT NULL,
    queued_at  timestamptz NOT NULL DEFAULT now()
);
