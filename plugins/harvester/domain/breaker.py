"""A circuit breaker for a paid API, as a pure state machine: no IO, no clock of its own.

Every function takes the current state and ``now`` (seconds since the epoch, from whatever clock
the caller trusts) and returns the next state; store/breaker.py keeps that state in PostgreSQL so
every worker shares one breaker per provider and model.

    CLOSED    --failure_threshold consecutive failures-->     OPEN
    OPEN      --recovery timeout elapsed (at the next admit)--> HALF_OPEN
    HALF_OPEN --success_threshold successful probes-->        CLOSED
    HALF_OPEN --any failure-->                                OPEN

- CLOSED lets every call through. A success resets the failure count; the failure that reaches
  the threshold opens the breaker.
- OPEN rejects every call at once, saying how long until it half-opens (``retry_in``). Results of
  calls admitted before it opened still arrive: failures are counted, nothing changes state.
- HALF_OPEN lets at most ``half_open_max_probes`` probe calls through at a time. A probe holds its
  slot until its result is recorded, or until its lease (``probe_lease_secs``) expires, so a
  worker that died mid-call cannot wedge the breaker. Only probe successes count toward closing
  (a late success of a call admitted while CLOSED says nothing about now); any failure, of a
  probe or of a late call, reopens the breaker, since it is evidence the API still fails.
- Rate limiting (HTTP 429): when the failure that opens the breaker is a 429, the opening lasts
  ``recovery_timeout_secs * rate_limit_backoff_multiplier ** n`` seconds, capped at
  ``max_recovery_timeout_secs``, where n counts the consecutive openings caused by a 429 (1 for
  the first, 2 when a probe of that opening is rate-limited again, ...). An opening caused by
  anything else uses the base timeout and ends the run of 429s; closing resets it to the base.
- Authentication errors are not failures: the caller does not record them (no breaker fixes a
  wrong key).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"
STATES = (CLOSED, OPEN, HALF_OPEN)
LABELS = {CLOSED: "CLOSED", OPEN: "OPEN", HALF_OPEN: "HALF-OPEN"}

# How much of an error message a transition's reason quotes.
_REASON_ERROR_CHARS = 200


class BreakerConfigError(ValueError):
    """The circuit breaker's settings are not valid; the message names every bad variable."""

    transient = False  # domain/errors.py


# field -> the environment variable that sets it (read by config/settings.py's breaker_config();
# named here so the checks below name it too)
ENV_NAMES = {
    "failure_threshold": "CB_FAILURE_THRESHOLD",
    "recovery_timeout_secs": "CB_RECOVERY_TIMEOUT_SECS",
    "success_threshold": "CB_SUCCESS_THRESHOLD",
    "rate_limit_backoff_multiplier": "CB_RATE_LIMIT_BACKOFF_MULTIPLIER",
    "max_recovery_timeout_secs": "CB_MAX_RECOVERY_TIMEOUT_SECS",
    "half_open_max_probes": "CB_HALF_OPEN_MAX_PROBES",
    "probe_lease_secs": "CB_PROBE_LEASE_SECS",
}


def _name(field_name: str) -> str:
    return f"{ENV_NAMES[field_name]} ({field_name})"


