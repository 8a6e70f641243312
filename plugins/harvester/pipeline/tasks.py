"""Airflow glue: what each task of a harvest_<portal> DAG does, given the running task's context.

The DAG file only wires these together; the work itself is in steps.py. XCom carries the run id
and counts, never dataset content. Heavy imports (psycopg, requests, models) happen inside the
tasks, so parsing the DAG file stays cheap. Every task body runs through ``_task``: a terminal
error fails the task on its first try, a transient one is retried (domain/errors.py).
"""
from __future__ import annotations

import contextlib
import functools
import logging

from harvester.config.portals import Portal
from harvester.domain.run import TaskSettings

log = logging.getLogger(__name__)


def _context():
    from airflow.sdk import get_current_context

    return get_current_context()


def _task(body):
    """What every task body runs through: the error decides whether the task is tried again
    (domain/errors.py). A terminal error (retrying meets the same one: bad configuration, missing
    credentials, a rejected key, a catalogue that is not one, a run that cannot resume) fails the
    task on its first try, with one message naming the cause and the portal, secrets scrubbed; the
    failure callbacks run as for any failure (Airflow calls on_failure_callback for an
    AirflowFailException: the run is marked failed, the DAG's callback notifies). A transient error
    is raised as it is, and Airflow retries the task (HARVESTER_TASK_RETRIES). Airflow's own
    exceptions (skip, reschedule, fail) pass through."""

    @functools.wraps(body)
    def run(portal: Portal, *args, **kwargs):
        try:
            return body(portal, *args, **kwargs)
        except Exception as exc:
            from airflow.sdk.exceptions import AirflowException

            from harvester.domain.errors import is_transient

            _failed_line(body.__name__, portal, _run_id_in(args, kwargs), exc)
            if isinstance(exc, AirflowException) or is_transient(exc):
                raise
            _fail(f"{_scrubbed(str(exc), portal)} (portal {portal.name}, {type(exc).__name__}: not retried, "
                  "trying again would fail the same way)")

    return run


def _run_id_in(args, kwargs) -> int | None:
    """The run id a task was handed (its XCom dict ``run`` / ``work``), None before begin made one."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, dict) and isinstance(value.get("run_id"), int):
            return value["run_id"]
    return None


def _failed_line(task: str, portal: Portal, run_id: int | None, exc: Exception) -> None:
    """A failed task's log ends, like a finished one's, with the run's page (its report so far):
    one line before Airflow's traceback. Airflow's own exceptions (skip, reschedule) are no failure."""
    from harvester.domain.errors import is_transient
    from harvester.pipeline import notify

    if run_id is None or type(exc).__name__ in ("AirflowSkipException", "AirflowRescheduleException"):
        return
    retried = "Airflow retries it if it has tries left" if is_transient(exc) else "not retried"
    log.error("%s: run %s of %s failed in this try (%s); the run's page: %s", task, run_id, portal.name,
              retried, notify.report_url(run_id))


def _fail(message: str):
    """Fail the task now, without retries, with this message (its callbacks still run)."""
    from airflow.sdk.exceptions import AirflowFailException

    raise AirflowFailException(message) from None


def _scrubbed(text: str, portal: Portal) -> str:
    """The text without secrets: URLs redacted (config/secrets.py), the portal's URL password, and
    what Airflow's secrets masker holds (connection passwords, the API tokens registered with it)."""
    from harvester.config.secrets import redact_text

    text = redact_text(text)
    password = portal.credentials[1] if portal.credentials else ""
    if len(password) >= 5:  # (shorter ones would hide ordinary words; Airflow's masker skips them too)
        text = text.replace(password, "***")
    try:
        from airflow.sdk._shared.secrets_masker import redact

        text = str(redact(text))
    except Exception:  # noqa: BLE001  a second line of defence; the errors' own messages show no secret
        log.debug("could not pass the failure message through Airflow's secrets masker")
    return text


