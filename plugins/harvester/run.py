"""A harvest run: its mode, its stats, and how they read in a log. Pure: no IO."""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Mapping

STAT_KEYS = (
    "fetched", "created", "updated", "unchanged", "failed", "skipped", "removed",
    "embedding_requests", "embedded", "embeddings_reused", "portal_requests",
)
# Also recorded: what the cache saved (estimates).
SAVINGS_KEYS = ("embedding_calls_saved", "embedding_tokens_saved")

FULL = "full"
INCREMENTAL = "incremental"


@dataclass(frozen=True)
class RunPlan:
    mode: str
    since: datetime | None
    reason: str


def plan_run(watermark: datetime | None, *, full_sync: bool, backfill: bool, lookback: timedelta) -> RunPlan:
    """Full on the first run, when asked, and for backfills; otherwise incremental from the
    watermark minus the lookback overlap (records modified while the last run was listing)."""
    if full_sync:
        return RunPlan(FULL, None, "full_sync was requested")
    if backfill:
        return RunPlan(FULL, None, "backfill runs are full syncs")
    if watermark is None:
        return RunPlan(FULL, None, "first run of this portal (no watermark yet)")
    since = watermark - lookback
    return RunPlan(INCREMENTAL, since, f"modified since {since.isoformat()} (watermark minus {lookback} lookback)")


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
