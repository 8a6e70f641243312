"""sync_runs and portal_sync_status: a run's lifecycle and the portal's watermark.

One run writes a portal at a time (run.claim decides; the advisory lock on the portal's URL
orders the deciding). A failed run of an Airflow DAG run keeps its staging (``resumable``) so
that clearing the failed task in Airflow resumes it; the portal's next run supersedes it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg.types.json import Jsonb

from harvester.domain.run import DEFAULT_STALE_AFTER, BackfillRun, Writer, claim, complete_stats
from harvester.store import vectors


class RunInProgress(RuntimeError):
    """Another run holds the portal; the message names it (and its DAG run) and what to do."""

    transient = True


class NotResumable(RuntimeError):
    """A cleared task's run cannot continue (committed, superseded, abandoned); the message says why."""

    transient = False


class RunMismatch(NotResumable):
    """A task was handed a run that is not its portal's or its DAG run's (or that its database does
    not hold): its worker reaches another database than the one begin used."""


class AttemptSuperseded(RuntimeError):
    """A later attempt of this task took the run's staging over (sql/024): this one, a process that
    outlived its Airflow supervisor, stops without writing. Terminal: its retry is already running."""

    transient = False


def claim_staging(conn, run_id: int):
    """Make this attempt of a staging step (fetch_modified, reconcile) the run's only writer of
    staging, and return its token for staging_page. Waits for a page an earlier attempt is writing
    (at most the session's lock_timeout); that attempt's next page finds the new token and stops."""
    row = conn.execute("UPDATE sync_runs SET staging_attempt = gen_random_uuid() WHERE run_id = %s"
                       " RETURNING staging_attempt", (run_id,)).fetchone()
    if row is None:
        raise LookupError(f"no run with run_id {run_id}")
    return row[0]


@contextlib.contextmanager
def staging_page(conn, run_id: int, attempt):
    """A transaction in which this attempt writes one page of staging, if the run is still its
    (claim_staging); AttemptSuperseded otherwise. The run's row is share-locked to the end of the
    page, so a newer attempt's claim cannot come between the check and the write."""
    with conn.transaction():
        row = conn.execute("SELECT staging_attempt FROM sync_runs WHERE run_id = %s FOR SHARE", (run_id,)).fetchone()
        if row is None or row[0] != attempt:
            raise AttemptSuperseded(
                f"run {run_id}: a later attempt of this task took over its staging (this process outlived its "
                "Airflow supervisor, and the task was retried meanwhile); this attempt stops without writing more")
        yield


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
    heartbeat_at: datetime | None = None
    resumable: bool = False
    error: str | None = None

    @property
    def lists_whole_portal(self) -> bool:
        """A full sync or a reconciliation: the run knows every dataset the portal lists."""
        return self.mode == "full" or self.reconcile_reason is not None


_COLUMNS = ("run_id, portal_url, portal_name, dag_run_id, mode, status, since, started_at, stats, reconcile_reason,"
            " heartbeat_at, resumable, error")


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