@contextlib.contextmanager
def _connection(migrate: bool = True, role: str = ""):
    """A connection to harvester_db, named in pg_stat_activity after the task and its process
    (``harvester <dag_id>.<task_id> pid=<pid>``, plus `` <role>``: the upsert's index build). Every
    task applies pending migrations (a deploy while runs are in flight: whichever task comes first;
    migrations.py). A configuration error (harvester_db malformed, or undefined while
    HARVESTER_EMBEDDED_DB=off or on a distributed executor) and a pgvector that cannot run are
    terminal: the task fails without retries (``_task``); a secrets backend or database that did
    not answer is transient: retried (store/db.py), and so is a statement that waited longer than
    HARVESTER_LOCK_TIMEOUT_SECS for a lock (db.LockWaitTimeout, saying so)."""
    import os

    import psycopg

    from harvester.pipeline import memory
    from harvester.store import db

    if not _open_connections:  # a step begins: before it starts any thread (memory.py)
        memory.cap_arenas()
    name = f"harvester {_task_name()} pid={os.getpid()}{' ' + role if role else ''}"
    try:
        conn = db.open_task(migrate=migrate, application_name=name)
    except psycopg.errors.LockNotAvailable as exc:
        raise db.lock_wait_error(exc, "applying migrations") from None
    _open_connections.append(conn)
    try:
        yield conn
    except psycopg.errors.LockNotAvailable as exc:
        raise db.lock_wait_error(exc, _task_name()) from None
    finally:
        conn.close()
        _open_connections.remove(conn)
        if not _open_connections:  # once a step, as its last connection closes (some steps hold two)
            _release_memory()


def _task_name() -> str:
    """``<dag_id>.<task_id>`` of the running task ("" outside one)."""
    try:
        ti = _context()["ti"]
        return f"{ti.dag_id}.{ti.task_id}"
    except Exception:  # no task context (a callback of a finished task, a plain call)
        return ""


_open_connections: list = []  # of the task running in this process (tasks run one at a time)
_memory: dict = {}  # the process's size after its last step (MB): the task's summary table shows it


def _release_memory() -> None:
    """What the step freed goes back to the system before the next step of this process (memory.py);
    the task's summary table says how large the process got."""
    from harvester.pipeline import memory

    before, after = memory.release()
    _memory.update(resident=after, before=before, peak=max(memory.peak_rss_mb(), before, after))
    log.debug("memory: %.0f MB resident, %.0f MB before handing back what the step freed; peak %.0f MB",
              after, before, _memory["peak"])


# -- what each task's log says first and last (issue 38, finding 7) --------------------------------
# A task's log opens with one line saying what the task will do, and ends with a short table of what
# it did (domain/tasklog.py: aligned, each row short enough for Airflow's log viewer), whose last
# row links to the run's page on the Harvester page. Progress lines of long steps come in between.
def _intent(text: str) -> float:
    """Log the task's first line (what it will do); returns when the task began (time.monotonic())."""
    import time

    log.info("%s", text)
    return time.monotonic()


def _summary(title: str, started: float, run_id: int | None, rows) -> None:
    """Log the task's last lines: ``title`` with how long it took, ``rows`` (label, value) aligned,
    the process's memory, and the run's page (pipeline/notify.py: under Airflow's [api] base_url)."""
    import time

    from harvester.domain import tasklog
    from harvester.pipeline import notify

    rows = [row for row in rows if row is not None]
    if _memory:
        rows.append(("memory", f"{_memory['resident']:.0f} MB resident, peak {_memory['peak']:.0f} MB"))
    if run_id is not None:
        rows.append(("run page", notify.report_url(run_id)))
    for line in tasklog.table(f"{title}, in {tasklog.duration(time.monotonic() - started)}:", rows):
        log.info("%s", line)


def _traffic(source) -> tuple:
    from harvester.domain import tasklog

    return (("portal requests", source.requests_made), ("received", tasklog.size(source.bytes_received)))


def _optional(label: str, value):
    """A row only when it has something to say (a count other than 0)."""
    return (label, value) if value else None


def _is_backfill(dag_run) -> bool:
    run_type = getattr(dag_run, "run_type", None)
    return str(getattr(run_type, "value", run_type)) == "backfill"


