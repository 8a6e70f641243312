"""circuit_breakers: one breaker per API provider and model, shared by every task on every worker.

The state machine is harvester.domain.breaker (pure); this module keeps its state in PostgreSQL. Every
change happens in a transaction holding the breaker's row lock (``SELECT ... FOR UPDATE``), so
concurrent callers on any number of connections see and update one consistent state: no failure
is lost, each transition happens (and is logged) once, and HALF_OPEN admits no more probes than
configured. Calls that change nothing (admitting while CLOSED, rejecting while OPEN, a success
while CLOSED with no failures counted) read the row without locking or writing it, so a healthy
breaker costs one cheap SELECT per call.

Time: by default every ``now`` is PostgreSQL's ``clock_timestamp()``, read once per change after
the row lock is taken. All workers thus measure the open period and probe leases on one clock,
however far their own clocks drift, and nothing depends on when a transaction began waiting for
the lock. Passing ``clock`` (seconds since the epoch) replaces the database's clock for every
reading of that instance; tests use it to control time. Do not mix both on one breaker in
production.
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Callable

from harvester.domain import breaker
from harvester.domain.breaker import BreakerConfig, BreakerState, Decision, Transition

log = logging.getLogger(__name__)

# last_error is a short description for operators, not a log: the caller scrubs secrets from it.
ERROR_CHARS = 500

_COLUMNS = ("state, consecutive_failures, consecutive_successes, opened_at, recovery_timeout_secs,"
            " rate_limit_level, probe_leases, last_error")


class SharedBreaker:
    """The breaker of one provider and model, on an autocommit psycopg 3 connection. One instance
    per connection (a connection is not shared between threads); any number of instances, on any
    number of connections and machines, share the breaker through its row.

    Usage: ``decision = b.admit()``; if rejected, do not call and wait ``decision.retry_in``;
    otherwise call the API and record the result with ``probe=decision.probe``: a success with
    ``record_success``, a failure (5xx, 429, timeout, connection error) with ``record_failure``.
    Authentication errors are not recorded."""

    def __init__(self, conn, provider: str, model: str, config: BreakerConfig,
                 clock: Callable[[], float] | None = None):
        self.conn, self.provider, self.model, self.config, self.clock = conn, provider, model, config, clock

    @property
    def name(self) -> str:
        return f"{self.provider}/{self.model}"

    def admit(self) -> Decision:
        """May a call go ahead now? Takes a probe slot when HALF_OPEN and one is free."""
        state, now = self._snapshot()
        decision, new = breaker.admit(state, self.config, now)
        if new == state:
            return decision
        decision, _ = self._change(lambda s, t: _admitted(breaker.admit(s, self.config, t)))
        return decision

    def record_success(self, probe: bool = False) -> Transition | None:
        """A call succeeded; ``probe`` as its Decision said. Returns the transition it caused."""
        state, now = self._snapshot()
        new, _ = breaker.on_success(state, self.config, now, probe)
        if new == state:
            return None
        _, transition = self._change(lambda s, t: (None, *breaker.on_success(s, self.config, t, probe)))
        return transition

    def record_failure(self, rate_limited: bool = False, error_text: str | None = None,
                       probe: bool = False) -> Transition | None:
        """A call failed; ``rate_limited`` for HTTP 429; ``error_text`` a description already
        scrubbed of secrets (it is truncated to ERROR_CHARS and stored). Returns the transition."""
        error = _truncate(error_text)
        _, transition = self._change(
            lambda s, t: (None, *breaker.on_failure(s, self.config, t, rate_limited, probe, error)))
        return transition

    def state(self) -> BreakerState:
        return self._snapshot()[0]

    # -- internals ------------------------------------------------------------------------------
    def _snapshot(self) -> tuple[BreakerState, float]:
        """The state as it is (no lock) and the time."""
        row = self.conn.execute(
            f"SELECT {_COLUMNS}, clock_timestamp() FROM (VALUES (1)) AS one (x)"
            " LEFT JOIN circuit_breakers ON provider = %s AND model = %s",
            (self.provider, self.model)).fetchone()
        state = self._state(row[:-1]) if row[0] is not None else BreakerState.initial(self.config)
        now = self.clock() if self.clock is not None else row[-1].timestamp()
        return state, now

    def _change(self, step):
        """Run ``step(state, now) -> (result, new_state, transition)`` under the row lock, write the
        new state, and log the transition once the change is committed."""
        where = (self.provider, self.model)
        with self.conn.transaction():
            row = self.conn.execute(
                f"SELECT {_COLUMNS} FROM circuit_breakers WHERE provider = %s AND model = %s FOR UPDATE",
                where).fetchone()
            if row is None:
                self.conn.execute(
                    "INSERT INTO circuit_breakers (provider, model, recovery_timeout_secs) VALUES (%s, %s, %s)"
                    " ON CONFLICT (provider, model) DO NOTHING", (*where, self.config.recovery_timeout_secs))
                row = self.conn.execute(
                    f"SELECT {_COLUMNS} FROM circuit_breakers WHERE provider = %s AND model = %s FOR UPDATE",
                    where).fetchone()
            state = self._state(row)
            now = self.clock() if self.clock is not None else \
                self.conn.execute("SELECT clock_timestamp()").fetchone()[0].timestamp()
            result, new, transition = step(state, now)
            if new != state:
                self.conn.execute(
                    "UPDATE circuit_breakers SET state = %s, consecutive_failures = %s, consecutive_successes = %s,"
                    " opened_at = %s, recovery_timeout_secs = %s, rate_limit_level = %s, probes_in_flight = %s,"
                    " probe_leases = %s::timestamptz[], last_error = %s, updated_at = %s"
                    " WHERE provider = %s AND model = %s",
                    (new.state, new.consecutive_failures, new.consecutive_successes, _dt(new.opened_at),
                     new.recovery_timeout, new.rate_limit_level, new.probes_in_flight,
                     [_dt(lease) for lease in new.probe_leases], new.last_error, _dt(now), *where))
        if transition is not None:
            log.warning("%s", transition.message(self.name))
        return result, transition

    @staticmethod
    def _state(row) -> BreakerState:
        state, failures, successes, opened_at, timeout, level, leases, last_error = row
        return BreakerState(
            state=state, consecutive_failures=failures, consecutive_successes=successes,
            opened_at=opened_at.timestamp() if opened_at is not None else None, recovery_timeout=timeout,
            rate_limit_level=level, probe_leases=tuple(sorted(lease.timestamp() for lease in leases or ())),
            last_error=last_error)


def _admitted(pair: tuple[Decision, BreakerState]) -> tuple[Decision, BreakerState, Transition | None]:
    decision, state = pair
    return decision, state, decision.transition


def _dt(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, timezone.utc)


def _truncate(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS - 1] + "…"


def list_states(conn) -> list[dict]:
    """Every breaker with a row, most recently changed first (for display): provider, model,
    state, consecutive_failures, opened_at, retry_at (when an open breaker lets probes through),
    last_error, updated_at. A provider and model without a row is CLOSED."""
    columns = ("provider", "model", "state", "consecutive_failures", "opened_at", "retry_at", "last_error",
               "updated_at")
    rows = conn.execute(
        "SELECT provider, model, state, consecutive_failures, opened_at,"
        " CASE WHEN state = 'open' THEN opened_at + make_interval(secs => recovery_timeout_secs) END,"
        " last_error, updated_at FROM circuit_breakers ORDER BY updated_at DESC, provider, model").fetchall()
    return [dict(zip(columns, row)) for row in rows]
