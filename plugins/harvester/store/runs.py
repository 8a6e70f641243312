"""sync_runs and portal_sync_status: a run's lifecycle and the portal's watermark."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg.types.json import Jsonb

from ..run import complete_stats


@dataclass(frozen=True)
class RunRow:
    run_id: int
    portal_url: str
    portal_name: str
    dag_run_id: str | None
    mode: str
    status: str
    since: datetime | None
    started_at: datetime
    stats: dict
    reconcile_reason: str | None = None

    @property
    def lists_whole_portal(self) -> bool:
        """A full sync or a reconciliation: the run knows every dataset the portal lists."""
        return self.mode == "full" or self.reconcile_reason is not None


_COLUMNS = "run_id, portal_url, portal_name, dag_run_id, mode, status, since, started_at, stats, reconcile_reason"


@dataclass(frozen=True)
class PortalStatus:
    """What a run's plan needs of the portal's past: the watermark and when it was last listed whole."""

    watermark: datetime | None = None
    last_full_sync: datetime | None = None
    last_reconciliation: datetime | None = None
    listing_unusable: int = 0


def watermark(conn, portal_url: str) -> datetime | None:
    return status(conn, portal_url).watermark


def status(conn, portal_url: str) -> PortalStatus:
    row = conn.execute("SELECT last_successful_sync, last_full_sync, last_reconciliation, listing_unusable"
                       " FROM portal_sync_status WHERE portal_url = %s", (portal_url,)).fetchone()
    return PortalStatus(*row) if row else PortalStatus()


def start(conn, *, portal_url: str, portal_name: str, dag_run_id: str | None, mode: str,
          since: datetime | None, reconcile_reason: str | None = None) -> RunRow:
    """Open a run. A retry of the same DAG run reuses its running row; any other running row of the
    portal is a run that died without a word (only one may run at a time) and is marked failed."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (portal_url,))
        if dag_run_id is not None:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM sync_runs WHERE portal_url = %s AND dag_run_id = %s AND status = 'running'",
                (portal_url, dag_run_id)).fetchone()
            if row:
                return RunRow(*row)
        stale = conn.execute(
            "UPDATE sync_runs SET status = 'failed', finished_at = now(),"
            " error = 'abandoned: a newer run of this portal started while this one was still marked running'"
            " WHERE portal_url = %s AND status = 'running' RETURNING run_id", (portal_url,)).fetchall()
        if stale:
            _drop_staging(conn, [r[0] for r in stale])
        row = conn.execute(
            f"INSERT INTO sync_runs (portal_url, portal_name, dag_run_id, mode, status, since, reconcile_reason)"
            f" VALUES (%s, %s, %s, %s, 'running', %s, %s) RETURNING {_COLUMNS}",
            (portal_url, portal_name, dag_run_id, mode, since, reconcile_reason)).fetchone()
    return RunRow(*row)


def get(conn, run_id: int) -> RunRow:
    row = conn.execute(f"SELECT {_COLUMNS} FROM sync_runs WHERE run_id = %s", (run_id,)).fetchone()
    if row is None:
        raise LookupError(f"no run with run_id {run_id}")
    return RunRow(*row)


def find_running(conn, portal_url: str, dag_run_id: str) -> int | None:
    row = conn.execute("SELECT run_id FROM sync_runs WHERE portal_url = %s AND dag_run_id = %s AND status = 'running'",
                       (portal_url, dag_run_id)).fetchone()
    return row[0] if row else None


def require_running(conn, run_id: int) -> RunRow:
    run = get(conn, run_id)
    if run.status != "running":
        raise RuntimeError(f"run {run_id} of {run.portal_url} is {run.status}, not running: start a new run")
    return run


def set_mode(conn, run_id: int, mode: str, since: datetime | None) -> None:
    conn.execute("UPDATE sync_runs SET mode = %s, since = %s WHERE run_id = %s", (mode, since, run_id))


def set_reconcile(conn, run_id: int, reason: str) -> None:
    """The run reconciles after all (the portal's count disagreed with ours)."""
    conn.execute("UPDATE sync_runs SET reconcile_reason = %s WHERE run_id = %s", (reason, run_id))