@dataclass(frozen=True)
class BreakerConfig:
    """The breaker's settings. ``half_open_max_probes`` defaults to ``success_threshold``: enough
    probes in flight to close the breaker in one round trip, and no more calls than that risked on
    an API that may still be down. ``probe_lease_secs`` must outlast one call to the API including
    its retries: a probe still running when its lease ends no longer holds a slot."""

    failure_threshold: int = 5
    recovery_timeout_secs: float = 30.0
    success_threshold: int = 2
    rate_limit_backoff_multiplier: float = 2.0
    max_recovery_timeout_secs: float = 300.0
    half_open_max_probes: int | None = None
    probe_lease_secs: float = 120.0

    def __post_init__(self) -> None:
        if self.half_open_max_probes is None:
            object.__setattr__(self, "half_open_max_probes", self.success_threshold)
        problems = []
        for name in ("failure_threshold", "success_threshold", "half_open_max_probes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{_name(name)} must be a whole number >= 1, got {value!r}")
        for name in ("recovery_timeout_secs", "max_recovery_timeout_secs", "probe_lease_secs"):
            value = getattr(self, name)
            if not _is_number(value) or not value > 0:
                problems.append(f"{_name(name)} must be a number of seconds > 0, got {value!r}")
        multiplier = self.rate_limit_backoff_multiplier
        if not _is_number(multiplier) or not multiplier >= 1:
            problems.append(f"{_name('rate_limit_backoff_multiplier')} must be a number >= 1, got {multiplier!r}")
        if (not problems and self.max_recovery_timeout_secs < self.recovery_timeout_secs):
            problems.append(f"{_name('max_recovery_timeout_secs')} {self.max_recovery_timeout_secs:g} must be at"
                            f" least {_name('recovery_timeout_secs')} {self.recovery_timeout_secs:g}")
        if problems:
            raise BreakerConfigError("circuit breaker settings: " + "; ".join(problems))

    @property
    def max_probes(self) -> int:
        return self.half_open_max_probes  # type: ignore[return-value]  # resolved in __post_init__

    def recovery_timeout(self, rate_limit_level: int = 0) -> float:
        """How long an opening lasts: the base timeout, times the multiplier once per consecutive
        429-caused opening, capped."""
        timeout = self.recovery_timeout_secs
        for _ in range(max(rate_limit_level, 0)):
            timeout = min(timeout * self.rate_limit_backoff_multiplier, self.max_recovery_timeout_secs)
            if timeout >= self.max_recovery_timeout_secs:
                break
        return timeout


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class BreakerState:
    """One breaker's state. Times are seconds since the epoch.

    consecutive_successes counts successful probes while HALF_OPEN (0 otherwise).
    recovery_timeout is the length of the current (or last) opening; the base when CLOSED.
    rate_limit_level is how many openings in a row a 429 caused (0 when CLOSED).
    probe_leases holds, sorted, when each probe slot held in HALF_OPEN expires.
    """

    state: str = CLOSED
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    opened_at: float | None = None
    recovery_timeout: float = BreakerConfig.recovery_timeout_secs
    rate_limit_level: int = 0
    probe_leases: tuple[float, ...] = field(default=())
    last_error: str | None = None

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"breaker state {self.state!r} must be one of {', '.join(STATES)}")

    @classmethod
    def initial(cls, config: BreakerConfig) -> "BreakerState":
        return cls(recovery_timeout=config.recovery_timeout_secs)

    @property
    def probes_in_flight(self) -> int:
        return len(self.probe_leases)

    def reopens_at(self) -> float | None:
        if self.state != OPEN or self.opened_at is None:
            return None
        return self.opened_at + self.recovery_timeout


@dataclass(frozen=True)
class Transition:
    from_state: str
    to_state: str
    reason: str

    def message(self, name: str) -> str:
        """The log line, e.g. ``circuit breaker gemini/gemini-embedding-001@768 CLOSED -> OPEN after 5
        consecutive failures (last: HTTP 429); rejecting calls for 60s (...)``."""
        return f"circuit breaker {name} {LABELS[self.from_state]} -> {LABELS[self.to_state]} {self.reason}"


@dataclass(frozen=True)
class Decision:
    """Whether a call may go ahead. A probe (HALF_OPEN) must report its result with probe=True.
    ``retry_in`` is, for a rejected call, how many seconds until asking again makes sense.
    ``transition`` is the change admitting caused (OPEN -> HALF_OPEN), if any."""

    allowed: bool
    state: str
    probe: bool = False
    retry_in: float = 0.0
    transition: Transition | None = None

    @property
    def rejected(self) -> bool:
        return not self.allowed


def admit(state: BreakerState, config: BreakerConfig, now: float) -> tuple[Decision, BreakerState]:
    """May a call go ahead now? The first admit after the recovery timeout half-opens the breaker;
    in HALF_OPEN a call is admitted as a probe while a probe slot is free, and takes it."""
    if state.state == CLOSED:
        return Decision(True, CLOSED), state
    transition = None
    if state.state == OPEN:
        reopens_at = state.reopens_at()
        if reopens_at is not None and now < reopens_at:
            return Decision(False, OPEN, retry_in=reopens_at - now), state
        probes = "1 probe call" if config.max_probes == 1 else f"up to {config.max_probes} probe calls"
        transition = Transition(OPEN, HALF_OPEN, f"after the {_secs(state.recovery_timeout)} recovery timeout;"
                                                 f" letting {probes} through at a time")
        state = replace(state, state=HALF_OPEN, consecutive_successes=0, probe_leases=())
    leases = _live(state.probe_leases, now)
    if len(leases) >= config.max_probes:
        retry_in = max(min(leases[0] - now, config.recovery_timeout_secs), 0.0)
        return Decision(False, HALF_OPEN, retry_in=retry_in, transition=transition), replace(state, probe_leases=leases)
    leases = tuple(sorted(leases + (now + config.probe_lease_secs,)))
    return Decision(True, HALF_OPEN, probe=True, transition=transition), replace(state, probe_leases=leases)