@_task
def begin(portal: Portal, settings: TaskSettings | None = None):
    """The poke of the begin sensor (reschedule mode): opens the run and is done, returning what the
    other tasks work on (``{"run_id", "mode"}``). While another run holds the portal it logs that run
    and is not done: Airflow checks again after ``busy_poll``, the task holding no worker slot in
    between, and fails naming the run once it waited ``busy_wait``. ``takeover`` aborts that run
    instead. A backfill DAG run that another backfill DAG run's full sync covers (run.cover_backfill)
    is done at once with ``{"run_id": <that run>, "covered": true, ...}``: its other tasks skip."""
    from airflow.sdk import PokeReturnValue

    from harvester.pipeline import steps as pipeline
    from harvester.config.secrets import redact_url
    from harvester.domain.run import format_duration
    from harvester.store import runs

    settings = settings or TaskSettings()
    ctx = _context()
    dag_run = ctx["dag_run"]
    params = ctx["params"]
    takeover = bool(params.get("takeover"))
    backfill = _is_backfill(dag_run)
    asked = [what for what, on in (("a full sync", params.get("full_sync")),
                                   ("a reconciliation", params.get("reconcile")),
                                   ("taking over a run in progress", takeover)) if on]
    started = _intent(f"begin: opens a harvest run of {portal.name} ({portal.type} portal {redact_url(portal.url)}): "
                      + (f"{' and '.join(asked)}, as requested" if asked else
                         "full or incremental, as its watermark says")
                      + ("; a backfill DAG run" if backfill else "") + "; waits while another run holds the portal")
    try:
        with _connection(migrate=True) as conn:  # once per poke, under migrate's advisory lock
            if backfill:
                covered = _covered(conn, portal, dag_run.run_id, takeover, settings)
                if covered is not None:
                    _summary(f"begin: covered by run {covered['run_id']}", started, covered["run_id"],
                             [("covered by", f"run {covered['run_id']} (DAG run {covered['covered_by']})"),
                              ("other tasks", "skipped")])
                    return PokeReturnValue(True, xcom_value=covered)
            run = pipeline.begin(conn, portal, dag_run_id=dag_run.run_id, full_sync=bool(params.get("full_sync")),
                                 backfill=backfill, reconcile=bool(params.get("reconcile")), takeover=takeover)
            if backfill:
                runs.mark_backfill(conn, run["run_id"])
    except runs.RunInProgress as exc:
        waited = _waited(ctx)
        if waited >= settings.busy_wait:
            _fail(f"{exc} Gave up after waiting {format_duration(waited)} for it (HARVESTER_BUSY_WAIT_SECS "
                       f"{int(settings.busy_wait.total_seconds())}).")
        log.info("%s Waiting for it: checked again in %s, without holding a worker slot (waited %s of at most %s, "
                 "HARVESTER_BUSY_WAIT_SECS).", exc, format_duration(settings.busy_poll), format_duration(waited),
                 format_duration(settings.busy_wait))
        return PokeReturnValue(False)
    reason, reconciles = run.pop("reason", None), run.pop("reconciles", None)  # (XCom: the run id and mode)
    _summary(f"begin: run {run['run_id']} of {portal.name} opened", started, run["run_id"],
             [("mode", run["mode"]), ("why", reason), ("reconciles", reconciles or "no")])
    return PokeReturnValue(True, xcom_value=run)


def _waited(ctx):
    """How long the begin sensor has been waiting: since its first poke (Airflow's first reschedule)."""
    from datetime import datetime, timedelta, timezone

    first = ctx["ti"].get_first_reschedule_date(ctx)
    return datetime.now(timezone.utc) - first if first is not None else timedelta(0)


def _covered(conn, portal: Portal, dag_run_id: str, takeover: bool, settings: TaskSettings) -> dict | None:
    """A backfill DAG run: None when it syncs the portal itself; what it hands its tasks when another
    backfill DAG run's full sync covers it (recorded in that run's covered_dag_runs); RunInProgress
    while that full sync is under way (begin waits for it)."""
    from harvester.domain.run import cover_backfill
    from harvester.store import runs

    last, now = runs.last_backfill_run(conn, portal.url)
    cover = cover_backfill(last, dag_run_id=dag_run_id, takeover=takeover, window=settings.backfill_cover,
                           stale_after=portal.stale_after, now=now, portal=portal.name)
    if cover.action == "wait":
        raise runs.RunInProgress(cover.reason)
    if cover.action == "run":
        log.info("backfill DAG run %s: %s", dag_run_id, cover.reason)
        return None
    runs.note_covered(conn, last.run_id, dag_run_id)
    log.info("backfill DAG run %s is covered by run %s (DAG run %s): %s; its other tasks skip",
             dag_run_id, last.run_id, last.dag_run_id, cover.reason)
    return {"run_id": last.run_id, "covered": True, "covered_by": last.dag_run_id}


