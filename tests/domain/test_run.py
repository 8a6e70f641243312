"""Run planning, stats and progress lines (pure)."""
from datetime import datetime, timedelta, timezone

import pytest

from harvester.domain.run import STAT_KEYS, complete_stats, count_drift, format_duration, plan_run

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


NOW = WM + timedelta(hours=3)
DAY = timedelta(hours=24)


def test_reconcile_when_asked_or_due_never_on_full_syncs():
    plan = plan_run(WM, full_sync=False, backfill=False, lookback=timedelta(hours=2), now=NOW)
    assert plan.reconcile is None
    assert plan_run(WM, full_sync=False, backfill=False, lookback=timedelta(0), reconcile=True,
                    now=NOW).reconcile == "reconcile was requested"
    due = plan_run(WM, full_sync=False, backfill=False, lookback=timedelta(0), now=NOW,
                   last_reconciliation=NOW - timedelta(hours=25, minutes=3), reconcile_every=DAY)
    assert due.reconcile == "the last reconciliation was 1d 1h ago (reconcile_every 1d)"
    assert plan_run(WM, full_sync=False, backfill=False, lookback=timedelta(0), now=NOW,
                    last_reconciliation=NOW - timedelta(hours=23), reconcile_every=DAY).reconcile is None
    assert plan_run(WM, full_sync=False, backfill=False, lookback=timedelta(0), now=NOW, last_reconciliation=None,
                    reconcile_every=DAY).reconcile == "no reconciliation recorded yet (reconcile_every 1d)"
    assert plan_run(WM, full_sync=False, backfill=False, lookback=timedelta(0), now=NOW,
                    reconcile_every=timedelta(0)).reconcile == "reconcile_every is 0: every run reconciles"
    assert plan_run(WM, full_sync=False, backfill=False, lookback=timedelta(0), now=NOW, last_reconciliation=None,
                    reconcile_every=None).reconcile is None
    full = plan_run(WM, full_sync=True, backfill=False, lookback=timedelta(0), reconcile=True, now=NOW)
    assert (full.mode, full.reconcile) == ("full", None)


def test_full_sync_every():
    kw = dict(full_sync=False, backfill=False, lookback=timedelta(0), now=NOW, full_sync_every=timedelta(days=30))
    assert plan_run(WM, last_full_sync=NOW - timedelta(days=29), **kw).mode == "incremental"
    plan = plan_run(WM, last_full_sync=NOW - timedelta(days=30, hours=2), **kw)
    assert (plan.mode, plan.reason) == ("full", "the last full sync was 30d 2h ago (full_sync_every 30d)")
    assert plan_run(WM, last_full_sync=None, **kw).reason == "no full sync recorded yet (full_sync_every 30d)"


@pytest.mark.parametrize("total, live, new, unusable, drift", [
    (501, 489, 12, 0, None),
    (501, 489, 5, 0, "the portal lists 501 datasets; we hold 489 live and this run brings 5 new: "
                     "7 more on the portal than this run explains"),
    (9, 10, 0, 0, "the portal lists 9 datasets; we hold 10 live and this run brings 0 new: "
                  "1 fewer on the portal than this run explains"),
    (11, 10, 0, 1, None),
    (10, 10, 0, 1, "the portal lists 10 datasets; we hold 10 live and this run brings 0 new, and 1 it lists "
                   "that cannot be used: 1 fewer on the portal than this run explains"),
])
def test_count_drift(total, live, new, unusable, drift):
    assert count_drift(total, live, new, unusable) == drift


@pytest.mark.parametrize("total, live, new, drift", [
    # Socrata's resultSetSize of 10000 means "10000 or more": holding 12,000 is no drift, and
    # neither is holding 10,000 exactly; fewer than the lower bound is (issue 36)
    (10_000, 12_000, 0, None),
    (10_000, 10_000, 0, None),
    (10_000, 9_990, 3, "the portal lists at least 10000 datasets (its count is capped); we hold 9990 live and "
                       "this run brings 3 new: at least 7 more on the portal than this run explains"),
])
def test_a_count_that_is_not_exact_is_a_lower_bound(total, live, new, drift):
    assert count_drift(total, live, new, exact=False) == drift
    # taken as exact, the first would have said 2,000 were gone (the finding of issue 36)
    assert count_drift(10_000, 12_000, 0) == ("the portal lists 10000 datasets; we hold 12000 live and this run "
                                              "brings 0 new: 2000 fewer on the portal than this run explains")


@pytest.mark.parametrize("delta, text", [
    (timedelta(0), "0s"), (timedelta(seconds=40), "40s"), (timedelta(minutes=90), "1h 30m"),
    (timedelta(hours=2), "2h"), (timedelta(days=30, hours=2, minutes=5), "30d 2h")])
def test_format_duration(delta, text):
    assert format_duration(delta) == text


def test_claim_decides_who_writes_a_portal():
    from harvester.domain.run import Writer, claim

    now = datetime(2026, 1, 1, 12, tzinfo=timezone.utc)
    two_h = timedelta(hours=2)
    cli = Writer(7, None, now - timedelta(hours=3), now - timedelta(minutes=5))
    dag = Writer(8, "scheduled__2026-01-01", now - timedelta(hours=1), now - timedelta(minutes=1))
    assert claim(None, dag_run_id="x", takeover=False, stale_after=two_h, now=now).action == "proceed"
    assert claim(dag, dag_run_id="scheduled__2026-01-01", takeover=False, stale_after=two_h, now=now).action == "proceed"
    refused = claim(cli, dag_run_id="manual__1", takeover=False, stale_after=two_h, now=now, portal="gc")
    assert refused.action == "refuse"
    assert "gc is being harvested by run 7" in refused.reason and "the CLI (harvester harvest)" in refused.reason
    assert "last progress 5m ago" in refused.reason
    refused = claim(dag, dag_run_id=None, takeover=False, stale_after=two_h, now=now)
    assert "DAG run scheduled__2026-01-01" in refused.reason
    assert claim(dag, dag_run_id=None, takeover=True, stale_after=two_h, now=now).action == "takeover"
    dead = Writer(9, "scheduled__1", now - timedelta(hours=5), now - two_h)
    # A dead run is abandoned whether or not takeover was asked: nobody is aborted.
    for takeover in (False, True):
        decision = claim(dead, dag_run_id=None, takeover=takeover, stale_after=two_h, now=now)
        assert decision.action == "abandon" and "no progress for 2h" in decision.reason
    assert claim(dead, dag_run_id=None, takeover=False, stale_after=timedelta(hours=3), now=now).action == "refuse"