def on_success(state: BreakerState, config: BreakerConfig, now: float,
               probe: bool = False) -> tuple[BreakerState, Transition | None]:
    """A call succeeded. In HALF_OPEN a probe's success frees its slot and counts toward closing."""
    if state.state == CLOSED:
        return replace(state, consecutive_failures=0), None
    if state.state == OPEN or not probe:
        return state, None
    leases = _live(state.probe_leases, now)[1:]  # slots are alike: free the one that expires first
    successes = state.consecutive_successes + 1
    if successes >= config.success_threshold:
        closed = replace(BreakerState.initial(config), last_error=state.last_error)
        probes = "1 successful probe" if successes == 1 else f"{successes} consecutive successful probes"
        return closed, Transition(HALF_OPEN, CLOSED, f"after {probes}; recovery timeout back to"
                                                     f" {_secs(config.recovery_timeout_secs)}")
    return replace(state, consecutive_failures=0, consecutive_successes=successes, probe_leases=leases), None


def on_failure(state: BreakerState, config: BreakerConfig, now: float, rate_limited: bool = False,
               probe: bool = False, error: str | None = None) -> tuple[BreakerState, Transition | None]:
    """A call failed (``rate_limited``: with HTTP 429; ``error``: a short, secret-free description).
    Do not record authentication errors: they are not the API failing."""
    failures = state.consecutive_failures + 1
    failed = replace(state, consecutive_failures=failures, consecutive_successes=0, last_error=error)
    last = _last(error, rate_limited)
    if state.state == CLOSED:
        if failures < config.failure_threshold:
            return failed, None
        why = "after 1 failure" if failures == 1 else f"after {failures} consecutive failures"
        return _open(failed, config, now, rate_limited, f"{why}{last}")
    if state.state == OPEN:
        return failed, None
    why = "a probe failed" if probe else "a call admitted before the breaker opened failed"
    return _open(failed, config, now, rate_limited, f"after {why}{last}")


def _open(state: BreakerState, config: BreakerConfig, now: float, rate_limited: bool,
          why: str) -> tuple[BreakerState, Transition]:
    level = state.rate_limit_level + 1 if rate_limited else 0
    timeout = config.recovery_timeout(level)
    reason = f"{why}; rejecting calls for {_secs(timeout)}"
    if level:
        base, factor = _secs(config.recovery_timeout_secs), f"{config.rate_limit_backoff_multiplier:g}"
        growth = f"{base} x {factor}" if level == 1 else f"{base} x {factor}^{level}, {level} rate-limited openings in a row"
        capped = ", capped" if timeout >= config.max_recovery_timeout_secs else ""
        reason += f" (rate limited: {growth}{capped}; at most {_secs(config.max_recovery_timeout_secs)})"
    opened = replace(state, state=OPEN, opened_at=now, recovery_timeout=timeout, rate_limit_level=level,
                     consecutive_successes=0, probe_leases=())
    return opened, Transition(state.state, OPEN, reason)


def _live(leases: tuple[float, ...], now: float) -> tuple[float, ...]:
    return tuple(sorted(lease for lease in leases if lease > now))


def _last(error: str | None, rate_limited: bool) -> str:
    if error:
        text = " ".join(error.split())
        if len(text) > _REASON_ERROR_CHARS:
            text = text[:_REASON_ERROR_CHARS - 1] + "…"
        return f" (last: {text})"
    return " (last: HTTP 429)" if rate_limited else ""


def _secs(seconds: float) -> str:
    return f"{seconds:.0f}s" if float(seconds).is_integer() else f"{seconds:.1f}s"
