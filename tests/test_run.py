"""Run planning, stats and progress lines (pure)."""
from datetime import datetime, timedelta, timezone

from harvester.run import STAT_KEYS, Progress, complete_stats, plan_run

WM = datetime(2026, 1, 2, 3, 0, tzinfo=timezone.utc)


def test_first_run_is_full():
    plan = plan_run(None, full_sync=False, backfill=False, lookback=timedelta(hours=1))
    assert (plan.mode, plan.since) == ("full", None)


def test_incremental_since_watermark_minus_lookback():
    plan = plan_run(WM, full_sync=False, backfill=False, lookback=timedelta(minutes=90))
    assert plan.mode == "incremental" and plan.since == WM - timedelta(minutes=90)


def test_full_sync_param_and_backfill_force_full():
    assert plan_run(WM, full_sync=True, backfill=False, lookback=timedelta(0)).mode == "full"
    assert plan_run(WM, full_sync=False, backfill=True, lookback=timedelta(0)).mode == "full"


def test_complete_stats_has_every_key():
    stats = complete_stats({"created": 3})
    assert set(STAT_KEYS) <= set(stats) and stats["created"] == 3 and stats["embedded"] == 0


def test_progress_line_reports_rate_and_eta():
    now = [0.0]
    lines = []

    class Log:
        def info(self, fmt, *args):
            lines.append(fmt % args)

    progress = Progress("embed", 100, Log(), every_seconds=5, clock=lambda: now[0])
    now[0] = 2.0
    progress.advance(20)
    assert lines == []
    now[0] = 10.0
    progress.advance(30)
    assert lines == ["embed: 50/100 (50%), 5.0/s, ETA 10s"]
