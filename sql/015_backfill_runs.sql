-- Backfills mean one full sync (plugins/harvester/run.py cover_backfill): the first backfill DAG run
-- to begin syncs the portal in full; the others are covered by that run and do nothing.

-- The run was started by a backfill DAG run (Airflow's run type "backfill").
ALTER TABLE sync_runs ADD COLUMN backfill boolean NOT NULL DEFAULT false;
-- The backfill DAG runs this run covered (their begin task found it, and their other tasks were skipped).
ALTER TABLE sync_runs ADD COLUMN covered_dag_runs text[] NOT NULL DEFAULT '{}';
-- The newest backfill run of a portal, looked up by every backfill DAG run's begin.
CREATE INDEX sync_runs_portal_backfill ON sync_runs (portal_url, run_id DESC) WHERE backfill;
