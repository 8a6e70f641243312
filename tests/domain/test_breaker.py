"""The circuit breaker's state machine (pure): transitions, thresholds, 429 backoff, probes, settings."""
import pytest

from harvester.domain.breaker import (CLOSED, HALF_OPEN, OPEN, BreakerConfig, BreakerConfigError, BreakerState, admit, on_failure, on_success)

CFG = BreakerConfig()  # 5 failures, 30 s, 2 successes, x2 on 429 up to 300 s, 2 probes, 120 s leases
T0 = 1_700_000_000.0


def fail(state, n=1, now=T0, config=CFG, **kw):
    transitions = []
    for _ in range(n):
        state, transition = on_failure(state, config, now, **kw)
        transitions.append(transition)
    return state, [t for t in transitions if t]


def opened(config=CFG, now=T0, rate_limited=False):
    state, _ = fail(BreakerState.initial(config), config.failure_threshold, now, config, rate_limited=rate_limited)
    assert state.state == OPEN
    return state


def half_opened(config=CFG, now=T0):
    state = opened(config, now)
    decision, state = admit(state, config, now + config.recovery_timeout_secs)
    assert decision.allowed and decision.probe and state.state == HALF_OPEN
    return state, now + config.recovery_timeout_secs


# -- settings ------------------------------------------------------------------------------------
def test_defaults_and_probes_default_to_the_success_threshold():
    assert (CFG.failure_threshold, CFG.recovery_timeout_secs, CFG.success_threshold,
            CFG.rate_limit_backoff_multiplier, CFG.max_recovery_timeout_secs) == (5, 30.0, 2, 2.0, 300.0)
    assert CFG.max_probes == 2
    assert BreakerConfig(success_threshold=4).max_probes == 4
    assert BreakerConfig(success_threshold=4, half_open_max_probes=1).max_probes == 1


# (Reading these from the CB_* variables: config/settings.py's breaker_config(), tests/config/test_settings.py.)
@pytest.mark.parametrize("kwargs, message", [
    ({"failure_threshold": 0}, r"CB_FAILURE_THRESHOLD \(failure_threshold\) must be a whole number >= 1, got 0"),
    ({"success_threshold": -1}, r"CB_SUCCESS_THRESHOLD \(success_threshold\) must be a whole number >= 1"),
    ({"half_open_max_probes": 0}, r"CB_HALF_OPEN_MAX_PROBES \(half_open_max_probes\) must be"),
    ({"recovery_timeout_secs": 0.0}, r"CB_RECOVERY_TIMEOUT_SECS \(recovery_timeout_secs\) must be a number of"
                                     r" seconds > 0, got 0.0"),
    ({"recovery_timeout_secs": float("nan")}, r"CB_RECOVERY_TIMEOUT_SECS .* must be a number of seconds > 0, got nan"),
    ({"probe_lease_secs": float("inf")}, r"CB_PROBE_LEASE_SECS .* must be a number of seconds > 0, got inf"),
    ({"rate_limit_backoff_multiplier": 0.5}, r"CB_RATE_LIMIT_BACKOFF_MULTIPLIER .* must be a number >= 1"),
    ({"max_recovery_timeout_secs": 10.0}, r"CB_MAX_RECOVERY_TIMEOUT_SECS .* 10 must be at least"
                                          r" CB_RECOVERY_TIMEOUT_SECS .* 30"),
])
def test_bad_settings_name_the_variable(kwargs, message):
    with pytest.raises(BreakerConfigError, match=message):
        BreakerConfig(**kwargs)


def test_every_bad_setting_is_reported_at_once():
    with pytest.raises(BreakerConfigError) as error:
        BreakerConfig(failure_threshold=0, probe_lease_secs=-1.0)
    assert "CB_FAILURE_THRESHOLD" in str(error.value) and "CB_PROBE_LEASE_SECS" in str(error.value)


def test_direct_construction_is_validated_too():
    with pytest.raises(BreakerConfigError, match="failure_threshold"):
        BreakerConfig(failure_threshold=True)
    with pytest.raises(ValueError, match="breaker state 'ajar'"):
        BreakerState(state="ajar")


# -- CLOSED --------------------------------------------------------------------------------------
def test_closed_admits_everything():
    state = BreakerState.initial(CFG)
    decision, new = admit(state, CFG, T0)
    assert decision.allowed and not decision.probe and decision.state == CLOSED and new is state


