"""Time for tests that wait for the shared circuit breaker (store/breaker.py), without waiting.

``Clock`` is a clock the test moves, for a ``SharedBreaker(..., clock=clock)``: every thread and
connection given the same Clock sees the same time.

``pass_breaker_time(conn, seconds)`` is for breakers on PostgreSQL's clock, the default (the embed
step of a run, a task in a dag.test() run): it does what waiting ``seconds`` would do to every
breaker in that database, without the wait. A breaker only measures time from what it recorded
(when it opened, when each probe lease ends), so moving those that far into the past is the same
as that much time passing."""
from __future__ import annotations


class Clock:
    """Seconds since the epoch, as the test sets them; starts at ``now``."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def pass_breaker_time(conn, seconds: float) -> int:
    """Every breaker's recorded times ``seconds`` earlier, as if that much time had passed since
    (``conn``: an autocommit connection to the harvester database). Returns how many breakers."""
    return conn.execute(
        "UPDATE circuit_breakers SET opened_at = opened_at - make_interval(secs => %(s)s),"
        " probe_leases = ARRAY(SELECT lease - make_interval(secs => %(s)s)"
        "                      FROM unnest(probe_leases) WITH ORDINALITY AS l (lease, n) ORDER BY n),"
        " updated_at = updated_at - make_interval(secs => %(s)s)",
        {"s": seconds}).rowcount