def _skip_if_covered(run: dict) -> None:
    """A backfill DAG run covered by another's full sync (begin said which): nothing to do, and
    nothing touched; skipped, so upsert emits no Asset event and sends no notice again."""
    if run.get("covered"):
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(f"this backfill DAG run is covered by run {run['run_id']} (DAG run "
                                   f"{run.get('covered_by')}), which synced the portal in full: nothing to do")


def _resume(conn, portal: Portal, run: dict) -> None:
    """Before each step: the run must be this portal's and this DAG run's (else this worker reaches
    another database than begin's); a run that failed is reopened when the user cleared its failed
    task (or the whole DAG run); a run that cannot continue (runs.NotResumable, terminal) fails the
    task at once, saying why."""
    from harvester.pipeline import steps as pipeline
    from harvester.store import runs

    ctx = _context()
    runs.require_own(conn, run["run_id"], portal.url, ctx["dag_run"].run_id)
    pipeline.resume(conn, portal, run["run_id"], ctx["dag_run"].run_id, takeover=bool(ctx["params"].get("takeover")))


@_task
def fetch_modified(portal: Portal, run: dict) -> dict:
    from harvester.pipeline import steps as pipeline
    from harvester.store import runs

    run_id = run["run_id"]
    whole = run.get("mode") == "full" or not pipeline.CAPABILITIES[portal.type].incremental
    which = "every dataset" if whole else "the datasets modified since the last run"
    started = _intent(f"fetch_modified: lists {which} of {portal.name} into run {run_id}'s staging, page by page")
    _skip_if_covered(run)
    source = pipeline.source_for(portal)
    with _connection() as conn:
        _resume(conn, portal, run)
        out = pipeline.fetch_modified(conn, portal, run_id, source)
        mode = runs.get(conn, run_id).mode
    _summary(f"fetch_modified: run {run_id} of {portal.name} staged {out['fetched']:,} records", started, run_id,
             [("fetched", out["fetched"]), ("failed", out["failed"]), ("run mode", mode), *_traffic(source)])
    return out


@_task
def reconcile(portal: Portal, run: dict) -> dict:
    """Checks the portal's count (one request) and, when due, asked or the counts disagree,
    reconciles: every identifier listed and compared, what we lack or hold stale fetched."""
    from harvester.pipeline import steps as pipeline
    from harvester.store import runs

    run_id = run["run_id"]
    started = _intent(f"reconcile: checks that run {run_id} ends with an exact copy of {portal.name}: compares the "
                      "portal's count with ours, lists every id if needed")
    _skip_if_covered(run)
    source = pipeline.source_for(portal)
    with _connection() as conn:
        _resume(conn, portal, run)
        out = pipeline.reconcile(conn, portal, run_id, source)
        done = runs.get(conn, run_id)
    count = done.stats.get("portal_count")
    rows = [None if count is None else
            ("portal count", f"at least {count:,}" if done.stats.get("portal_count_capped") else count),
            ("reconciled", "yes" if out.get("reconciled") else
             "no: a full sync lists the whole portal" if done.mode == "full" else "no")]
    if out.get("reconciled"):
        rows += [("ids listed", out.get("reconcile_listed", 0)), ("missing", out.get("reconcile_missing", 0)),
                 ("stale", out.get("reconcile_stale", 0)), ("fetched", out.get("reconcile_fetched", 0)),
                 _optional("without an id", out.get("reconcile_unusable", 0))]
    if source.requests_made:
        rows += _traffic(source)
    _summary(f"reconcile: run {run_id} of {portal.name}", started, run_id, rows)
    return out


def _provider():
    """The configured provider (a configuration problem is a TerminalEmbeddingError: no retries)."""
    from harvester.embeddings import get_provider

    return get_provider()


