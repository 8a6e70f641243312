"""The Harvester app inside the Airflow UI: HTML pages and a JSON API, mounted at /harvester.

The plugin (harvester.ui.plugin) mounts ``app`` in Airflow's api-server. Pages (``/``,
``/portals/{name}``, ``/runs/{run_id}``, ``/changes``, ``/datasets/{portal}/{source_id}``, ``/search``,
``/validate``)
all serve the same shell, ``static/index.html``, whose script reads the JSON API under ``/api``; the API's
OpenAPI description is at ``/docs``. Who may do what: harvester.ui.auth.

Data: portals come from portals.yaml, and from the harvester database those only it knows
(harvester.ui.common), joined with what the harvester database holds (the Airflow connection
``harvester_db``, opened per request like a DAG task's, without migrating) and with Airflow's own
metadata (next scheduled run, paused, task instances for log links). SQL lives in the store
modules.
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask

from harvester.config.secrets import redact_url
from harvester.ui import actions_api, auth, validate_api
from harvester.ui.common import PREFIX, airflow_root as _airflow_root, dag_run_url as _dag_run_url
from harvester.ui.common import invalid as _invalid, user_date as _date
from harvester.ui.common import (UnlistedPortal, configured_portals, database, database_only_portals,
                                 portal_dags, portal_named, portal_names)

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_LIMIT = 500
DEFAULT_LIMIT = 50
TASK_ORDER = ("begin", "fetch_modified", "reconcile", "hash_compare", "embed_changed", "upsert")
FAILED_RUN = ("failed", "cancelled", "abandoned")

DESCRIPTION = """\
The Harvester's data, read from the harvester database and Airflow: portals, runs, dataset
changes and their review, dataset versions, search.

**Authentication**: Airflow's own token, as a bearer token (`Authorization: Bearer <token>`, from
Airflow's `POST /auth/token`) or the `_token` cookie Airflow's UI sets at login. Without one: 401.