def lock_portal(conn, portal_url: str) -> None:
    """Take the portal's lock until the caller's transaction ends: opening or resuming a run and
    an upsert's merge of the portal's datasets take it, so none of them runs under another."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (portal_url,))


def _take_portal(conn, portal_url: str, portal: str, *, dag_run_id: str | None, takeover: bool,
                stale_after: timedelta) -> None:
    """Inside the caller's transaction, under the portal's lock: make sure no other run holds the
    portal, abandoning a dead one or aborting one on request (takeover); else RunInProgress."""
    row = conn.execute("SELECT run_id, dag_run_id, started_at, heartbeat_at, now() FROM sync_runs"
                       " WHERE portal_url = %s AND status = 'running'", (portal_url,)).fetchone()
    holder = Writer(*row[:4]) if row else None
    decision = claim(holder, dag_run_id=dag_run_id, takeover=takeover, stale_after=stale_after,
                     now=row[4] if row else datetime.now().astimezone(), portal=portal)
    if decision.action == "refuse":
        raise RunInProgress(decision.reason)
    if decision.action in ("abandon", "takeover"):
        status = "abandoned" if decision.action == "abandon" else "cancelled"
        by = f"DAG run {dag_run_id}" if dag_run_id else "the CLI"
        conn.execute("UPDATE sync_runs SET status = %s, finished_at = now(), resumable = false, error = %s"
                     " WHERE run_id = %s", (status, f"{status}: {decision.reason}; a new run by {by} went ahead",
                                           holder.run_id))
        _drop_staging(conn, [holder.run_id])


def _supersede(conn, portal_url: str, run_id: int) -> None:
    """A new run of the portal started: failed runs kept for resuming can no longer be resumed."""
    old = conn.execute(
        "UPDATE sync_runs SET resumable = false, error = coalesce(error, '') || %s"
        " WHERE portal_url = %s AND resumable AND run_id <> %s RETURNING run_id",
        (f" (superseded by run {run_id}: its staging is gone)", portal_url, run_id)).fetchall()
    if old:
        _drop_staging(conn, [r[0] for r in old])


def start(conn, *, portal_url: str, portal_name: str, dag_run_id: str | None, mode: str,
          since: datetime | None, reconcile_reason: str | None = None, takeover: bool = False,
          stale_after: timedelta = DEFAULT_STALE_AFTER) -> RunRow:
    """Open a run. A retry of the same DAG run reuses its running row, and a DAG run cleared after
    its run failed reopens that run (same run id, its staging intact) with this plan. Another
    running run of the portal makes this RunInProgress, unless it is stale (abandoned) or
    ``takeover`` aborts it. Failed runs kept for resuming are superseded."""
    with conn.transaction():
        lock_portal(conn, portal_url)
        own = None
        if dag_run_id is not None:
            own = conn.execute(
                f"SELECT {_COLUMNS} FROM sync_runs WHERE portal_url = %s AND dag_run_id = %s"
                f" AND (status = 'running' OR resumable) ORDER BY run_id DESC LIMIT 1",
                (portal_url, dag_run_id)).fetchone()
            if own and own[5] == "running":
                return RunRow(*own)
        _take_portal(conn, portal_url, portal_name, dag_run_id=dag_run_id, takeover=takeover, stale_after=stale_after)
        if own:
            row = conn.execute(
                f"UPDATE sync_runs SET status = 'running', finished_at = NULL, error = NULL, resumable = false,"
                f" heartbeat_at = now(), mode = %s, since = %s, reconcile_reason = %s WHERE run_id = %s"
                f" RETURNING {_COLUMNS}", (mode, since, reconcile_reason, own[0])).fetchone()
        else:
            row = conn.execute(
                f"INSERT INTO sync_runs (portal_url, portal_name, dag_run_id, mode, status, since, reconcile_reason)"
                f" VALUES (%s, %s, %s, %s, 'running', %s, %s) RETURNING {_COLUMNS}",
                (portal_url, portal_name, dag_run_id, mode, since, reconcile_reason)).fetchone()
        _supersede(conn, portal_url, row[0])
    return RunRow(*row)


def resume(conn, run_id: int, dag_run_id: str | None, *, takeover: bool = False,
           stale_after: timedelta = DEFAULT_STALE_AFTER) -> RunRow:
    """A task of ``dag_run_id`` is about to work on ``run_id``. A running or committed run is
    returned as it is. A failed or cancelled run of this DAG run that kept its staging (the user
    cleared the failed task in Airflow) is reopened. Anything else is NotResumable, saying why."""
    with conn.transaction():
        run = get(conn, run_id)
        if run.status in ("running", "committed"):
            return run
        lock_portal(conn, run.portal_url)
        run = get(conn, run_id)
        if not run.resumable or run.dag_run_id is None or run.dag_run_id != dag_run_id:
            why = (f"it belongs to {'DAG run ' + run.dag_run_id if run.dag_run_id else 'a CLI run'}"
                   if run.dag_run_id != dag_run_id else "its staging is gone")
            raise NotResumable(
                f"run {run_id} of {run.portal_name} is {run.status} and cannot be resumed ({why}; "
                f"{run.error or 'no error recorded'}). Clear the whole DAG run (begin starts a new run from "
                f"the watermark) or trigger a new one.")
        _take_portal(conn, run.portal_url, run.portal_name, dag_run_id=dag_run_id, takeover=takeover,
                     stale_after=stale_after)
        row = conn.execute(
            f"UPDATE sync_runs SET status = 'running', finished_at = NULL, error = NULL, resumable = false,"
            f" heartbeat_at = now() WHERE run_id = %s RETURNING {_COLUMNS}", (run_id,)).fetchone()
    return RunRow(*row)


def touch(conn, run_id: int) -> None:
    """A sign of life: the run is making progress (see stale_after)."""
    conn.execute("UPDATE sync_runs SET heartbeat_at = now() WHERE run_id = %s AND status = 'running'", (run_id,))


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
    """The run, which must be running (a step starting is a sign of life)."""
    run = get(conn, run_id)
    if run.status != "running":
        raise NotResumable(f"run {run_id} of {run.portal_name} is {run.status}, not running"
                           f"{' (' + run.error + ')' if run.error else ''}: start a new run")
    touch(conn, run_id)
    return run


def set_mode(conn, run_id: int, mode: str, since: datetime | None) -> None:
    conn.execute("UPDATE sync_runs SET mode = %s, since = %s WHERE run_id = %s", (mode, since, run_id))


def set_reconcile(conn, run_id: int, reason: str) -> None:
    """The run reconciles after all (the portal's count disagreed with ours)."""
    conn.execute("UPDATE sync_runs SET reconcile_reason = %s WHERE run_id = %s", (reason, run_id))


def _drop_staging(conn, run_ids: list[int]) -> None:
    for table in ("staging_records", "staging_changes", "staging_listing", "staging_deleted"):
        conn.execute(f"DELETE FROM {table} WHERE run_id = ANY(%s)", (run_ids,))


def source_validators(conn, portal_url: str) -> dict | None:
    """What the portal's catalogue said identifies it (ETag, Last-Modified) at the last committed run."""
    row = conn.execute("SELECT source_validators FROM portal_sync_status WHERE portal_url = %s",
                       (portal_url,)).fetchone()
    return row[0] if row else None


def set_source_validators(conn, run_id: int, validators: dict) -> None:
    """The validators of what this run read; the portal's status takes them when the run commits."""
    conn.execute("UPDATE sync_runs SET source_validators = %s WHERE run_id = %s", (Jsonb(validators), run_id))


def add_stats(conn, run_id: int, stats: dict) -> None:
    """Merge a step's counts into the run's stats (a step's retry overwrites its own keys)."""
    conn.execute("UPDATE sync_runs SET stats = stats || %s, heartbeat_at = now() WHERE run_id = %s",
                 (Jsonb(stats), run_id))


def add_counts(conn, run_id: int, counts: dict[str, int]) -> None:
    """Add to the run's counters atomically (the row lock orders concurrent shards), so every
    provider call of every attempt of every shard is counted exactly once."""
    if not counts:
        return
    keys = sorted(counts)
    pairs = ", ".join(["%s::text, coalesce((stats->>%s)::bigint, 0) + %s"] * len(keys))
    params = [value for key in keys for value in (key, key, int(counts[key]))]
    conn.execute(f"UPDATE sync_runs SET stats = stats || jsonb_build_object({pairs}), heartbeat_at = now()"
                 f" WHERE run_id = %s",
                 (*params, run_id))


def commit(conn, run: RunRow, stats: dict, datasets_synced: int, listing_unusable: int | None = None,
           search_config: str | None = None) -> None:
    """Inside the caller's transaction: the run committed and the watermark moved to its start; a
    run that listed the whole portal also records when (and ``listing_unusable``: records it listed
    that cannot be used). ``search_config``: the text-search configuration the merge indexed the
    portal's datasets with, noted from the portal's first commit on (without it, the second run
    found none noted and looked at every dataset of the portal for one indexed otherwise: 0.8 s
    at 1,000,000, issue 40)."""
    conn.execute("UPDATE sync_runs SET status = 'committed', finished_at = now(), stats = %s WHERE run_id = %s",
                 (Jsonb(complete_stats(stats)), run.run_id))
    whole = run.lists_whole_portal
    conn.execute(
        "INSERT INTO portal_sync_status AS p (portal_url, portal_name, last_successful_sync, last_sync_mode,"
        " sync_status, datasets_synced, last_full_sync, last_reconciliation, listing_unusable, updated_at,"
        " source_validators, search_config)"
        " VALUES (%(url)s, %(name)s, %(start)s, %(mode)s, 'completed', %(synced)s, %(full)s, %(whole)s,"
        " coalesce(%(unusable)s, 0), now(), (SELECT r.source_validators FROM sync_runs r WHERE r.run_id = %(run)s),"
        " %(config)s::regconfig)"
        " ON CONFLICT (portal_url) DO UPDATE SET portal_name = EXCLUDED.portal_name,"
        " last_successful_sync = EXCLUDED.last_successful_sync, last_sync_mode = EXCLUDED.last_sync_mode,"
        " sync_status = 'completed', datasets_synced = EXCLUDED.datasets_synced,"
        " last_full_sync = coalesce(EXCLUDED.last_full_sync, p.last_full_sync),"
        " last_reconciliation = coalesce(EXCLUDED.last_reconciliation, p.last_reconciliation),"
        " listing_unusable = coalesce(%(unusable)s, p.listing_unusable), updated_at = now(),"
        " source_validators = coalesce(EXCLUDED.source_validators, p.source_validators),"
        " search_config = coalesce(EXCLUDED.search_config, p.search_config)",
        {"url": run.portal_url, "name": run.portal_name, "start": run.started_at, "mode": run.mode, "run": run.run_id,
         "synced": datasets_synced, "full": run.started_at if run.mode == "full" else None,
         "whole": run.started_at if whole else None, "unusable": listing_unusable if whole else None,
         "config": search_config})


def abort(conn, run_id: int, status: str, error: str, *, resumable: bool = False) -> bool:
    """Mark a running run failed or cancelled; the watermark stays where it was. Its staging is
    dropped, unless ``resumable`` (a DAG run's failure: clearing the failed task resumes it) and
    the run belongs to a DAG run. False when the run was not running (already committed or aborted)."""
    if status not in ("failed", "cancelled"):
        raise ValueError(f"status {status!r} must be 'failed' or 'cancelled'")
    with conn.transaction():
        row = conn.execute(
            "UPDATE sync_runs SET status = %s, finished_at = now(), error = %s,"
            " resumable = %s AND dag_run_id IS NOT NULL"
            " WHERE run_id = %s AND status = 'running' RETURNING portal_url, portal_name, resumable",
            (status, error[:4000], resumable, run_id)).fetchone()
        if row is None:
            return False
        if not row[2]:
            _drop_staging(conn, [run_id])
        conn.execute(
            "INSERT INTO portal_sync_status AS p (portal_url, portal_name, sync_status, updated_at)"
            " VALUES (%s, %s, %s, now())"
            " ON CONFLICT (portal_url) DO UPDATE SET sync_status = EXCLUDED.sync_status, updated_at = now()",
            (row[0], row[1], status))
    return True


def last_of_dag_run(conn, portal_url: str, dag_run_id: str | None) -> RunRow | None:
    """The last run an Airflow DAG run opened for the portal, whatever its status (for notices)."""
    if dag_run_id is None:
        return None
    row = conn.execute(f"SELECT {_COLUMNS} FROM sync_runs WHERE portal_url = %s AND dag_run_id = %s"
                       f" ORDER BY run_id DESC LIMIT 1", (portal_url, dag_run_id)).fetchone()
    return RunRow(*row) if row else None


def require_own(conn, run_id: int, portal_url: str, dag_run_id: str | None) -> None:
    """RunMismatch unless run ``run_id`` (one query) is a run of ``portal_url`` and, for a task of a
    DAG run, that DAG run's: a worker whose harvester_db reaches another database than begin's
    would otherwise work on some other portal's run, or find none."""
    row = conn.execute("SELECT portal_url, portal_name, dag_run_id FROM sync_runs WHERE run_id = %s",
                       (run_id,)).fetchone()
    where = f"{conn.info.host or 'localhost'}:{conn.info.port}/{conn.info.dbname}"
    if row is None:
        what = f"run {run_id} is not in the harvester database {where}"
    elif row[0] != portal_url:
        what = (f"run {run_id} belongs to portal {row[1]} ({row[0]}), not to {portal_url} (in the harvester "
                f"database {where})")
    elif dag_run_id is not None and row[2] != dag_run_id:
        owner = f"DAG run {row[2]}" if row[2] else "a CLI run (harvester harvest)"
        what = f"run {run_id} of {row[1]} belongs to {owner}, not to DAG run {dag_run_id} (in the harvester database {where})"
    else:
        return
    raise RunMismatch(f"{what}: this worker probably reaches another database than the one begin used. The "
                      "Airflow connection harvester_db must point at the same database on every worker.")


# -- backfills: one full sync per backfill (run.cover_backfill) ---------------------------------------
def last_backfill_run(conn, portal_url: str) -> tuple[BackfillRun | None, datetime]:
    """The portal's newest run started by a backfill DAG run (None: none yet), and the database's now()."""
    row = conn.execute("SELECT run_id, dag_run_id, status, started_at, heartbeat_at, finished_at, now() FROM sync_runs"
                       " WHERE portal_url = %s AND backfill ORDER BY run_id DESC LIMIT 1", (portal_url,)).fetchone()
    if row is None:
        return None, datetime.now().astimezone()
    return BackfillRun(*row[:6]), row[6]


def mark_backfill(conn, run_id: int) -> None:
    """The run was started by a backfill DAG run: it may cover the backfill's other DAG runs."""
    conn.execute("UPDATE sync_runs SET backfill = true WHERE run_id = %s", (run_id,))


def note_covered(conn, run_id: int, dag_run_id: str) -> None:
    """Record that run ``run_id`` covered the backfill DAG run ``dag_run_id`` (sync_runs.covered_dag_runs)."""
    conn.execute("UPDATE sync_runs SET covered_dag_runs = array_append(covered_dag_runs, %s)"
                 " WHERE run_id = %s AND NOT %s = ANY(covered_dag_runs)", (dag_run_id, run_id, dag_run_id))


# -- reading, for the Harvester page in the Airflow UI ---------------------------------------------
RUN_COLUMNS = ("run_id", "portal_url", "portal_name", "dag_run_id", "mode", "status", "started_at", "finished_at",
               "reconcile_reason", "error", "stats")


def page_runs(conn, portal_url: str | None, *, limit: int = 50, offset: int = 0) -> tuple[list[dict], int]:
    """One page of the portal's runs (every portal's: None), newest first, and how many there are
    in all: the runs of the Harvester page and of `harvester runs`."""
    params = {"portal": portal_url, "limit": limit, "offset": offset}
    where = "" if portal_url is None else " WHERE portal_url = %(portal)s"
    rows = conn.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM sync_runs{where}"
                        " ORDER BY started_at DESC, run_id DESC LIMIT %(limit)s OFFSET %(offset)s", params).fetchall()
    total = conn.execute(f"SELECT count(*) FROM sync_runs{where}", params).fetchone()[0]
    return [dict(zip(RUN_COLUMNS, row)) for row in rows], int(total)