@_task
def hash_compare(portal: Portal, run: dict) -> list[dict]:
    """Classifies the run's records; returns the shards (run id, shard, counts) embed_changed maps over."""
    from harvester.pipeline import steps as pipeline

    run_id = run["run_id"]
    started = _intent(f"hash_compare: classifies run {run_id}'s staged records of {portal.name} (created, updated, "
                      "unchanged, failed), works out their changes, plans the embedding")
    _skip_if_covered(run)
    with _connection() as conn, _connection() as reader:
        _resume(conn, portal, run)
        out = pipeline.hash_compare(conn, reader, portal, run_id, model=_provider().model)
    _summary(f"hash_compare: run {run_id} of {portal.name}", started, run_id, [
        ("created", out.get("created", 0)), ("updated", out.get("updated", 0)),
        _optional("reidentified", out.get("reidentified", 0)), ("unchanged", out.get("unchanged", 0)),
        ("failed", out.get("failed", 0)), ("to review", out.get("review", 0)),
        ("texts to embed", out.get("pending_texts", 0)), ("embed tasks", len(out.get("embed_shards", ()))),
        ("bulk load", "yes: the index is built by upsert") if out.get("bulk_index") else None,
        _optional("record errors", out.get("record_errors", 0)),
        _optional("record warnings", out.get("record_warnings", 0))])
    counts = {k: v for k, v in out.items() if k != "embed_shards"}
    return [{**counts, **work} for work in out["embed_shards"]]


@_task
def embed_changed(portal: Portal, work: dict) -> dict:
    """One shard of the run's pending texts (the DAG maps this task over hash_compare's shards)."""
    from harvester.pipeline import steps as pipeline

    run_id, shard, shards = work["run_id"], work["shard"], work["shards"]
    planned = work.get("pending_texts")
    started = _intent(f"embed_changed: embeds shard {shard + 1} of {shards} of the texts of {portal.name} without a "
                      f"vector (run {run_id}" + (f": {planned:,} to embed in all)" if planned is not None else ")"))
    _skip_if_covered(work)
    provider = _provider()
    with _connection() as conn, _connection() as reader:
        _resume(conn, portal, work)
        out = pipeline.embed_changed(conn, reader, portal, run_id, provider, shard=shard, shards=shards,
                                     bulk_index=bool(work.get("bulk_index")),
                                     # what hash_compare counted (a provider changed in between
                                     # leaves its texts pending for the next run, as a breaker would)
                                     planned=planned)
    _summary(f"embed_changed: shard {shard + 1}/{shards} of run {run_id} of {portal.name}", started, run_id, [
        ("model", f"{provider.model} ({provider.name})"), ("embedded", out.get("embedded", 0)),
        ("requests", out.get("embedding_requests", 0)),
        _optional("from other runs", out.get("embeddings_awaited", 0)),
        _optional("refused", out.get("embeddings_refused", 0)),
        _optional("held back", out.get("embeddings_held_back", 0)),
        ("left pending", out.get("left_pending", 0))])
    return out


def asset_uri(portal: Portal) -> str:
    return f"harvester://{portal.name}/datasets"


# What the Asset event's extra carries besides the run id: what changed, what needs review, and
# what the run left undone (embeddings skipped while the breaker was open, removals withheld).
ASSET_EXTRA_KEYS = ("created", "updated", "removed", "review", "skipped", "removals_withheld")


def _deadline(ctx) -> float | None:
    """The time.monotonic() by which the running task must be done waiting: its execution_timeout
    counted from its start, less a tenth of it (at most a minute); None without one."""
    import time
    from datetime import datetime, timezone

    try:
        ti = ctx["ti"]
        timeout, started = ti.task.execution_timeout, ti.start_date
    except (KeyError, AttributeError):
        return None
    if not timeout or started is None:
        return None
    total = timeout.total_seconds()
    left = total - (datetime.now(timezone.utc) - started).total_seconds() - min(60.0, total / 10)
    return time.monotonic() + max(0.0, left)