**Permissions**: reading needs access to the custom view `Harvester` of Airflow's auth manager
(403 otherwise). Every write route (POST) first needs edit access (PUT) to at least one harvest
DAG, `harvest_<portal>`: without it, 403 before the body is read or anything looked up
(`POST /api/validate` too, unless `HARVESTER_VALIDATE_READERS` opens it to readers). Then
reviewing a change needs edit access to its portal's DAG; deciding about duplicates needs it for
the portal of every dataset whose decisions the request writes or drops (a split from the whole
group: every member's; a merge: both; forgetting: every dataset the dropped overrides name);
else 403 naming the DAGs, and nothing is changed.

**Lists** take `limit` (default 50, at most 500) and `offset`, and answer
`{"items": [...], "total": N, "limit": L, "offset": O}`.

**A run's report**: what became of the records a run could not take as they are (failed to parse
or validate: errors, the record is not stored; stored with warnings; embedding deferred; removal
withheld), one row per problem of a record, each with a reason code of a closed list (the docs'
reason codes page), grouped by code and downloadable as CSV.
"""

app = FastAPI(title="Harvester", description=DESCRIPTION, version="1", docs_url=None, redoc_url=None,
              openapi_url=None)
# A write route's gate (auth.writer) runs before its body is read (auth.GatedRoute).
app.router.route_class = auth.GatedRoute
# Static assets need no login: they hold no data (the pages fetch the data from the API).
app.mount("/static", StaticFiles(directory=STATIC_DIR, check_dir=False), name="static")


@app.middleware("http")
async def _no_store(request: Request, call_next):
    """Pages and API answers depend on who asks: never cached."""
    static = request.url.path.startswith(f"{request.scope.get('root_path', '')}/static/")  # before routing
    response = await call_next(request)  # (routing rewrites the scope's root_path)
    if not static:
        response.headers.setdefault("Cache-Control", "no-store")
    return response


# -- errors -----------------------------------------------------------------------------------------
def _install_error_handlers() -> None:
    from harvester.config.portals import PortalConfigError
    from harvester.store.db import DatabaseConfigError, DatabaseLookupError, LockWaitTimeout
    from harvester.store.migrations import MigrationError

    async def unavailable(request: Request, exc: Exception):
        log.warning("Harvester page: %s", exc)
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)

    # (LockWaitTimeout: e.g. a split while a long duplicate grouping holds the groups' lock)
    for kind in (PortalConfigError, DatabaseConfigError, DatabaseLookupError, MigrationError, LockWaitTimeout):
        app.add_exception_handler(kind, unavailable)


_install_error_handlers()


# -- dependencies (the database's: harvester.ui.common.database) ------------------------------------
# portals.yaml's portals, and those only the harvester database knows: harvester.ui.common
_portals = configured_portals
_portal_named = portal_named
_portal_names = portal_names


Reader = Depends(auth.reader)
Writer = Depends(auth.writer)  # every write route's: tests/ui/test_ui_duplicates.py walks the routes
Limit = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description=f"page size (at most {MAX_LIMIT})")
Offset = Query(0, ge=0, description="items to skip")


def _page(items: list, total: int, limit: int, offset: int) -> dict:
    return {"items": items, "total": total, "limit": limit, "offset": offset}


# -- links into the Airflow UI --------------------------------------------------------------------------
# (common.airflow_root, common.dag_run_url: _airflow_root, _dag_run_url)
def _read_airflow(what: str, query) -> list | None:
    """Rows of a query on Airflow's metadata database; None (and a warning) when it is out of
    reach: the pages show the rest anyway."""
    try:
        from airflow.utils.session import create_session

        with create_session() as session:
            return session.execute(query).all()
    except Exception:
        log.warning("could not read %s from Airflow's metadata database", what, exc_info=True)
        return None


def _airflow_dags(dag_ids: list[str]) -> dict[str, dict]:
    """Per DAG id Airflow knows: paused, and when its next run is due (None when paused)."""
    if not dag_ids:
        return {}
    from sqlalchemy import select

    from airflow.models.dag import DagModel

    rows = _read_airflow("the harvest DAGs", select(
        DagModel.dag_id, DagModel.is_paused, DagModel.is_stale, DagModel.next_dagrun_create_after,
        DagModel.next_dagrun).where(DagModel.dag_id.in_(dag_ids)))
    return {dag_id: {"paused": bool(paused), "stale": bool(stale),
                     "next_run": None if paused or stale else (run_after or next_dagrun)}
            for dag_id, paused, stale, run_after, next_dagrun in rows or ()}


def _log_tasks(dag_id: str, dag_run_ids: list[str]) -> dict[str, tuple[str, int]]:
    """Per DAG run: the task instance whose log tells most, (task_id, map_index): the first that
    failed in the DAG's order, else upsert (its last line has the run's counts), else the last
    that started."""
    if not dag_run_ids:
        return {}
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance

    rows = _read_airflow("task instances", select(
        TaskInstance.run_id, TaskInstance.task_id, TaskInstance.map_index, TaskInstance.state,
        TaskInstance.start_date).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id.in_(dag_run_ids)))
    if rows is None:
        return {}
    by_run: dict[str, list] = {}
    for run_id, task_id, map_index, state, start in rows:
        by_run.setdefault(run_id, []).append((task_id, map_index, str(getattr(state, "value", state) or ""), start))

    def in_dag_order(ti):
        return TASK_ORDER.index(ti[0]) if ti[0] in TASK_ORDER else len(TASK_ORDER), ti[1]

    out = {}
    for run_id, tis in by_run.items():
        failed = sorted((ti for ti in tis if ti[2] == "failed"), key=in_dag_order)
        upsert = [ti for ti in tis if ti[0] == "upsert" and ti[3] is not None]
        started = sorted((ti for ti in tis if ti[3] is not None), key=lambda ti: ti[3])
        chosen = failed[0] if failed else upsert[0] if upsert else started[-1] if started else None
        if chosen:
            out[run_id] = (chosen[0], chosen[1])
    return out


def _logs_url(root: str, dag_id: str | None, dag_run_id: str | None, task: tuple[str, int] | None) -> str | None:
    run = _dag_run_url(root, dag_id, dag_run_id)
    if run is None or task is None:
        return None
    task_id, map_index = task
    return f"{run}/tasks/{quote(task_id, safe='')}" + (f"/mapped/{map_index}" if map_index >= 0 else "")


# -- shapes -------------------------------------------------------------------------------------------
def _duration(run: dict) -> float | None:
    if run.get("finished_at") and run.get("started_at"):
        return round((run["finished_at"] - run["started_at"]).total_seconds(), 3)
    return None


def _badge(run: dict | None) -> str | None:
    from harvester.pipeline.notify import commit_outcomes

    if run is None:
        return None
    if run["status"] in FAILED_RUN:
        return "failed"
    if run["status"] == "committed" and "degraded" in commit_outcomes(run["stats"] or {}):
        return "degraded"
    return None


def _run_item(run: dict, dag_id: str | None, root: str, task: tuple[str, int] | None) -> dict:
    from harvester.domain.run import complete_stats

    return {
        "run_id": run["run_id"], "dag_run_id": run["dag_run_id"], "mode": run["mode"], "status": run["status"],
        "started_at": run["started_at"], "finished_at": run["finished_at"], "duration_seconds": _duration(run),
        "reconcile_reason": run["reconcile_reason"], "error": run["error"], "stats": complete_stats(run["stats"]),
        "dag_run_url": _dag_run_url(root, dag_id, run["dag_run_id"]),
        "logs_url": _logs_url(root, dag_id, run["dag_run_id"], task),
    }


def _breaker(conn) -> dict | None:
    """The breaker of the active embedding provider and model (CLOSED when it has no row yet);
    without a usable provider configuration, the breaker changed last, if any."""
    from harvester.embeddings import get_provider
    from harvester.store.breaker import list_states

    states = list_states(conn)
    try:
        provider = get_provider()
        key = (provider.name, provider.model)
    except Exception as exc:  # noqa: BLE001  no usable provider here: say what we can
        log.info("Harvester page: no embedding provider to show the breaker of (%s)", exc)
        return states[0] if states else None
    for state in states:
        if (state["provider"], state["model"]) == key:
            return state
    return {"provider": key[0], "model": key[1], "state": "closed", "consecutive_failures": 0, "opened_at": None,
            "retry_at": None, "last_error": None, "updated_at": None}


def _portal_items(conn, portals: list, request: Request) -> list[dict]:
    from harvester.store import review, runs

    root = _airflow_root(request)
    overview = runs.overview(conn, [p.url for p in portals])
    queue = review.queue_counts(conn, [p.url for p in portals])
    dags = _airflow_dags([p.dag_id for p in portals if p.dag_id])
    breaker = _breaker(conn) if portals else None
    now = datetime.now(timezone.utc)
    items = []
    for portal in portals:
        seen = overview.get(portal.url, {})
        last = seen.get("last_run")
        last_sync = seen.get("last_successful_sync")
        dag = dags.get(portal.dag_id, {})
        last_run = None
        if last is not None:
            stats = last["stats"] or {}
            last_run = {
                "run_id": last["run_id"], "dag_run_id": last["dag_run_id"], "mode": last["mode"],
                "status": last["status"], "started_at": last["started_at"], "finished_at": last["finished_at"],
                "duration_seconds": _duration(last), "skipped": int(stats.get("skipped") or 0),
                "removals_withheld": int(stats.get("removals_withheld") or 0), "error": last["error"],
                "reconcile_reason": last["reconcile_reason"],
                "dag_run_url": _dag_run_url(root, portal.dag_id, last["dag_run_id"]),
            }
        items.append({
            "name": portal.name, "url": redact_url(portal.url), "dag_id": portal.dag_id, "enabled": portal.enabled,
            "schedule": portal.schedule, "live_datasets": seen.get("live_datasets", 0),
            "pending_embeddings": seen.get("pending_embeddings", 0),
            "last_successful_sync": last_sync,
            "last_sync_age_seconds": round((now - last_sync).total_seconds()) if last_sync else None,
            "last_sync_mode": seen.get("last_sync_mode"), "sync_status": seen.get("sync_status"),
            "next_run": dag.get("next_run"), "paused": dag.get("paused"), "in_airflow": bool(dag),
            "review_queue": queue.get(portal.url, 0),
            "configured": not isinstance(portal, UnlistedPortal),
            "breaker": breaker, "last_run": last_run, "badge": _badge(last),
        })
    return items


def _change_items(changes: list[dict], user, request: Request) -> list[dict]:
    by_url = {p.url: p for p in _portals()}
    root = _airflow_root(request)
    named = []
    for change in changes:
        portal = by_url.get(change["portal_url"])
        name = portal.name if portal else (change["portal_name"] or redact_url(change["portal_url"]))
        dag_id = portal.dag_id if portal else (f"harvest_{change['portal_name']}" if change["portal_name"] else None)
        named.append((change, name, dag_id))
    allowed = auth.reviewable(user, {dag_id for _, _, dag_id in named})
    return [{
        "id": c["id"], "portal": name, "portal_url": redact_url(c["portal_url"]), "dag_id": dag_id,
        "source_id": c["source_id"],
        "dataset_title": c["title"], "dataset_url": c["url"], "dataset_removed_at": c["removed_at"],
        "change_type": c["change_type"], "changed_fields": c["changed_fields"], "summary": c["summary"],
        "significance": c["significance"], "requires_review": c["requires_review"], "detected_at": c["detected_at"],
        "old_version": c["old_version"], "new_version": c["new_version"], "run_id": c["run_id"],
        "reviewed_at": c["reviewed_at"], "reviewed_by": c["reviewed_by"], "review_note": c["review_note"],
        "review_outcome": c["review_outcome"], "can_review": dag_id in allowed,
        "dataset_page": f"{root}{PREFIX}/datasets/{quote(name, safe='')}/{quote(c['source_id'], safe='')}",
    } for c, name, dag_id in named]


# -- pages --------------------------------------------------------------------------------------------
async def _page_user(request: Request):
    """The user of a page: anonymous visitors go to Airflow's login (and come back), others
    without read access see a 403 page."""
    try:
        return await auth.reader(request)
    except HTTPException as exc:
        if exc.status_code == status.HTTP_401_UNAUTHORIZED:
            return RedirectResponse(auth.login_url(request), status_code=status.HTTP_307_TEMPORARY_REDIRECT)
        if exc.status_code == status.HTTP_403_FORBIDDEN:
            return HTMLResponse(_message_page("Not allowed", str(exc.detail)), status_code=exc.status_code)
        raise


def _message_page(title: str, text: str) -> str:
    from html import escape

    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Harvester: {escape(title)}</title>"
            f"</head><body><h1>{escape(title)}</h1><p>{escape(text)}</p></body></html>")


def _shell():
    index = STATIC_DIR / "index.html"
    if index.is_file():
        return FileResponse(index, media_type="text/html")
    return HTMLResponse(_message_page("Harvester", "The Harvester page is not built: static/index.html is missing."))


async def _serve_page(request: Request):
    user = await _page_user(request)
    if not isinstance(user, (RedirectResponse, HTMLResponse)):
        return _shell()
    return user


@app.get("/", include_in_schema=False)
async def page_portals(request: Request):
    return await _serve_page(request)


@app.get("/portals/{name}", include_in_schema=False)
async def page_portal(request: Request, name: str):
    return await _serve_page(request)


@app.get("/changes", include_in_schema=False)
async def page_changes(request: Request):
    return await _serve_page(request)


@app.get("/datasets/{portal}/{source_id:path}", include_in_schema=False)
async def page_dataset(request: Request, portal: str, source_id: str):
    return await _serve_page(request)


@app.get("/search", include_in_schema=False)
async def page_search(request: Request):
    return await _serve_page(request)


@app.get("/validate", include_in_schema=False)
async def page_validate(request: Request):
    return await _serve_page(request)


@app.get("/runs/{run_id}", include_in_schema=False)
async def page_run(request: Request, run_id: str):
    return await _serve_page(request)


@app.get("/dags/{dag_id}", include_in_schema=False)
async def page_dag(request: Request, dag_id: str):
    """The Harvester tab of a DAG in the Airflow UI: its portal's page, for a harvest DAG."""
    user = await _page_user(request)
    if isinstance(user, (RedirectResponse, HTMLResponse)):
        return user
    name = next((p.name for p in _portals() if p.dag_id == dag_id), None)
    if name is None and dag_id.startswith("harvest_") and len(dag_id) > len("harvest_"):
        # a portal removed from portals.yaml (its DAG lingers in Airflow, stale, with its runs):
        # its page, when the harvester database knows it by that name
        from harvester.store import db

        conn = db.open_task(migrate=False)
        try:
            name = _portal_named(dag_id[len("harvest_"):], conn=conn).name
        except HTTPException:
            name = None
        finally:
            conn.close()
    if name is not None:
        target = f"{request.scope.get('root_path', '')}/portals/{quote(name, safe='')}"
        return RedirectResponse(target, status_code=status.HTTP_307_TEMPORARY_REDIRECT)
    return HTMLResponse(_message_page("Not a harvest DAG", f"{dag_id} harvests no portal of portals.yaml nor one the "
                                      "harvester database knows: the Harvester tab shows the portal of a "
                                      "harvest_<portal> DAG."),
                        status_code=status.HTTP_404_NOT_FOUND)