def run_item(conn, run_id: int) -> dict | None:
    """One run as page_runs lists it (RUN_COLUMNS), whatever its portal; None when there is none."""
    row = conn.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM sync_runs WHERE run_id = %s", (run_id,)).fetchone()
    return None if row is None else dict(zip(RUN_COLUMNS, row))


def overview(conn, portal_urls: list[str]) -> dict[str, dict]:
    """Per portal URL, in one statement: its watermark row (``last_successful_sync``,
    ``last_sync_mode``, ``sync_status``), ``live_datasets``, ``pending_embeddings`` (live datasets
    whose current text has no vector linked yet) and ``last_run`` (its newest run, or None)."""
    rows = conn.execute(
        f"""
        WITH portals (url) AS (SELECT DISTINCT unnest(%(urls)s::text[])),
        counts AS (
            SELECT d.portal_url, count(*) AS live,
                   count(*) FILTER (WHERE d.embedded_content_hash IS DISTINCT FROM d.content_hash) AS pending
            FROM datasets d
            WHERE d.portal_url = ANY(%(urls)s) AND d.removed_at IS NULL
            GROUP BY d.portal_url
        )
        SELECT p.url, s.last_successful_sync, s.last_sync_mode, s.sync_status,
               coalesce(c.live, 0), coalesce(c.pending, 0), {', '.join('r.' + c for c in RUN_COLUMNS)}
        FROM portals p
        LEFT JOIN portal_sync_status s ON s.portal_url = p.url
        LEFT JOIN counts c ON c.portal_url = p.url
        LEFT JOIN LATERAL (
            SELECT * FROM sync_runs r WHERE r.portal_url = p.url ORDER BY r.started_at DESC, r.run_id DESC LIMIT 1
        ) r ON true
        """, {"urls": list(portal_urls)}).fetchall()
    out = {}
    for url, last_sync, last_mode, sync_status, live, pending, *run in rows:
        out[url] = {"last_successful_sync": last_sync, "last_sync_mode": last_mode, "sync_status": sync_status,
                    "live_datasets": int(live), "pending_embeddings": int(pending),
                    "last_run": dict(zip(RUN_COLUMNS, run)) if run[0] is not None else None}
    return out


