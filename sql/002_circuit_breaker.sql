-- Circuit breakers of paid APIs, shared by every task on every worker: one row per provider and
-- model (see plugins/harvester/breaker.py for the state machine, store/breaker.py for the locking).
-- A row appears the first time its breaker records something; no row reads as CLOSED.
CREATE TABLE circuit_breakers (
    provider              text NOT NULL,
    model                 text NOT NULL,
    state                 text NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open', 'half_open')),
    consecutive_failures  integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    -- successful probes while half_open
    consecutive_successes integer NOT NULL DEFAULT 0 CHECK (consecutive_successes >= 0),
    opened_at             timestamptz,
    -- length of the current (or last) opening; the base timeout when closed
    recovery_timeout_secs double precision NOT NULL CHECK (recovery_timeout_secs > 0),
    -- consecutive openings caused by HTTP 429 (the recovery timeout grows with it)
    rate_limit_level      integer NOT NULL DEFAULT 0 CHECK (rate_limit_level >= 0),
    -- probe slots held while half_open: when each one's lease expires
    probes_in_flight      integer NOT NULL DEFAULT 0,
    probe_leases          timestamptz[] NOT NULL DEFAULT '{}',
    -- the last failure, scrubbed of secrets by the caller and truncated
    last_error            text,
    updated_at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, model),
    CHECK (probes_in_flight = cardinality(probe_leases)),
    CHECK (state = 'closed' OR opened_at IS NOT NULL)
);
