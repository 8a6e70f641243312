"""A harvest run: its mode, whether it reconciles, its stats, and how they read in a log. Pure: no IO."""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Mapping

STAT_KEYS = (
    "fetched", "created", "updated", "unchanged", "failed", "skipped", "removed", "reidentified",
    "embedding_requests", "embedded", "embeddings_reused", "portal_requests", "portal_bytes",
)
# Also recorded: what the cache saved (estimates).
SAVINGS_KEYS = ("embedding_calls_saved", "embedding_tokens_saved")
# Recorded by runs that reconcile: identifiers the portal listed, ids we lacked or held with another
# metadata_modified (both then fetched in full), and datasets no longer listed that were removed.
RECONCILE_KEYS = ("reconcile_listed", "reconcile_missing", "reconcile_stale", "reconcile_removed")

FULL = "full"
INCREMENTAL = "incremental"


@dataclass(frozen=True)
class RunPlan:
    mode: str
    since: datetime | None
    reason: str
    # Why this run reconciles with the portal's full list of identifiers; None: it does not (an
    # incremental run may still decide to, when the portal's count disagrees with ours).
    reconcile: str | None = None


def format_duration(delta: timedelta) -> str:
    """``1d 2h``, ``25m``, ``40s``: the two largest units, for logs and messages."""
    seconds = max(0, int(delta.total_seconds()))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return " ".join(parts[:2])


def _due(last: datetime | None, every: timedelta, now: datetime, what: str, setting: str) -> str | None:
    if last is None:
        return f"no {what} recorded yet ({setting} {format_duration(every)})"
    age = now - last
    if age >= every:
        return f"the last {what} was {format_duration(age)} ago ({setting} {format_duration(every)})"
    return None


def plan_run(watermark: datetime | None, *, full_sync: bool, backfill: bool, lookback: timedelta,
             reconcile: bool = False, now: datetime | None = None,
             last_full_sync: datetime | None = None, full_sync_every: timedelta | None = None,
             last_reconciliation: datetime | None = None,
             reconcile_every: timedelta | None = None) -> RunPlan:
    """Full on the first run, when asked, for backfills and when ``full_sync_every`` has passed
    since the last full sync; otherwise incremental from the watermark minus the lookback overlap
    (records modified while the last run was listing). An incremental run also reconciles when asked
    or when ``reconcile_every`` has passed since the last run that listed the whole portal
    (``reconcile_every`` of zero: every run; None: never on a schedule). A full sync lists the whole
    portal anyway, so it never needs to reconcile."""
    now = now or datetime.now(timezone.utc)
    if full_sync:
        return RunPlan(FULL, None, "full_sync was requested")
    if backfill:
        return RunPlan(FULL, None, "backfill runs are full syncs")
    if watermark is None:
        return RunPlan(FULL, None, "first run of this portal (no watermark yet)")
    if full_sync_every is not None:
        due = _due(last_full_sync, full_sync_every, now, "full sync", "full_sync_every")
        if due:
            return RunPlan(FULL, None, due)
    since = watermark - lookback
    reason = f"modified since {since.isoformat()} (watermark minus {format_duration(lookback)} lookback)"
    why = None
    if reconcile:
        why = "reconcile was requested"
    elif reconcile_every is not None:
        if reconcile_every <= timedelta(0):
            why = "reconcile_every is 0: every run reconciles"
        else:
            why = _due(last_reconciliation, reconcile_every, now, "reconciliation", "reconcile_every")
    return RunPlan(INCREMENTAL, since, reason, why)


def count_drift(portal_total: int, live: int, new_in_run: int, unusable: int = 0) -> str | None:
    """Why the portal's own count says our copy drifted, or None when this incremental run explains
    it: the portal should list exactly the datasets we hold live, plus those this run brings that
    we do not hold live yet, plus the records it lists that cannot be used (``unusable``: no id,
    counted at the last complete listing)."""
    expected = live + new_in_run + unusable
    if portal_total == expected:
        return None
    gap = portal_total - expected
    side = "more" if gap > 0 else "fewer"
    extra = f", and {unusable} it lists that cannot be used" if unusable else ""
    return (f"the portal lists {portal_total} datasets; we hold {live} live and this run brings {new_in_run} "
            f"new{extra}: {abs(gap)} {side} on the portal than this run explains")