@app.get("/docs", include_in_schema=False)
async def docs(request: Request):
    """The API's reference: static/apidocs.js renders /openapi.json, with nothing from another host
    (FastAPI's Swagger UI loads from a CDN: a blank page offline)."""
    user = await _page_user(request)
    if isinstance(user, (RedirectResponse, HTMLResponse)):
        return user
    page = STATIC_DIR / "apidocs.html"
    if page.is_file():
        return FileResponse(page, media_type="text/html")
    return HTMLResponse(_message_page("Harvester API", "The API page is not built: static/apidocs.html is missing."))


@app.get("/openapi.json", include_in_schema=False)
def openapi(request: Request, user=Reader):
    schema = dict(app.openapi())
    root = request.scope.get("root_path", "")
    if root:
        schema["servers"] = [{"url": root}]
    return schema


# -- the API ------------------------------------------------------------------------------------------
@app.get("/api/me", tags=["me"], summary="Who is asking, and whether they may review")
def api_me(user=Reader):
    """`can_review`: whether the user may edit at least one harvest DAG (so review some changes)."""
    return {"user": user.get_name(), "can_review": bool(auth.reviewable(user, [p.dag_id for p in _portals()]))}


@app.get("/api/portals", tags=["portals"],
         summary="Every portal of portals.yaml with its state, then those only the harvester database knows")