def embedding_totals(conn, model: str) -> list[dict]:
    """Per portal with committed runs, in one statement, by portal name: ``runs`` (committed), the
    sums of their embedding counts (``embedding_requests``, ``embedded``, ``reused``,
    ``calls_saved``, ``tokens_saved``), its live ``datasets`` and how many of them have a vector of
    ``model`` for their current text (``with_vector``)."""
    keys = ("portal", "portal_url", "runs", "embedding_requests", "embedded", "reused", "calls_saved",
            "tokens_saved", "datasets", "with_vector")
    rows = conn.execute(
        """
        WITH r AS (
            SELECT portal_name, portal_url, count(*) AS runs,
                   sum((stats->>'embedding_requests')::bigint) AS requests, sum((stats->>'embedded')::bigint) AS embedded,
                   sum((stats->>'embeddings_reused')::bigint) AS reused,
                   sum(coalesce((stats->>'embedding_calls_saved')::bigint, 0)) AS calls,
                   sum(coalesce((stats->>'embedding_tokens_saved')::bigint, 0)) AS tokens
            FROM sync_runs WHERE status = 'committed' GROUP BY portal_name, portal_url
        ), live AS (
            SELECT d.portal_url, count(*) AS datasets, count(e.content_hash) AS with_vector
            FROM datasets d LEFT JOIN embeddings e ON e.content_hash = decode(d.content_hash, 'hex')
                                                  AND e.model = """ + vectors.MODEL_ID + """
            WHERE d.removed_at IS NULL AND d.portal_url IN (SELECT portal_url FROM r)
            GROUP BY d.portal_url
        )
        SELECT r.portal_name, r.portal_url, r.runs, r.requests, r.embedded, r.reused, r.calls, r.tokens,
               live.datasets, live.with_vector
        FROM r LEFT JOIN live ON live.portal_url = r.portal_url
        ORDER BY r.portal_name, r.portal_url
        """, {"model": model}).fetchall()
    return [{key: (value if i < 2 else int(value or 0)) for i, (key, value) in enumerate(zip(keys, row))}
            for row in rows]


# -- bulk loads of a model's vectors (store/vectors.py IndexSettings) ------------------------------
def set_bulk_model(conn, run_id: int, model: str | None) -> None:
    """The run bulk-loads ``model``: it has no index yet, and none is built while the run embeds."""
    conn.execute("UPDATE sync_runs SET bulk_model = %s WHERE run_id = %s", (model, run_id))


def bulk_loads_running(conn, model: str, *, besides: int | None = None) -> list[RunRow]:
    """The running runs (other than ``besides``) that bulk-load ``model``."""
    rows = conn.execute(f"SELECT {_COLUMNS} FROM sync_runs WHERE status = 'running' AND bulk_model = %s"
                        f" AND run_id IS DISTINCT FROM %s ORDER BY run_id", (model, besides)).fetchall()
    return [RunRow(*row) for row in rows]
