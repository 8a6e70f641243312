-- Safe to operate: runs that can be resumed, runs that were abandoned, and progress to tell them apart.
-- See plugins/harvester/store/runs.py.

-- A run whose worker died without a word: no progress for the portal's stale_after, so the next
-- run of the portal marked it abandoned and went ahead.
ALTER TABLE sync_runs DROP CONSTRAINT sync_runs_status_check;
ALTER TABLE sync_runs ADD CONSTRAINT sync_runs_status_check
    CHECK (status IN ('running', 'committed', 'failed', 'cancelled', 'abandoned'));

-- The last sign of life of a running run (each step's start, every page or batch it writes).
ALTER TABLE sync_runs ADD COLUMN heartbeat_at timestamptz;
UPDATE sync_runs SET heartbeat_at = coalesce(finished_at, started_at);
ALTER TABLE sync_runs ALTER COLUMN heartbeat_at SET DEFAULT now();
ALTER TABLE sync_runs ALTER COLUMN heartbeat_at SET NOT NULL;

-- A failed or cancelled run of an Airflow DAG run keeps its staging, so that clearing the failed
-- task (or the whole DAG run) in Airflow completes it. The next run of the portal supersedes it:
-- its staging goes and resumable turns false.
ALTER TABLE sync_runs ADD COLUMN resumable boolean NOT NULL DEFAULT false;