def api_portals(request: Request, limit: int = Limit, offset: int = Offset, user=Reader, conn=Depends(database)):
    """Every entry of portals.yaml (enabled or not), in its order, then every portal only the
    harvester database knows (harvested from the CLI with another portals file, or removed from
    portals.yaml), by name: `configured` false, no DAG, schedule or next run; the same state
    otherwise, read for the page's portals in one statement."""
    configured = _portals()
    portals = configured + database_only_portals(conn, configured)
    return _page(_portal_items(conn, portals[offset:offset + limit], request), len(portals), limit, offset)


@app.get("/api/portals/{name}", tags=["portals"], summary="One portal with its state")
def api_portal(request: Request, name: str, user=Reader, conn=Depends(database)):
    """`duplicates`: how many of its live datasets are copies of other portals' (`copies_of`, by
    the portal of each group's canonical member) and how many of its datasets other portals copy
    (`copied_by`). A name not in portals.yaml is looked up in the harvester database (the name its
    latest run recorded: a portal harvested from the CLI, or removed from portals.yaml), answered
    with `configured` false and no DAG; every `{name}`, `{portal}` and `portal=` of this API is
    found the same way. 404: in neither."""
    from harvester.store import duplicates

    portal = _portal_named(name, conn=conn)
    item = _portal_items(conn, [portal], request)[0]
    copies = duplicates.portal_copies(conn, portal.url)
    by_url = _portal_names(conn)
    for key in ("copies_of", "copied_by"):
        copies[key] = [{**c, "portal": by_url.get(c["portal_url"], c["portal_name"]),
                        "portal_url": redact_url(c["portal_url"])} for c in copies[key]]
    item["duplicates"] = copies
    return item


@app.get("/api/portals/{name}/runs", tags=["portals"], summary="The portal's runs, newest first")
def api_runs(request: Request, name: str, limit: int = Limit, offset: int = Offset, user=Reader,
             conn=Depends(database)):
    """Each run with its `stats` and its report's `errors` and `warnings` (rows of
    `GET /api/runs/{run_id}/outcomes`)."""
    from harvester.store import outcomes, runs

    portal = _portal_named(name, conn=conn)
    rows, total = runs.page_runs(conn, portal.url, limit=limit, offset=offset)
    tasks = _log_tasks(portal.dag_id, [r["dag_run_id"] for r in rows if r["dag_run_id"]]) if portal.dag_id else {}
    root = _airflow_root(request)
    reported = outcomes.counts(conn, [r["run_id"] for r in rows])
    none = {"errors": 0, "warnings": 0}
    return _page([_run_item(r, portal.dag_id, root, tasks.get(r["dag_run_id"])) | reported.get(r["run_id"], none)
                  for r in rows], total, limit, offset)


# -- a run's report -------------------------------------------------------------------------------------
SEVERITY_HELP = "only rows of this severity: error (the record was not stored) or warning (it was)"
CODE_HELP = "only rows of this reason code (the closed list of the docs' reason codes page)"


def _outcome_filters(severity: str | None, code: str | None) -> tuple[str | None, str | None]:
    """The report's filters (blank: none); a 422 naming the parameter and its bad value."""
    from harvester.domain import outcomes as oc

    severity = severity.strip() if severity and severity.strip() else None
    code = code.strip() if code and code.strip() else None
    if severity is not None and severity not in oc.SEVERITIES:
        raise _invalid("severity", f"{severity!r} is not a severity; valid: {', '.join(oc.SEVERITIES)}")
    if code is not None and code not in oc.CODES:
        raise _invalid("code", f"{code!r} is not a reason code; valid: {', '.join(oc.CODES)}")
    return severity, code