def _drop_staging(conn, run_ids: list[int]) -> None:
    for table in ("staging_records", "staging_changes", "staging_listing"):
        conn.execute(f"DELETE FROM {table} WHERE run_id = ANY(%s)", (run_ids,))


def add_stats(conn, run_id: int, stats: dict) -> None:
    """Merge a step's counts into the run's stats (a step's retry overwrites its own keys)."""
    conn.execute("UPDATE sync_runs SET stats = stats || %s WHERE run_id = %s", (Jsonb(stats), run_id))


def add_counts(conn, run_id: int, counts: dict[str, int]) -> None:
    """Add to the run's counters atomically (the row lock orders concurrent shards), so every
    provider call of every attempt of every shard is counted exactly once."""
    if not counts:
        return
    keys = sorted(counts)
    pairs = ", ".join(["%s::text, coalesce((stats->>%s)::bigint, 0) + %s"] * len(keys))
    params = [value for key in keys for value in (key, key, int(counts[key]))]
    conn.execute(f"UPDATE sync_runs SET stats = stats || jsonb_build_object({pairs}) WHERE run_id = %s",
                 (*params, run_id))


def commit(conn, run: RunRow, stats: dict, datasets_synced: int, listing_unusable: int | None = None) -> None:
    """Inside the caller's transaction: the run committed and the watermark moved to its start; a
    run that listed the whole portal also records when (and ``listing_unusable``: records it listed
    that cannot be used)."""
    conn.execute("UPDATE sync_runs SET status = 'committed', finished_at = now(), stats = %s WHERE run_id = %s",
                 (Jsonb(complete_stats(stats)), run.run_id))
    whole = run.lists_whole_portal
    conn.execute(
        "INSERT INTO portal_sync_status AS p (portal_url, portal_name, last_successful_sync, last_sync_mode,"
        " sync_status, datasets_synced, last_full_sync, last_reconciliation, listing_unusable, updated_at)"
        " VALUES (%(url)s, %(name)s, %(start)s, %(mode)s, 'completed', %(synced)s, %(full)s, %(whole)s,"
        " coalesce(%(unusable)s, 0), now())"
        " ON CONFLICT (portal_url) DO UPDATE SET portal_name = EXCLUDED.portal_name,"
        " last_successful_sync = EXCLUDED.last_successful_sync, last_sync_mode = EXCLUDED.last_sync_mode,"
        " sync_status = 'completed', datasets_synced = EXCLUDED.datasets_synced,"
        " last_full_sync = coalesce(EXCLUDED.last_full_sync, p.last_full_sync),"
        " last_reconciliation = coalesce(EXCLUDED.last_reconciliation, p.last_reconciliation),"
        " listing_unusable = coalesce(%(unusable)s, p.listing_unusable), updated_at = now()",
        {"url": run.portal_url, "name": run.portal_name, "start": run.started_at, "mode": run.mode,
         "synced": datasets_synced, "full": run.started_at if run.mode == "full" else None,
         "whole": run.started_at if whole else None, "unusable": listing_unusable if whole else None})


def abort(conn, run_id: int, status: str, error: str) -> bool:
    """Mark a running run failed or cancelled and drop its staging; the watermark stays where it was.
    False when the run was not running (already committed or aborted)."""
    if status not in ("failed", "cancelled"):
        raise ValueError(f"status {status!r} must be 'failed' or 'cancelled'")
    with conn.transaction():
        row = conn.execute(
            "UPDATE sync_runs SET status = %s, finished_at = now(), error = %s"
            " WHERE run_id = %s AND status = 'running' RETURNING portal_url, portal_name",
            (status, error[:4000], run_id)).fetchone()
        if row is None:
            return False
        _drop_staging(conn, [run_id])
        conn.execute(
            "INSERT INTO portal_sync_status AS p (portal_url, portal_name, sync_status, updated_at)"
            " VALUES (%s, %s, %s, now())"
            " ON CONFLICT (portal_url) DO UPDATE SET sync_status = EXCLUDED.sync_status, updated_at = now()",
            (row[0], row[1], status))
    return True
