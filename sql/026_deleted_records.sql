-- Records a portal says it deleted (an OAI-PMH header with status="deleted": the protocol's own
-- word that a record is gone, given on an incremental listing too, where an absence proves nothing).
-- A source yields them as DatasetRecords marked ``deleted`` (domain/dataset.py); fetch_modified
-- stages them here instead of in staging_records, and the upsert removes the live datasets they
-- name through history.apply_removals, under the same removal guard as a full sync's removals,
-- unless the run staged the same id again after the deletion (seq: where the deletion came in the
-- listing, in staging_records' numbering). Emptied at commit or failure, as the other staging is.
CREATE TABLE staging_deleted (
    run_id            bigint NOT NULL REFERENCES sync_runs (run_id) ON DELETE CASCADE,
    seq               bigint NOT NULL,
    source_id         text NOT NULL,
    metadata_modified timestamptz
);
CREATE INDEX staging_deleted_run_source ON staging_deleted (run_id, source_id);