def _run_row(conn, run_id: int) -> dict:
    """The run (runs.RUN_COLUMNS), whatever its portal: a portal gone from portals.yaml keeps its
    history; 404 naming the run id when there is none."""
    from harvester.store import runs

    run = runs.run_item(conn, run_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run with id {run_id}")
    return run


@app.get("/api/runs/{run_id}/outcomes", tags=["runs"],
         summary="A run's report: its records' errors and warnings, grouped by reason, and one page of them",
         responses={404: {"description": "no such run"}, 422: {"description": "a bad severity, code, limit or offset"}})
def api_outcomes(request: Request, run_id: int,
                 severity: str | None = Query(None, description=SEVERITY_HELP),
                 code: str | None = Query(None, description=CODE_HELP),
                 limit: int = Limit, offset: int = Offset, user=Reader, conn=Depends(database)):
    """`run`: the run (its portal's name, URL and DAG, mode, status, times, `stats`); `counts`:
    its rows by severity (`errors`, `warnings`, whatever the filters); `groups`: the rows of the
    `severity` asked for grouped by reason `code` (errors first, then the most frequent), each
    with its `count`, a few `examples` (record ids, or `#position` in the listing for a record
    without one) and the first row's `message`; `items`: one page of the rows matching
    `severity` and `code` (errors first, then in listing order), each with the record's
    `position` in the listing, `source_id`, `stage`, `severity`, `code`, `field`, the bad `value`
    and the `message`. A run of a portal no longer in portals.yaml is still shown."""
    from harvester.store import outcomes

    severity, code = _outcome_filters(severity, code)
    run = _run_row(conn, run_id)
    portal = next((p for p in _portals() if p.url == run["portal_url"]), None)
    dag_id = portal.dag_id if portal else None
    task = _log_tasks(dag_id, [run["dag_run_id"]]).get(run["dag_run_id"]) if dag_id and run["dag_run_id"] else None
    items, total = outcomes.page(conn, run_id, severity=severity, code=code, limit=limit, offset=offset)
    return {
        "run": _run_item(run, dag_id, _airflow_root(request), task) | {
            "portal": portal.name if portal else _portal_names(conn).get(run["portal_url"], run["portal_name"]),
            "portal_url": redact_url(run["portal_url"]),
            "dag_id": dag_id, "portal_configured": portal is not None},
        "counts": outcomes.counts(conn, [run_id]).get(run_id, {"errors": 0, "warnings": 0}),
        "groups": outcomes.groups(conn, run_id, severity=severity),
        "items": jsonable_encoder(items), "total": total, "limit": limit, "offset": offset,
    }


@app.get("/api/runs/{run_id}/outcomes.csv", tags=["runs"], summary="A run's report as CSV: every row",
         response_class=StreamingResponse,
         responses={200: {"content": {"text/csv": {}}, "description": "a header, then one line per row"},
                    404: {"description": "no such run"}, 422: {"description": "a bad severity or code"}})
def api_outcomes_csv(run_id: int, severity: str | None = Query(None, description=SEVERITY_HELP),
                     code: str | None = Query(None, description=CODE_HELP), user=Reader):
    """Every row of the run matching `severity` and `code`, in the order of
    `GET /api/runs/{run_id}/outcomes` (the same bytes as `harvester report --csv`): `run_id`,
    `portal_url`, `position`, `source_id`, `stage`, `severity`, `code`, `field`, `value`,
    `message`. Streamed: a report of any size is never held whole in memory."""
    from harvester.domain.outcomes import csv_chunks
    from harvester.store import db, outcomes

    severity, code = _outcome_filters(severity, code)
    # Its own connection, held while the body streams (a request's connection is closed when the
    # endpoint returns): closed when the stream ends, and by the background task after the
    # response when the client went away mid-stream.
    conn = db.open_task(migrate=False)
    try:
        _run_row(conn, run_id)
    except BaseException:
        conn.close()
        raise

    def body():
        try:
            yield from csv_chunks(outcomes.iter_rows(conn, run_id, severity=severity, code=code))
        finally:
            conn.close()

    return StreamingResponse(body(), media_type="text/csv; charset=utf-8", background=BackgroundTask(conn.close),
                             headers={"Content-Disposition":
                                      f'attachment; filename="harvester-run-{run_id}-outcomes.csv"'})


@app.get("/api/changes", tags=["changes"], summary="Detected changes, newest first; queue=true: the review queue")
def api_changes(request: Request,
                queue: bool = Query(False, description="only changes that require review and have no review yet"),
                portal: str | None = Query(None, description="a portal's name in portals.yaml"),
                change_type: str | None = Query(None, description="new, content_updated, title_changed, "
                                                                     "date_changed, metadata_updated, removed, restored"),
                since: str | None = Query(None, description="detected at or after (ISO date or time; UTC unless given)"),
                min_significance: float | None = Query(None, ge=0, le=1, description="at least this significant (0-1)"),
                limit: int = Limit, offset: int = Offset, user=Reader, conn=Depends(database)):
    from harvester.domain import changes as ch
    from harvester.store import history

    types = (ch.NEW, ch.CONTENT_UPDATED, ch.TITLE_CHANGED, ch.DATE_CHANGED, ch.METADATA_UPDATED, ch.REMOVED,
             ch.RESTORED)
    if change_type is not None and change_type not in types:
        raise _invalid("change_type", f"{change_type!r} is not a change type; valid: {', '.join(types)}")
    urls = [_portal_named(portal, "portal", conn).url] if portal else None
    rows, total = history.page_changes(conn, portal_urls=urls, queue=queue, change_type=change_type,
                                       since=_date(since, "since"), min_significance=min_significance, limit=limit,
                                       offset=offset)
    return _page(_change_items(rows, user, request), total, limit, offset)


class ReviewBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["reviewed", "dismissed"] = Field(description="mark the change reviewed, or dismiss it")
    note: str | None = Field(None, max_length=2000, description="why (optional)")


@app.post("/api/changes/{change_id}/review", tags=["changes"], summary="Mark a change reviewed, or dismiss it",
          responses={401: {"description": "not authenticated"}, 403: {"description": "may not edit the portal's DAG"},
                     404: {"description": "no such change"}, 409: {"description": "already reviewed"}})
def api_review(request: Request, change_id: int, body: ReviewBody, user=Writer, conn=Depends(database)):
    """Records who (the Airflow user), when and the note, once. Needs edit (PUT) access to the DAG of
    the change's portal. Answers with the change as `GET /api/changes` lists it."""
    from harvester.store import history, review

    change = history.get_change(conn, change_id)
    if change is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no change with id {change_id}")
    (item,) = _change_items([change], user, request)
    if not item["can_review"]:
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"{user.get_name()} may not review changes of {item['portal']}: that needs edit access "
                            f"to the DAG {item['dag_id'] or '(none: the portal is not in portals.yaml)'}")
    try:
        review.review(conn, change_id, outcome=body.action, by=user.get_name(), note=body.note)
    except review.AlreadyReviewed as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    except ValueError as exc:
        raise _invalid("note", str(exc), "body") from None
    (item,) = _change_items([history.get_change(conn, change_id)], user, request)
    return item