def complete_stats(stats: Mapping[str, int] | None) -> dict[str, int]:
    """Every stats key present, 0 where nothing happened."""
    stats = stats or {}
    out = {key: int(stats.get(key) or 0) for key in STAT_KEYS + SAVINGS_KEYS}
    out.update({k: v for k, v in stats.items() if k not in out})
    return out


def summary(stats: Mapping[str, int], keys: tuple[str, ...] = STAT_KEYS) -> str:
    return ", ".join(f"{key}={stats.get(key, 0)}" for key in keys)


class Progress:
    """Progress of a long step for the task log: done/total, rate and ETA, at most every few seconds."""

    def __init__(self, what: str, total: int | None, log, every_seconds: float = 10.0, clock=time.monotonic):
        self.what, self.total, self.log, self.every, self.clock = what, total, log, every_seconds, clock
        self.done = 0
        self.started = self._last = clock()

    def advance(self, n: int) -> None:
        self.done += n
        now = self.clock()
        if now - self._last >= self.every:
            self._last = now
            self.log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = max((now if now is not None else self.clock()) - self.started, 1e-9)
        rate = self.done / elapsed
        if self.total:
            remaining = max(self.total - self.done, 0)
            eta = f"{remaining / rate:.0f}s" if rate > 0 else "?"
            pct = 100.0 * self.done / self.total
            return f"{self.what}: {self.done}/{self.total} ({pct:.0f}%), {rate:.1f}/s, ETA {eta}"
        return f"{self.what}: {self.done} so far, {rate:.1f}/s"


# -- one writer per portal ---------------------------------------------------------------------
DEFAULT_STALE_AFTER = timedelta(hours=2)


@dataclass(frozen=True)
class Writer:
    """The run that holds a portal (status running): who started it and its last sign of life."""

    run_id: int
    dag_run_id: str | None
    started_at: datetime
    heartbeat_at: datetime

    def describe(self) -> str:
        who = f"DAG run {self.dag_run_id}" if self.dag_run_id else "the CLI (harvester harvest)"
        return f"run {self.run_id} (started {self.started_at:%Y-%m-%d %H:%M:%S %Z} by {who})"


@dataclass(frozen=True)
class Ownership:
    """What a run that wants the portal does about the run that holds it: ``proceed`` (nobody
    holds it, or the holder is this same DAG run), ``abandon`` (the holder made no progress for
    stale_after: its worker died), ``takeover`` (asked to abort it) or ``refuse``."""

    action: str
    reason: str


def claim(holder: Writer | None, *, dag_run_id: str | None, takeover: bool, stale_after: timedelta,
          now: datetime, portal: str = "the portal") -> Ownership:
    """Decide who writes ``portal``: at most one run at a time, and never stuck behind a dead one."""
    if holder is None:
        return Ownership("proceed", "no other run of the portal is running")
    if dag_run_id is not None and holder.dag_run_id == dag_run_id:
        return Ownership("proceed", f"run {holder.run_id} is this DAG run's own run")
    idle = now - holder.heartbeat_at
    if idle >= stale_after:
        return Ownership("abandon", f"{holder.describe()} made no progress for {format_duration(idle)} "
                                    f"(stale_after {format_duration(stale_after)}): its worker is gone")
    if takeover:
        return Ownership("takeover", f"{holder.describe()} was aborted on request (takeover)")
    return Ownership("refuse", (
        f"{portal} is being harvested by {holder.describe()}, last progress {format_duration(idle)} ago; "
        f"one run writes a portal at a time. Wait for it to finish, or take over explicitly "
        f"(harvester harvest --takeover, or trigger the DAG with takeover ticked), which aborts it. "
        f"A run with no progress for {format_duration(stale_after)} (stale_after) is abandoned automatically."))