@_task
def upsert(portal: Portal, run: dict) -> dict:
    """Commits the run, then tells downstream DAGs what changed through an Asset event, and the
    portal's notify targets when the run is degraded or needs review."""
    from harvester.pipeline import steps as pipeline

    run_id = run["run_id"]
    started = _intent(f"upsert: commits run {run_id} of {portal.name} in one transaction (datasets, versions, changes, "
                      "removals) and moves the watermark")
    _skip_if_covered(run)
    ctx = _context()
    provider = _provider()
    with _connection() as conn:
        _resume(conn, portal, run)
        stats = pipeline.upsert(conn, portal, run["run_id"], provider.model, provider.max_batch,
                                force_removals=bool(ctx["params"].get("force_removals")),
                                open_connection=lambda: _connection(role="build"), wait_deadline=_deadline(ctx))
        reasons = pipeline.outcomes.by_code(conn, run["run_id"]) if portal.notify else {}
    events = ctx.get("outlet_events")
    if events is not None:
        from airflow.sdk import Asset

        events[Asset(asset_uri(portal))].extra = {
            "run_id": stats["run_id"], **{k: stats.get(k, 0) for k in ASSET_EXTRA_KEYS}}
    if portal.notify:
        from harvester.pipeline import notify

        notify.announce(portal, notify.commit_outcomes(stats), ctx, run_id=stats["run_id"], stats=stats,
                        reasons=reasons)
    _summary(f"upsert: run {run_id} of {portal.name} committed", started, run_id, _upsert_rows(stats))
    return stats


def _upsert_rows(stats: dict) -> list:
    """The upsert's table: what users see changed, what the run left undone, what it cost."""
    get = lambda key: int(stats.get(key) or 0)  # noqa: E731
    return [("fetched", get("fetched")), ("created", get("created")), ("updated", get("updated")),
            ("unchanged", get("unchanged")), ("removed", get("removed")), ("failed", get("failed")),
            _optional("reidentified", get("reidentified")), ("to review", get("review")),
            ("versions", get("versions")), ("embedded", get("embedded")),
            _optional("vectors reused", get("embeddings_reused")),
            _optional("no vector yet", get("skipped")),
            _optional("removals withheld", get("removals_withheld")),
            _optional("reconciled: fetched", get("reconcile_fetched"))]


def _abort(portal: Portal, context, status: str) -> None:
    dag_run = context.get("dag_run")
    if dag_run is None:
        return
    exc = context.get("exception")
    reason = context.get("reason")
    error = f"{type(exc).__name__}: {exc}" if exc else f"DAG run {dag_run.run_id} ended: {reason or status}"
    from harvester.pipeline import steps as pipeline

    try:
        with _connection() as conn:
            run_id = pipeline.runs.find_running(conn, portal.url, dag_run.run_id)
            if run_id is not None:
                pipeline.abort(conn, run_id, error, status, resumable=True)
    except Exception:  # a callback must never mask the original failure
        log.exception("could not mark the run of %s as %s", portal.name, status)


def on_task_failure(portal: Portal):
    """Task callback: the task failed for good (retries spent): the run fails; its staging stays
    until the portal's next run, so clearing the failed task in Airflow resumes it."""
    return lambda context: _abort(portal, context, "failed")


def on_dag_failure(portal: Portal):
    """DAG callback: the run failed or timed out (dagrun_timeout counts as cancelled)."""
    def callback(context):
        status = "cancelled" if str(context.get("reason") or "").startswith("timed_out") else "failed"
        _abort(portal, context, status)
        _announce_failure(portal, context)
    return callback


def _announce_failure(portal: Portal, context) -> None:
    """Tells the portal's notify targets that the DAG run failed, with the run's counts and error
    when they can be read; never raises."""
    if not portal.notify:
        return
    from harvester.pipeline import notify
    from harvester.store import outcomes, runs

    dag_run_id = getattr(context.get("dag_run"), "run_id", None) or context.get("run_id")
    run, reasons = None, {}
    try:
        with _connection() as conn:
            run = runs.last_of_dag_run(conn, portal.url, dag_run_id)
            if run is not None:
                reasons = outcomes.by_code(conn, run.run_id)
    except Exception as exc:  # the database may be why it failed: announce without the run's details
        log.warning("could not read the run of %s for its failure notice: %s", portal.name, type(exc).__name__)
    exc = context.get("exception")
    error = (run and run.error) or (f"{type(exc).__name__}: {exc}" if exc else
                                    f"DAG run {dag_run_id} ended: {context.get('reason') or 'failed'}")
    notify.announce(portal, ["failed"], context, run_id=run and run.run_id, stats=run and run.stats, error=error,
                    reasons=reasons)