@app.get("/api/datasets/{portal}/{source_id:path}/diff", tags=["datasets"],
         summary="Two versions of a dataset side by side")
def api_diff(portal: str, source_id: str,
             from_: int | None = Query(None, alias="from", ge=1, description="default: the version before `to`"),
             to: int | None = Query(None, ge=1, description="default: the current version"),
             user=Reader, conn=Depends(database)):
    """`fields`: every field of either version's snapshot (title, description, then the tracked
    metadata), with its old and new value and whether it changed; `diff`: the unified diff the CLI
    prints (`harvester diff`)."""
    from harvester.domain import diff
    from harvester.store import history

    dataset = _dataset(conn, portal, source_id)
    current = history.current_version_number(conn, dataset["id"])
    if current is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"dataset {source_id} of {portal} has no versions")
    from_n, to_n = diff.versions_to_compare(current, from_, to)
    new = history.get_version(conn, dataset["id"], to_n)
    old = history.get_version(conn, dataset["id"], from_n) if from_n is not None else None
    missing = [str(n) for n, v in ((from_n, old), (to_n, new)) if n is not None and v is None]
    if missing:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"dataset {source_id} of {portal} has no version "
                                                       f"{' or '.join(missing)} (versions 1 to {current} exist)")
    before = None if old is None else old["snapshot"] or {}

    def meta(version):
        return None if version is None else {k: version[k] for k in ("version_number", "change_type", "title",
                                                                         "first_seen_at", "last_seen_at", "is_current")}

    lines = [] if old is None else diff.unified_diff(before, new["snapshot"], f"version {from_n}", f"version {to_n}")
    return {"from": from_n, "to": to_n, "fields": diff.field_changes(before, new["snapshot"]), "diff": lines,
            "versions": {"from": meta(old), "to": meta(new)}}


def _dataset(conn, portal_name: str, source_id: str) -> dict:
    from harvester.store import history

    portal = _portal_named(portal_name, conn=conn)
    dataset = history.dataset_detail(conn, portal.url, source_id)
    if dataset is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no dataset with id {source_id!r} in portal {portal_name}")
    return dataset


@app.get("/api/datasets/{portal}/{source_id:path}", tags=["datasets"],
         summary="A dataset with its versions (newest first) and changes")
def api_dataset(request: Request, portal: str, source_id: str, user=Reader, conn=Depends(database)):
    """`group`: the dataset's duplicate group (`group_id` null and no members when alone): its
    members, canonical first, each with the evidence and confidence of its link to the group and
    its page here, and the operators' overrides about this dataset. `can_edit_group`: whether the
    user may split or merge it (edit access to the portal's DAG)."""
    from harvester.store import duplicates, history

    dataset = _dataset(conn, portal, source_id)
    versions = history.list_versions(conn, dataset["id"])
    changes, _ = history.page_changes(conn, dataset_id=dataset["id"], limit=MAX_LIMIT)
    return {
        "portal": portal, "source_id": dataset["source_id"], "name": dataset["name"], "title": dataset["title"],
        "url": dataset["url"], "organization": dataset["organization"], "removed_at": dataset["removed_at"],
        "first_seen_at": dataset["first_seen_at"], "last_seen_at": dataset["last_seen_at"],
        "metadata_modified": dataset["metadata_modified"],
        "versions": [{k: v[k] for k in ("version_number", "change_type", "title", "first_seen_at", "last_seen_at",
                                        "is_current", "content_hash", "metadata_hash", "changed_fields",
                                        "significance")} for v in versions],
        "changes": _change_items(changes, user, request),
        "group": _group_item(duplicates.group_of(conn, dataset["id"]), request),
        # a portal not in portals.yaml: the DAG its runs would have had (as _may_decide asks)
        "can_edit_group": auth.can_review(user, _portal_named(portal, conn=conn).dag_id or f"harvest_{portal}"),
    }


