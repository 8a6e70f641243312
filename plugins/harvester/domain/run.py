"""A harvest run: its mode, whether it reconciles, its stats, and how they read in a log. Pure: no IO."""
from __future__ import annotations

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


def count_drift(portal_total: int, live: int, new_in_run: int, unusable: int = 0, *,
                exact: bool = True) -> str | None:
    """Why the portal's own count says our copy drifted, or None when this incremental run explains
    it: the portal should list exactly the datasets we hold live, plus those this run brings that
    we do not hold live yet, plus the records it lists that cannot be used (``unusable``: no id,
    counted at the last complete listing).

    ``exact`` False: the count is capped or estimated (sources/base.py ``CountKind``; Socrata's
    ``resultSetSize`` of 10,000 means "10,000 or more"), so it is only a lower bound: drift shows
    only when we explain fewer than it; as many or more says nothing either way (a removal never
    rests on it: only a reconciliation's complete listing removes)."""
    expected = live + new_in_run + unusable
    extra = f", and {unusable} it lists that cannot be used" if unusable else ""
    if not exact:
        if expected >= portal_total:
            return None
        return (f"the portal lists at least {portal_total} datasets (its count is capped); we hold {live} live and "
                f"this run brings {new_in_run} new{extra}: at least {portal_total - expected} more on the portal "
                f"than this run explains")
    if portal_total == expected:
        return None
    gap = portal_total - expected
    side = "more" if gap > 0 else "fewer"
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


# -- many runs at once: waiting for a busy portal, backfills --------------------------------------
DAG_RUN_TIMEOUT = timedelta(hours=12)  # a harvest DAG run's dagrun_timeout
DEFAULT_EMBEDDING_POOL = "default_pool"  # Airflow's own pool: exists in every installation


@dataclass(frozen=True)
class TaskSettings:
    """What the harvest DAGs take from the environment (config/settings.py's task_settings() reads
    it when the DAG file is parsed: a bad value is an import error naming the variable).

    ``retries``/``retry_delay``: HARVESTER_TASK_RETRIES, HARVESTER_TASK_RETRY_DELAY_SECS.
    ``busy_poll``: HARVESTER_BUSY_POLL_SECS, how often begin checks a portal another run holds
    (a sensor in reschedule mode: between checks it holds no worker slot). ``busy_wait``:
    HARVESTER_BUSY_WAIT_SECS, how long it waits at most before it fails naming that run; by
    default half the DAG run timeout (so a run that waited that long still has as much for its own
    work), and always less than it. ``backfill_cover``: HARVESTER_BACKFILL_COVER_SECS, how long a
    backfill's full sync covers the other DAG runs of a backfill (cover_backfill; 0: never, each
    backfill DAG run syncs in turn). ``embedding_pool``: HARVESTER_EMBEDDING_POOL, the Airflow pool
    of embed_changed (default Airflow's default_pool, which always exists: a task in a pool that
    does not exist is never scheduled)."""

    retries: int = 3
    retry_delay: timedelta = timedelta(seconds=30)
    busy_poll: timedelta = timedelta(seconds=60)
    busy_wait: timedelta = DAG_RUN_TIMEOUT / 2
    backfill_cover: timedelta = timedelta(hours=12)
    embedding_pool: str = DEFAULT_EMBEDDING_POOL


@dataclass(frozen=True)
class BackfillRun:
    """The newest run of a portal that a backfill DAG run started, as sync_runs holds it."""

    run_id: int
    dag_run_id: str | None
    status: str
    started_at: datetime
    heartbeat_at: datetime
    finished_at: datetime | None

    def describe(self) -> str:
        return f"run {self.run_id} (a full sync started {self.started_at:%Y-%m-%d %H:%M:%S %Z} by DAG run {self.dag_run_id})"


@dataclass(frozen=True)
class Cover:
    """What a backfill DAG run does: ``run`` (sync the portal itself), ``wait`` (for the backfill
    full sync under way) or ``covered`` (by ``run_id``, a backfill's full sync committed recently:
    nothing left to do)."""

    action: str
    reason: str
    run_id: int | None = None


def cover_backfill(last: BackfillRun | None, *, dag_run_id: str, takeover: bool, window: timedelta,
                   stale_after: timedelta, now: datetime, portal: str = "the portal") -> Cover:
    """One full sync per backfill. A portal's records have no past to replay: every backfill DAG run
    would read the same portal as it is now, so the first backfill DAG run to begin syncs it in full
    and the others are covered by that sync. Airflow does not tell a task which backfill its DAG run
    belongs to, so "the same backfill" is read from the harvester's own records: ``last``, the
    portal's newest run started by a backfill DAG run, covers this one when it is running (then this
    one waits for it, unless it is stale: then this one syncs and abandons it) or committed less than
    ``window`` ago. Anything else (none, failed, cancelled, abandoned, older) and ``takeover``: this
    DAG run syncs the portal itself. Only backfill runs count: a scheduled or manual run in between
    (which a backfill does not hold back) neither covers a backfill nor stops one from being covered."""
    if takeover:
        return Cover("run", "takeover was requested: this DAG run syncs the portal itself")
    if window <= timedelta(0):
        return Cover("run", "HARVESTER_BACKFILL_COVER_SECS is 0: every backfill DAG run syncs the portal")
    if last is None:
        return Cover("run", f"no backfill DAG run synced {portal} yet: this one does, in full")
    if last.dag_run_id == dag_run_id:
        return Cover("run", f"{last.describe()} is this DAG run's own")
    if last.status == "running":
        idle = now - last.heartbeat_at
        if idle >= stale_after:
            return Cover("run", f"{last.describe()} made no progress for {format_duration(idle)} (stale_after "
                                f"{format_duration(stale_after)}): this DAG run syncs {portal} instead")
        return Cover("wait", (
            f"{portal} is being synced in full for this backfill by {last.describe()}, last progress "
            f"{format_duration(idle)} ago: this backfill DAG run waits for it instead of syncing the portal again"),
            last.run_id)
    if last.status == "committed" and last.finished_at is not None:
        age = now - last.finished_at
        if age < window:
            return Cover("covered", (
                f"{last.describe()} synced {portal} in full for a backfill and committed {format_duration(age)} ago "
                f"(HARVESTER_BACKFILL_COVER_SECS {format_duration(window)}): this backfill DAG run has nothing "
                f"left to do"), last.run_id)
        return Cover("run", f"the last backfill full sync of {portal}, {last.describe()}, committed "
                            f"{format_duration(age)} ago (HARVESTER_BACKFILL_COVER_SECS {format_duration(window)}): "
                            f"this backfill DAG run syncs it again")
    return Cover("run", f"the last backfill full sync of {portal}, {last.describe()}, is {last.status}: "
                        f"this backfill DAG run syncs it itself")
