-- What became of every record a run could not take as it is (domain/outcomes.py): failed to parse,
-- failed validation, taken with warnings, embedding deferred, removal withheld. One row per
-- problem of a record; kept HARVESTER_OUTCOMES_KEEP_DAYS after its run, pruned by `harvester purge`.
CREATE TABLE record_outcomes (
    run_id      bigint NOT NULL REFERENCES sync_runs (run_id) ON DELETE CASCADE,
    portal_url  text NOT NULL,
    position    bigint,            -- the record's place in the run's listing, from 1 (NULL: not listed)
    source_id   text,              -- NULL when the record has no identifier
    ordinal     smallint NOT NULL DEFAULT 0,  -- the problem's place among its record's problems
    stage       text NOT NULL CHECK (stage IN ('parse', 'validate', 'embed', 'remove')),
    severity    text NOT NULL CHECK (severity IN ('error', 'warning')),
    code        text NOT NULL,
    field       text,
    value       text,
    message     text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
-- A run's report: its rows by severity and code, in listing order.
CREATE INDEX record_outcomes_run ON record_outcomes (run_id, severity, code, position, ordinal);
-- The purge: a portal's rows older than the retention.
CREATE INDEX record_outcomes_portal_recorded ON record_outcomes (portal_url, recorded_at);

-- A staged record's problems (a JSON array of domain.outcomes.Problem.as_dict()), NULL when none.
ALTER TABLE staging_records ADD COLUMN problems jsonb;