@app.get("/api/search", tags=["search"], summary="Search the datasets: full text and vectors, fused")
def api_search(request: Request,
               q: str = Query(..., min_length=1, max_length=1000, description="what to look for"),
               mode: Literal["hybrid", "vector", "text"] = Query(
                   "hybrid", description="hybrid: full text and vectors fused by reciprocal rank; or one side"),
               portal: str | None = Query(None, description="only this portal (its name in portals.yaml)"),
               organization: str | None = Query(None, description="only this organization (title or name)"),
               tag: str | None = Query(None, description="only datasets with this tag"),
               format: str | None = Query(None, description="only datasets with a resource of this format"),
               license: str | None = Query(None, description="only this licence (id or title)"),
               since: str | None = Query(None, description="modified on or after (ISO date or time; UTC unless given)"),
               until: str | None = Query(None, description="modified on or before (a date: that whole day)"),
               include_removed: bool = Query(False, description="datasets removed from their portal too"),
               all_copies: bool = Query(False, description="each portal's copy of a dataset as its own item "
                                                           "(default: one item per duplicate group)"),
               limit: int = Query(10, ge=1, le=100), user=Reader, conn=Depends(database)):
    """Full text (PostgreSQL, in each dataset's language, else its portal's; accents ignored) and vector similarity
    (the query embedded with the active provider, or the model that covers the datasets during a
    model switch), each side's best fused by reciprocal rank fusion; ``mode`` picks one side
    alone. Items carry ``score`` (the fused score), ``matched`` (the sides that found the
    dataset) and ``snippet`` (matching words between ``**``). A dataset on several portals (a
    duplicate group) is one item, its canonical copy when that one matched, else its best-ranked
    copy that did (so a portal filter finds it through its copy there); ``group_id`` (null when
    alone), ``canonical``, ``also_on`` (the group's other live copies, each with its ``portal``
    and ``dataset_page``) and ``copies`` say so. ``all_copies=true``: every copy is an item."""
    from harvester.store import search
    from harvester.embeddings import EmbeddingError

    if not q.strip():
        raise _invalid("q", "the query is empty")
    by_url = _portal_names(conn)
    root = _airflow_root(request)
    url = _portal_named(portal, "portal", conn).url if portal else None
    filters = search.SearchFilters(portal_url=url, organization=organization or None, tag=tag or None,
                                   format=format or None, license=license or None,
                                   since=_date(since, "since"), until=_date(until, "until", end=True),
                                   include_removed=include_removed)
    try:
        settings = search.SearchSettings.from_env()
    except ValueError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"search is misconfigured: {exc}") from None
    try:
        found = search.search(conn, q, mode=mode, filters=filters, limit=limit, settings=settings,
                              all_copies=all_copies)
    except EmbeddingError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"search is unavailable: {exc}") from None
    return {"items": [{"rank": r["rank"], "score": round(float(r["score"]), 6),
                       "portal": by_url.get(r["portal_url"], redact_url(r["portal_url"])), "title": r["title"],
                       "url": r["url"],
                       "source_id": r["source_id"], "matched": r["matched"], "organization": r["organization"],
                       "snippet": r["snippet"], "similarity": r["similarity"], "text_rank": r["text_rank"],
                       "metadata_modified": r["metadata_modified"], "removed": r["removed_at"] is not None,
                       "group_id": r["group_id"], "canonical": r["canonical"],
                       "also_on": [_member_link(m, by_url, root) for m in r["also_on"]], "copies": r["copies"]}
                      for r in found.items],
            "model": found.model, "note": found.note, "mode": mode, "timings": found.timings}


# -- duplicate groups: one dataset on several portals (store/duplicates.py) -------------------------------
def _member_link(member: dict, by_url: dict[str, str], root: str) -> dict:
    """A group member with its portal's name in portals.yaml (else the name its runs recorded) and
    its page here."""
    name = by_url.get(member["portal_url"], member.get("portal_name") or redact_url(member["portal_url"]))
    return {**member, "portal": name, "portal_url": redact_url(member["portal_url"]),
            "dataset_page": f"{root}{PREFIX}/datasets/{quote(name, safe='')}/{quote(member['source_id'], safe='')}"}


def _group_item(group: dict, request: Request) -> dict:
    by_url = {p.url: p.name for p in _portals()}
    root = _airflow_root(request)
    return {**group, "members": [_member_link(m, by_url, root) for m in group["members"]]}


def _dataset_ref(conn, portal_name: str, source_id: str) -> tuple[int, object]:
    """(dataset id, portal) of a dataset named by its portal and source id; 404 naming it."""
    from harvester.store import duplicates

    portal = _portal_named(portal_name, conn=conn)
    try:
        return duplicates.find_dataset_id(conn, portal.url, source_id), portal
    except duplicates.DuplicateError:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"no dataset with id {source_id!r} in portal {portal_name}") from None


def _may_decide(user, conn, dataset_id: int, what: str, **concerned) -> None:
    """403 unless the user may edit the DAG of the portal of every dataset the operation decides
    about (duplicates.portals_concerned; as reviewing a change). Asked inside the operation's
    transaction, which holds the groups' lock: nothing changes between the check and the write."""
    from harvester.store import duplicates

    dags = portal_dags(duplicates.portals_concerned(conn, dataset_id, **concerned).items())
    allowed = auth.reviewable(user, {d for d in dags.values() if d})
    refused = {name: dag_id for name, dag_id in dags.items() if dag_id not in allowed}
    if refused:
        named = sorted({d or f"the DAG of {name}" for name, d in refused.items()})
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"{user.get_name()} may not edit {', '.join(named)}: {what} decides about datasets of "
                            f"{', '.join(sorted(refused))}; nothing was changed")


class DatasetRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    portal: str = Field(description="the portal's name in portals.yaml")
    source_id: str = Field(min_length=1, description="the dataset's id on that portal")


class SplitBody(DatasetRef):
    note: str | None = Field(None, max_length=2000, description="why (optional)")
    from_: list[DatasetRef] | None = Field(None, alias="from", max_length=100,
                                           description="only apart from these members (default: from all of them)")


class MergeBody(DatasetRef):
    other_portal: str = Field(description="the other dataset's portal")
    other_source_id: str = Field(min_length=1, description="the other dataset's id on that portal")
    note: str | None = Field(None, max_length=2000, description="why (optional)")


GROUP_RESPONSES = {401: {"description": "not authenticated"},
                   403: {"description": "may edit no harvest DAG, or not the DAG of a portal concerned"},
                   404: {"description": "no such portal or dataset"},
                   409: {"description": "the dataset is in no group (split)"},
                   422: {"description": "a dataset with itself, or a bad body"}}


@app.get("/api/duplicates", tags=["duplicates"], summary="Duplicate groups, largest and newest first")
def api_duplicates(request: Request, portal: str | None = Query(None, description="only groups with a member on "
                                                                                  "this portal"),
                   limit: int = Limit, offset: int = Offset, user=Reader, conn=Depends(database)):
    """Each group: `group_id` and its members (canonical first), as `GET /api/datasets/...` shows them."""
    from harvester.store import duplicates

    url = _portal_named(portal, "portal", conn).url if portal else None
    groups, total = duplicates.list_groups(conn, url, limit=limit, offset=offset)
    return _page([_group_item(g, request) for g in groups], total, limit, offset)


@app.post("/api/duplicates/split", tags=["duplicates"], summary="Take a dataset out of its duplicate group",
          responses=GROUP_RESPONSES)
def api_split(request: Request, body: SplitBody, user=Writer, conn=Depends(database)):
    """Kept across runs (an override 'different' with each other member, or only with `from`),
    decided by the Airflow user. Needs edit access to the DAG of every dataset it decides about:
    each member of the group (without `from`), else the dataset's and those of `from`. Answers
    with the dataset's group afterwards."""
    from harvester.store import duplicates

    dataset_id, portal = _dataset_ref(conn, body.portal, body.source_id)
    others = [_dataset_ref(conn, o.portal, o.source_id)[0] for o in body.from_ or []]
    if dataset_id in others:
        raise _invalid("from", f"dataset {body.source_id!r} of {body.portal} cannot be split from itself", "body")
    what = f"splitting {body.source_id!r} of {body.portal} from {'the datasets named' if others else 'its group'}"
    try:
        with conn.transaction():
            duplicates.lock(conn)
            _may_decide(user, conn, dataset_id, what, others=others, group=not others)
            group = duplicates.split(conn, dataset_id, by=user.get_name(), note=body.note, from_ids=others or None)
    except duplicates.DuplicateError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"dataset {body.source_id!r} of {body.portal}: {exc}") from None
    return _group_item(group, request)


@app.post("/api/duplicates/merge", tags=["duplicates"], summary="Put two datasets in one duplicate group",
          responses=GROUP_RESPONSES)
def api_merge(request: Request, body: MergeBody, user=Writer, conn=Depends(database)):
    """Kept across runs (an override 'same'), decided by the Airflow user. Needs edit access to
    the DAGs of both datasets' portals. Answers with the dataset's group afterwards."""
    from harvester.store import duplicates

    dataset_id, _ = _dataset_ref(conn, body.portal, body.source_id)
    other_id, _ = _dataset_ref(conn, body.other_portal, body.other_source_id)
    if dataset_id == other_id:
        raise _invalid("other_source_id", f"dataset {body.source_id!r} of {body.portal} cannot be merged with "
                                          "itself", "body")
    what = f"merging {body.source_id!r} of {body.portal} with {body.other_source_id!r} of {body.other_portal}"
    with conn.transaction():
        duplicates.lock(conn)
        _may_decide(user, conn, dataset_id, what, others=[other_id])
        group = duplicates.merge(conn, dataset_id, other_id, by=user.get_name(), note=body.note)
    return _group_item(group, request)


@app.post("/api/duplicates/forget", tags=["duplicates"],
          summary="Drop the operators' overrides about a dataset: the evidence alone decides again",
          responses=GROUP_RESPONSES)
def api_forget(request: Request, body: DatasetRef, user=Writer, conn=Depends(database)):
    """Needs edit access to the DAG of the portal of every dataset the dropped overrides name
    (decisions other portals' editors may have made). Answers with `forgotten` (how many
    overrides were dropped) and the dataset's group afterwards."""
    from harvester.store import duplicates

    dataset_id, _ = _dataset_ref(conn, body.portal, body.source_id)
    with conn.transaction():
        duplicates.lock(conn)
        _may_decide(user, conn, dataset_id, f"forgetting the overrides about {body.source_id!r} of {body.portal}",
                    overrides=True)
        forgotten = duplicates.forget(conn, dataset_id)
    return {"forgotten": forgotten, "group": _group_item(duplicates.group_of(conn, dataset_id), request)}


# -- checking a catalogue before harvesting it (harvester.ui.validate_api) ------------------------------
app.include_router(validate_api.router)

# -- many reviews at once, exports, running a portal's DAG now (harvester.ui.actions_api) -------------------
app.include_router(actions_api.router)
