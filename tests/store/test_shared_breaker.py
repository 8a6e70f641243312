"""The circuit breaker shared through PostgreSQL: many connections and threads see one breaker."""
import logging
import threading

import psycopg
import pytest

from harvester.domain.breaker import CLOSED, HALF_OPEN, OPEN, BreakerConfig
from harvester.store.breaker import ERROR_CHARS, SharedBreaker
from harvester.testing.clock import Clock, pass_breaker_time

PROVIDER, MODEL = "gemini", "gemini-embedding-001@768"
LOGGER = "harvester.store.breaker"


@pytest.fixture
def clock():
    """A clock the test moves; shared by every thread and connection."""
    return Clock()


@pytest.fixture
def connect(database_url):
    opened = []

    def new():
        conn = psycopg.connect(database_url, autocommit=True)
        opened.append(conn)
        return conn

    yield new
    for conn in opened:
        conn.close()


def transitions(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def row(db, *columns):
    return db.execute(f"SELECT {', '.join(columns)} FROM circuit_breakers WHERE provider = %s AND model = %s",
                      (PROVIDER, MODEL)).fetchone()


def run_threads(n, target):
    """Run target(i) in n threads started together; re-raise the first error."""
    barrier, errors = threading.Barrier(n), []

    def body(i):
        try:
            barrier.wait(timeout=10)
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "threads hung"
    if errors:
        raise errors[0]


def test_a_healthy_breaker_writes_nothing(db, clock):
    breaker = SharedBreaker(db, PROVIDER, MODEL, BreakerConfig(), clock)
    assert breaker.admit().allowed
    assert breaker.record_success() is None
    assert breaker.state().state == CLOSED
    assert db.execute("SELECT count(*) FROM circuit_breakers").fetchone()[0] == 0


def test_two_connections_share_one_breaker(db, connect, clock, caplog):
    caplog.set_level(logging.WARNING, LOGGER)
    config = BreakerConfig()
    a = SharedBreaker(db, PROVIDER, MODEL, config, clock)
    b = SharedBreaker(connect(), PROVIDER, MODEL, config, clock)
    for _ in range(3):
        a.record_failure(error_text="HTTP 503")
    b.record_failure(error_text="HTTP 503")
    assert a.state().consecutive_failures == b.state().consecutive_failures == 4
    transition = b.record_failure(rate_limited=True, error_text="HTTP 429")
    assert transition.to_state == OPEN
    assert a.state().state == OPEN and a.state().recovery_timeout == 60

    clock.now += 10
    decision = a.admit()
    assert decision.rejected and decision.retry_in == pytest.approx(50)
    other_model = SharedBreaker(db, PROVIDER, "another-model", config, clock)
    assert other_model.admit().allowed  # one breaker per provider and model

    clock.now += 50
    first, second, third = b.admit(), a.admit(), b.admit()
    assert (first.probe, second.probe, third.allowed) == (True, True, False)
    assert a.record_success(probe=True) is None
    assert b.record_success(probe=True).to_state == CLOSED
    assert a.state().state == CLOSED and a.admit().allowed
    assert row(db, "state", "consecutive_failures", "recovery_timeout_secs", "probes_in_flight", "probe_leases",
               "opened_at") == ("closed", 0, 30.0, 0, [], None)
    assert transitions(caplog) == [
        f"circuit breaker {PROVIDER}/{MODEL} CLOSED -> OPEN after 5 consecutive failures (last: HTTP 429);"
        " rejecting calls for 60s (rate limited: 30s x 2; at most 300s)",
        f"circuit breaker {PROVIDER}/{MODEL} OPEN -> HALF-OPEN after the 60s recovery timeout;"
        " letting up to 2 probe calls through at a time",
        f"circuit breaker {PROVIDER}/{MODEL} HALF-OPEN -> CLOSED after 2 consecutive successful probes;"
        " recovery timeout back to 30s",
    ]


def test_concurrent_failures_are_all_counted_and_open_it_once(db, connect, clock, caplog):
    caplog.set_level(logging.WARNING, LOGGER)
    config = BreakerConfig(failure_threshold=5)
    threads, calls = 8, 15
    breakers = [SharedBreaker(connect(), PROVIDER, MODEL, config, clock) for _ in range(threads)]
    admitted = [0] * threads

    def hammer(i):
        for _ in range(calls):
            if breakers[i].admit().allowed:
                admitted[i] += 1
            breakers[i].record_failure(error_text=f"HTTP 503 from worker {i}")

    run_threads(threads, hammer)
    state, failures, opened_at, successes, probes = row(
        db, "state", "consecutive_failures", "opened_at", "consecutive_successes", "probes_in_flight")
    assert (state, failures, successes, probes) == ("open", threads * calls, 0, 0)
    assert opened_at.timestamp() == clock.now
    logged = transitions(caplog)
    assert len(logged) == 1 and "CLOSED -> OPEN after 5 consecutive failures (last: HTTP 503 from worker" in logged[0]
    assert 5 <= sum(admitted) < threads * calls  # once it opened, calls were rejected


def test_half_open_admits_only_the_bounded_number_of_probes(db, connect, clock, caplog):
    caplog.set_level(logging.WARNING, LOGGER)
    config = BreakerConfig(failure_threshold=1, half_open_max_probes=3, success_threshold=3)
    SharedBreaker(db, PROVIDER, MODEL, config, clock).record_failure(error_text="HTTP 500")
    clock.now += config.recovery_timeout_secs
    threads = 12
    breakers = [SharedBreaker(connect(), PROVIDER, MODEL, config, clock) for _ in range(threads)]
    decisions = [None] * threads

    def call(i):
        decisions[i] = breakers[i].admit()

    run_threads(threads, call)
    probes = [d for d in decisions if d.allowed]
    assert len(probes) == 3 and all(d.probe and d.state == HALF_OPEN for d in probes)
    assert all(d.retry_in > 0 for d in decisions if d.rejected)
    assert row(db, "state", "probes_in_flight") == ("half_open", 3)
    logged = transitions(caplog)
    assert [m.split(" after ")[0].rsplit(" ", 3)[1:] for m in logged] == [["CLOSED", "->", "OPEN"],
                                                                            ["OPEN", "->", "HALF-OPEN"]]

    # results come back concurrently too: the third success closes it, exactly once
    def succeed(i):
        breakers[i].record_success(probe=True)

    run_threads(3, succeed)
    assert row(db, "state", "probes_in_flight", "consecutive_successes") == ("closed", 0, 0)
    assert sum("HALF-OPEN -> CLOSED" in m for m in transitions(caplog)) == 1


def test_an_expired_probe_lease_frees_the_slot(db, connect, clock):
    config = BreakerConfig(failure_threshold=1, half_open_max_probes=1, probe_lease_secs=5)
    dead = SharedBreaker(db, PROVIDER, MODEL, config, clock)
    dead.record_failure()
    clock.now += 30
    assert dead.admit().probe  # ... and this worker dies without recording the result
    alive = SharedBreaker(connect(), PROVIDER, MODEL, config, clock)
    clock.now += 4.9
    decision = alive.admit()
    assert decision.rejected and decision.retry_in == pytest.approx(0.1)
    clock.now += 0.1
    decision = alive.admit()
    assert decision.allowed and decision.probe
    assert row(db, "probes_in_flight") == (1,)
    leases = row(db, "probe_leases")[0]
    assert [lease.timestamp() for lease in leases] == [pytest.approx(clock.now + 5)]
    alive.record_failure(probe=True, error_text="HTTP 502")
    assert row(db, "state", "probes_in_flight", "probe_leases") == ("open", 0, [])


def test_the_database_clock_is_the_default(db, connect):
    config = BreakerConfig(failure_threshold=2, recovery_timeout_secs=30)
    a = SharedBreaker(db, PROVIDER, MODEL, config)
    b = SharedBreaker(connect(), PROVIDER, MODEL, config)
    a.record_failure()
    b.record_failure()
    decision = a.admit()
    assert decision.rejected and 29 < decision.retry_in <= 30
    db_now, opened_at, updated_at = db.execute(
        "SELECT clock_timestamp(), opened_at, updated_at FROM circuit_breakers").fetchone()
    assert 0 <= (db_now - opened_at).total_seconds() < 5 and updated_at == opened_at


def test_time_passed_on_the_database_clock_ends_the_opening_and_the_probe_leases(db):
    """(What tests of whole runs use instead of sleeping: harvester.testing.clock.pass_breaker_time.)"""
    config = BreakerConfig(failure_threshold=1, recovery_timeout_secs=30, half_open_max_probes=1, probe_lease_secs=60)
    breaker = SharedBreaker(db, PROVIDER, MODEL, config)
    breaker.record_failure()
    assert pass_breaker_time(db, 25) == 1
    decision = breaker.admit()
    assert decision.rejected and 0 < decision.retry_in <= 5
    pass_breaker_time(db, 5)
    assert breaker.admit().probe  # ... and this probe never reports back
    assert breaker.admit().rejected
    pass_breaker_time(db, 60)
    assert breaker.admit().probe
    assert row(db, "state", "probes_in_flight") == ("half_open", 1)


def test_error_text_is_truncated_and_kept(db, clock):
    breaker = SharedBreaker(db, PROVIDER, MODEL, BreakerConfig(), clock)
    breaker.record_failure(error_text="HTTP 500: " + "x" * 5000)
    (last_error,) = row(db, "last_error")
    assert len(last_error) == ERROR_CHARS and last_error.startswith("HTTP 500: xxx") and last_error.endswith("…")
    assert breaker.state().last_error == last_error