def test_opens_after_exactly_the_threshold_of_consecutive_failures():
    state, transitions = fail(BreakerState.initial(CFG), 4, error="HTTP 503")
    assert state.state == CLOSED and state.consecutive_failures == 4 and transitions == []
    state, [transition] = fail(state, 1, error="HTTP 503")
    assert state.state == OPEN and state.opened_at == T0 and state.recovery_timeout == 30
    assert (transition.from_state, transition.to_state) == (CLOSED, OPEN)
    assert transition.reason == "after 5 consecutive failures (last: HTTP 503); rejecting calls for 30s"
    assert transition.message("gemini/gemini-embedding-001@768") == (
        "circuit breaker gemini/gemini-embedding-001@768 CLOSED -> OPEN after 5 consecutive failures"
        " (last: HTTP 503); rejecting calls for 30s")


def test_a_success_resets_the_failure_count():
    state, _ = fail(BreakerState.initial(CFG), 4)
    state, transition = on_success(state, CFG, T0)
    assert state.consecutive_failures == 0 and transition is None
    state, transitions = fail(state, 4)
    assert state.state == CLOSED and transitions == []


def test_threshold_of_one_opens_on_the_first_failure():
    config = BreakerConfig(failure_threshold=1)
    state, [transition] = fail(BreakerState.initial(config), 1, config=config)
    assert state.state == OPEN and transition.reason.startswith("after 1 failure;")


# -- OPEN ----------------------------------------------------------------------------------------
def test_open_rejects_until_the_recovery_timeout_with_retry_in():
    state = opened()
    decision, new = admit(state, CFG, T0 + 10)
    assert decision.rejected and decision.state == OPEN and decision.retry_in == pytest.approx(20)
    assert new == state and decision.transition is None


def test_results_of_calls_admitted_before_opening_change_nothing():
    state = opened()
    again, transition = on_success(state, CFG, T0 + 1)
    assert again == state and transition is None
    again, transition = on_failure(state, CFG, T0 + 1, rate_limited=True, error="late")
    assert again.state == OPEN and again.opened_at == T0 and again.recovery_timeout == 30 and transition is None
    assert again.consecutive_failures == 6 and again.last_error == "late"


def test_after_the_timeout_the_next_admit_half_opens_and_is_a_probe():
    state = opened()
    decision, state = admit(state, CFG, T0 + 30)
    assert decision.allowed and decision.probe and decision.state == HALF_OPEN
    assert decision.transition.from_state == OPEN and decision.transition.to_state == HALF_OPEN
    assert decision.transition.reason == "after the 30s recovery timeout; letting up to 2 probe calls through at a time"
    assert state.state == HALF_OPEN and state.probe_leases == (T0 + 30 + CFG.probe_lease_secs,)


# -- HALF_OPEN -----------------------------------------------------------------------------------
def test_half_open_admits_at_most_max_probes():
    config = BreakerConfig(half_open_max_probes=3, success_threshold=3)
    state = opened(config)
    allowed = []
    for i in range(10):
        decision, state = admit(state, config, T0 + 30 + i)
        allowed.append(decision.allowed)
        assert decision.transition is None or i == 0
    assert allowed == [True] * 3 + [False] * 7
    assert state.probes_in_flight == 3
    decision, _ = admit(state, config, T0 + 40)
    assert decision.rejected and decision.state == HALF_OPEN and decision.retry_in == 30  # capped at the base timeout


def test_a_recorded_probe_frees_its_slot():
    config = BreakerConfig(half_open_max_probes=1, success_threshold=3)
    state, now = half_opened(config)
    assert admit(state, config, now)[0].rejected
    state, transition = on_success(state, config, now + 1, probe=True)
    assert transition is None and state.state == HALF_OPEN and state.consecutive_successes == 1
    decision, state = admit(state, config, now + 2)
    assert decision.allowed and decision.probe


def test_a_probe_lease_expires_so_a_dead_worker_cannot_wedge_the_breaker():
    config = BreakerConfig(half_open_max_probes=1, probe_lease_secs=10)
    state, now = half_opened(config)
    decision, _ = admit(state, config, now + 9)
    assert decision.rejected and decision.retry_in == pytest.approx(1)
    decision, state = admit(state, config, now + 10)
    assert decision.allowed and decision.probe and state.probe_leases == (now + 20,)


def test_success_threshold_of_probes_closes_and_resets():
    state, now = half_opened()
    decision, state = admit(state, CFG, now)
    assert decision.allowed and state.probes_in_flight == 2
    state, transition = on_success(state, CFG, now + 1, probe=True)
    assert transition is None and state.state == HALF_OPEN and state.probes_in_flight == 1
    state, transition = on_success(state, CFG, now + 2, probe=True)
    assert state.state == CLOSED and (transition.from_state, transition.to_state) == (HALF_OPEN, CLOSED)
    assert transition.reason == "after 2 consecutive successful probes; recovery timeout back to 30s"
    assert (state.consecutive_failures, state.consecutive_successes, state.opened_at, state.probes_in_flight,
            state.rate_limit_level, state.recovery_timeout) == (0, 0, None, 0, 0, 30)


def test_late_non_probe_successes_do_not_close_a_half_open_breaker():
    state, now = half_opened()
    for _ in range(5):
        state, transition = on_success(state, CFG, now, probe=False)
        assert transition is None
    assert state.state == HALF_OPEN and state.consecutive_successes == 0


@pytest.mark.parametrize("probe, why", [(True, "a probe failed"),
                                        (False, "a call admitted before the breaker opened failed")])
def test_any_failure_in_half_open_reopens(probe, why):
    config = BreakerConfig(success_threshold=3, half_open_max_probes=3)
    state, now = half_opened(config)
    state, _ = on_success(state, config, now + 1, probe=True)  # one success does not protect it
    state, transition = on_failure(state, config, now + 2, probe=probe, error="timeout")
    assert state.state == OPEN and state.opened_at == now + 2 and state.probes_in_flight == 0
    assert state.consecutive_successes == 0
    assert transition.reason == f"after {why} (last: timeout); rejecting calls for 30s"
    assert admit(state, config, now + 3)[0].rejected


# -- HTTP 429 ------------------------------------------------------------------------------------
def test_a_429_opening_lasts_base_times_the_multiplier():
    state, _ = fail(BreakerState.initial(CFG), 4)
    state, transition = on_failure(state, CFG, T0, rate_limited=True, error="HTTP 429")
    assert state.state == OPEN and state.recovery_timeout == 60 and state.rate_limit_level == 1
    assert transition.message("gemini/gemini-embedding-001@768") == (
        "circuit breaker gemini/gemini-embedding-001@768 CLOSED -> OPEN after 5 consecutive failures"
        " (last: HTTP 429); rejecting calls for 60s (rate limited: 30s x 2; at most 300s)")
    assert admit(state, CFG, T0 + 59)[0].retry_in == pytest.approx(1)
    assert admit(state, CFG, T0 + 60)[0].allowed


def test_only_the_failure_that_opens_decides_the_timeout():
    state, _ = fail(BreakerState.initial(CFG), 4, rate_limited=True)
    state, _ = on_failure(state, CFG, T0, rate_limited=False)
    assert state.recovery_timeout == 30 and state.rate_limit_level == 0


def test_consecutive_429_openings_grow_the_timeout_up_to_the_cap():
    state, now = opened(rate_limited=True), T0
    timeouts = [state.recovery_timeout]
    for _ in range(5):
        now += state.recovery_timeout
        decision, state = admit(state, CFG, now)
        assert decision.probe
        state, transition = on_failure(state, CFG, now, rate_limited=True, probe=True)
        timeouts.append(state.recovery_timeout)
    assert timeouts == [60, 120, 240, 300, 300, 300]
    assert state.rate_limit_level == 6
    assert "30s x 2^6, 6 rate-limited openings in a row, capped; at most 300s" in transition.reason


def test_a_non_429_reopening_and_closing_reset_the_growth():
    state, now = opened(rate_limited=True), T0 + 60
    _, state = admit(state, CFG, now)
    state, _ = on_failure(state, CFG, now, rate_limited=True, probe=True)
    assert state.recovery_timeout == 120
    now += 120
    _, state = admit(state, CFG, now)
    state, _ = on_failure(state, CFG, now, rate_limited=False, probe=True)
    assert state.recovery_timeout == 30 and state.rate_limit_level == 0
    now += 30
    _, state = admit(state, CFG, now)
    state, _ = on_failure(state, CFG, now, rate_limited=True, probe=True)
    assert state.recovery_timeout == 60  # a new run of 429s starts from the base again
    now += 60
    _, state = admit(state, CFG, now)
    _, state = admit(state, CFG, now)
    state, _ = on_success(state, CFG, now, probe=True)
    state, transition = on_success(state, CFG, now, probe=True)
    assert state.state == CLOSED and state.recovery_timeout == 30 and state.rate_limit_level == 0
    state, _ = fail(state, 5, now, rate_limited=True)
    assert state.recovery_timeout == 60


def test_a_multiplier_of_one_never_grows():
    config = BreakerConfig(rate_limit_backoff_multiplier=1)
    assert [config.recovery_timeout(level) for level in range(4)] == [30, 30, 30, 30]
    assert BreakerConfig(max_recovery_timeout_secs=30).recovery_timeout(5) == 30
    assert BreakerConfig().recovery_timeout(10_000) == 300


def test_long_error_texts_are_shortened_in_the_reason():
    state, _ = fail(BreakerState.initial(CFG), 4)
    state, transition = on_failure(state, CFG, T0, error="boom\n" + "x" * 1000)
    assert "(last: boom xxx" in transition.reason and len(transition.reason) < 300
    assert state.last_error.startswith("boom\n")  # the state keeps what it was given (the store truncates)
