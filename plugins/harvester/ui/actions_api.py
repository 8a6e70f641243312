"""What an operator does from the Harvester page besides reading and reviewing one change: review
many changes at once, export what a list shows, and start a portal's DAG now.

- ``POST /api/changes/review``: one review (reviewed or dismissed, a note) of many changes, by id
  (a page's selection, or every change it shows), in one set-based statement. The same checks as
  reviewing one change (``POST /api/changes/{id}/review``): edit access (PUT) to the DAG of every
  change's portal, else 403 naming the DAGs and nothing is marked; an unknown id is a 404 naming
  it and nothing is marked. Changes already reviewed keep their review: the answer says how many
  were marked and which were reviewed already.
- ``GET /api/export/changes`` and ``GET /api/export/datasets``: CSV or JSON Lines (``format``),
  the columns and bytes of ``harvester export ... -o -`` (store/export.py), streamed from one
  consistent snapshot, with the filters of the page the export starts from: the changes list's
  (portal, change type, since, significance, the review queue), the search page's (portal,
  organization, tag, format, licence, modified from / until, removed datasets too). A portal is
  found as everywhere in the API (harvester.ui.common.portal_named): in portals.yaml, else by the
  name the harvester database knows it by.
- ``POST /api/portals/{name}/trigger``: a DAG run of the portal's DAG ``harvest_<name>`` now, with
  its params (run: the DAG's defaults; full_sync; reconcile; force_removals and takeover as
  asked), through Airflow's own trigger code path (airflow.api.common.trigger_dag, which Airflow's
  REST API and CLI use): the run is queued for Airflow's scheduler like one triggered from
  Airflow's UI, by the user. Only for users Airflow lets trigger that DAG (auth.can_trigger: a DAG
  run POST on it, as Airflow's own trigger route asks); a DAG Airflow does not know (not parsed
  yet, stale, import errors) or a paused one is refused with a message saying what to do, and so
  is a portal only the harvester database knows (not in portals.yaml: no DAG to run). The answer
  links to the new run in Airflow's grid.
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask

from harvester.ui import auth
from harvester.ui.common import (NO_DAG, airflow_root, dag_run_url, database, invalid, portal_dags,
                                 portal_named, user_date)

log = logging.getLogger(__name__)

router = APIRouter(route_class=auth.GatedRoute)  # a write route's gate runs before its body is read
Reader = Depends(auth.reader)
Writer = Depends(auth.writer)


# -- many reviews at once ---------------------------------------------------------------------------
class BulkReviewBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[int] = Field(min_length=1, max_length=500, description="the changes to review (at most 500)")
    action: Literal["reviewed", "dismissed"] = Field(description="mark them reviewed, or dismiss them")
    note: str | None = Field(None, max_length=2000, description="why (optional; the same note on each)")


@router.post("/api/changes/review", tags=["changes"], summary="Mark many changes reviewed, or dismiss them",
             responses={401: {"description": "not authenticated"},
                        403: {"description": "may not edit the DAG of a change's portal: nothing marked"},
                        404: {"description": "an unknown change id: nothing marked"}})
def api_review_many(body: BulkReviewBody, user=Writer, conn=Depends(database)):
    """One review of every change named that has none yet, recorded as the Airflow user, in one
    statement. Needs edit (PUT) access to the DAG of the portal of every change named. Answers
    `marked` (how many were marked now), `marked_ids`, and `already_reviewed` (the ids that had a
    review already, which they keep)."""
    from harvester.store import review

    ids = sorted(set(body.ids))
    with conn.transaction():
        portals = review.change_portals(conn, ids)
        missing = [i for i in ids if i not in portals]
        if missing:
            raise HTTPException(status.HTTP_404_NOT_FOUND,
                                f"no change with id {', '.join(map(str, missing[:20]))}"
                                f"{' ...' if len(missing) > 20 else ''}; nothing was marked")
        dags = portal_dags(set(portals.values()))
        allowed = auth.reviewable(user, {d for d in dags.values() if d})
        refused = sorted(name for name, dag_id in dags.items() if dag_id not in allowed)
        if refused:
            named = sorted({dags[n] or f"the DAG of {n}" for n in refused})
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                f"{user.get_name()} may not review changes of {', '.join(refused)}: that needs edit "
                                f"access to {', '.join(named)}; nothing was marked")
        try:
            marked = review.review_many(conn, ids, outcome=body.action, by=user.get_name(), note=body.note)
        except ValueError as exc:
            raise invalid("note", str(exc), "body") from None
    done = set(marked)
    return {"action": body.action, "marked": len(marked), "marked_ids": marked,
            "already_reviewed": [i for i in ids if i not in done]}


# -- exports ----------------------------------------------------------------------------------------
FORMAT = Query(..., description="csv or jsonl (the columns of `harvester export`, docs/export.md)")
MEDIA = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson; charset=utf-8"}
EXPORT_RESPONSES = {200: {"content": {"text/csv": {}, "application/x-ndjson": {}},
                          "description": "a CSV header then a line per row, or a JSON object per line"},
                    422: {"description": "a bad format or filter, or no portal of that name (the message names which)"}}


def _export_connection(portal: str | None) -> tuple[object, str | None]:
    """A connection of its own for an export's stream, and the URL of the portal named by the
    ``portal`` filter (portals.yaml's, else one only the harvester database knows, as every
    ``portal=`` of the API): a 422 naming the parameter when there is none (the connection closed)."""
    from harvester.store import db

    conn = db.open_task(migrate=False)
    try:
        return conn, portal_named(portal, "portal", conn).url if portal else None
    except BaseException:
        conn.close()
        raise


def _stream(conn, fmt: str, source, filename: str) -> StreamingResponse:
    """The rows of ``source(conn)`` (columns, batches) as CSV / JSON Lines, from one snapshot on
    ``conn``, a connection of its own, held while the body streams and closed when it ends (or by
    the background task when the client went away mid-stream)."""
    from harvester.pipeline.export_files import text_chunks
    from harvester.store import export

    def body():
        try:
            with export.snapshot(conn):
                columns, batches = source(conn)
                yield from text_chunks(fmt, columns, batches)
        finally:
            conn.close()

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return StreamingResponse(body(), media_type=MEDIA[fmt], background=BackgroundTask(conn.close),
                             headers={"Content-Disposition":
                                      f'attachment; filename="harvester-{filename}-{stamp}.{fmt}"'})


@router.get("/api/export/changes", tags=["export"], summary="Download the changes a list shows: CSV or JSON Lines",
            response_class=StreamingResponse, responses=EXPORT_RESPONSES)
def api_export_changes(format: Literal["csv", "jsonl"] = FORMAT,
                       queue: bool = Query(False, description="only changes waiting for review"),
                       portal: str | None = Query(None, description="a portal's name (in portals.yaml, or one only "
                                                                  "the harvester database knows)"),
                       change_type: str | None = Query(None, description="one change type"),
                       since: str | None = Query(None, description="detected at or after (ISO date or time)"),
                       min_significance: float | None = Query(None, ge=0, le=1, description="at least this (0-1)"),
                       user=Reader):
    """Every change matching the filters of `GET /api/changes` (not one page), oldest first, in the
    columns of `harvester export changes`. Streamed from one consistent snapshot."""
    from harvester.domain import changes as ch
    from harvester.store import export

    types = (ch.NEW, ch.CONTENT_UPDATED, ch.TITLE_CHANGED, ch.DATE_CHANGED, ch.METADATA_UPDATED, ch.REMOVED,
             ch.RESTORED)
    change_type = change_type or None
    if change_type is not None and change_type not in types:
        raise invalid("change_type", f"{change_type!r} is not a change type; valid: {', '.join(types)}")
    when = user_date(since, "since")
    conn, url = _export_connection(portal)

    def source(conn):
        return export.CHANGE_COLUMNS, export.change_batches(conn, portal_url=url, since=when, change_type=change_type,
                                                            queue=queue, min_significance=min_significance)

    return _stream(conn, format, source, "changes" + (f"-{portal}" if portal else ""))


@router.get("/api/export/datasets", tags=["export"], summary="Download datasets: CSV or JSON Lines",
            response_class=StreamingResponse, responses=EXPORT_RESPONSES)
def api_export_datasets(format: Literal["csv", "jsonl"] = FORMAT,
                        portal: str | None = Query(None, description="only this portal (its name in portals.yaml, or one "
                                                                   "only the harvester database knows)"),
                        organization: str | None = Query(None, description="only this organization (title or name)"),
                        tag: str | None = Query(None, description="only datasets with this tag"),
                        format_: str | None = Query(None, alias="resource_format",
                                                    description="only datasets with a resource of this format"),
                        license: str | None = Query(None, description="only this licence (id or title)"),
                        since: str | None = Query(None, description="modified on or after (ISO date or time)"),
                        until: str | None = Query(None, description="modified on or before (a date: that whole day)"),
                        include_removed: bool = Query(False, description="datasets removed from their portal too"),
                        user=Reader):
    """Every dataset the search page's filters keep (the search words aside), by id, in the
    columns of `harvester export datasets` (without `raw`). `resource_format` is the search's
    `format` filter (`format` names the file's). Streamed from one consistent snapshot."""
    from harvester.store import export, search

    since_at, until_at = user_date(since, "since"), user_date(until, "until", end=True)
    conn, url = _export_connection(portal)
    filters = search.SearchFilters(portal_url=url, organization=organization or None, tag=tag or None,
                                   format=format_ or None, license=license or None, since=since_at, until=until_at,
                                   include_removed=include_removed)

    def source(conn):
        return export.dataset_columns(), export.dataset_batches(conn, portal_url=url, include_removed=include_removed,
                                                                filters=filters)

    return _stream(conn, format, source, "datasets" + (f"-{portal}" if portal else ""))


# -- a run of a portal's DAG now ----------------------------------------------------------------------
ACTIONS = {"run": {}, "full_sync": {"full_sync": True}, "reconcile": {"reconcile": True}}


class TriggerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["run", "full_sync", "reconcile"] = Field(
        description="run: a run as scheduled (incremental); full_sync: list the whole portal; reconcile: "
                    "also list every identifier and remove what the portal no longer lists")
    force_removals: bool = Field(False, description="remove datasets the portal no longer lists even past the "
                                                    "removal guard (a full sync or reconciliation)")
    takeover: bool = Field(False, description="abort another run of the portal and run this one")
    note: str | None = Field(None, max_length=1000, description="the DAG run's note in Airflow (optional)")


def _dag_model(dag_id: str):
    from sqlalchemy import select

    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.execute(select(DagModel.is_paused, DagModel.is_stale, DagModel.has_import_errors)
                              .where(DagModel.dag_id == dag_id)).first()
    return None if row is None else {"paused": bool(row[0]), "stale": bool(row[1]), "import_errors": bool(row[2])}


@router.get("/api/portals/{name}/trigger", tags=["portals"],
            summary="Whether the user may run the portal's DAG now, and whether Airflow would run it")
def api_trigger_state(request: Request, name: str, user=Reader, conn=Depends(database)):
    """`can_trigger`: whether Airflow lets the user create runs of the DAG; `in_airflow`: whether
    Airflow knows the DAG (parsed, not stale, no import errors); `paused`; `dag_url`: the DAG in
    Airflow's UI; `problem`: why a run cannot start now (null when it can). A portal only the
    harvester database knows has no DAG: `dag_id` null, `can_trigger` false and `problem` saying
    so. 404: a portal in neither."""
    portal = portal_named(name, conn=conn)
    if portal.dag_id is None:
        return {"portal": portal.name, "dag_id": None, "can_trigger": False, "in_airflow": False, "paused": None,
                "problem": _no_dag(portal.name), "dag_url": None}
    dag = _dag_model(portal.dag_id)
    problem = _refusal(portal.dag_id, dag)
    return {"portal": portal.name, "dag_id": portal.dag_id, "can_trigger": auth.can_trigger(user, portal.dag_id),
            "in_airflow": dag is not None and not dag["stale"] and not dag["import_errors"],
            "paused": None if dag is None else dag["paused"], "problem": problem[1] if problem else None,
            "dag_url": f"{airflow_root(request)}/dags/{portal.dag_id}"}


def _no_dag(name: str) -> str:
    return (f"{name} is {NO_DAG}: the harvester database knows it (harvested from the CLI with another portals "
            "file, or removed from portals.yaml); add it to portals.yaml to run it from here")


def _refusal(dag_id: str, dag: dict | None) -> tuple[int, str] | None:
    """(status, message) when Airflow would not run the DAG now: unknown, stale, import errors, paused."""
    if dag is None or dag["stale"]:
        return (status.HTTP_404_NOT_FOUND,
                f"Airflow does not know the DAG {dag_id} "
                f"({'stale: its file no longer defines it' if dag else 'not parsed yet'}): check that the portal is "
                "in the portals.yaml the DAG processor reads, then wait for the DAG processor")
    if dag["import_errors"]:
        return (status.HTTP_409_CONFLICT,
                f"{dag_id} has import errors in Airflow: fix them (Airflow's Dag import errors) first")
    if dag["paused"]:
        return (status.HTTP_409_CONFLICT,
                f"{dag_id} is paused in Airflow: a run would wait until it is unpaused; unpause it in Airflow "
                "first (its toggle on the Dags page)")
    return None


@router.post("/api/portals/{name}/trigger", tags=["portals"], status_code=status.HTTP_201_CREATED,
             summary="Run the portal's DAG now (run, full sync or reconcile), through Airflow",
             responses={401: {"description": "not authenticated"},
                        403: {"description": "Airflow does not let the user trigger the portal's DAG"},
                        404: {"description": "no such portal, or Airflow does not know its DAG"},
                        409: {"description": "the DAG is paused, or has import errors; or the portal is not "
                                             "in portals.yaml (only the harvester database knows it): no DAG"}})
def api_trigger(request: Request, name: str, body: TriggerBody, user=Writer, conn=Depends(database)):
    """A DAG run of `harvest_<name>` with the params `full_sync`, `reconcile`, `force_removals`
    and `takeover` (every one given, the others false), queued for Airflow's scheduler, triggered
    by the user as from Airflow's UI. Answers `dag_id`, `dag_run_id`, `conf`, `state` and
    `dag_run_url` (the run in Airflow's grid)."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagNotFound, DagRunAlreadyExists
    from airflow.utils.types import DagRunTriggeredByType

    portal = portal_named(name, conn=conn)
    if portal.dag_id is None:
        raise HTTPException(status.HTTP_409_CONFLICT, _no_dag(portal.name))
    dag_id = portal.dag_id
    if not auth.can_trigger(user, dag_id):
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"{user.get_name()} may not trigger {dag_id}: Airflow's auth manager does not allow "
                            "creating runs of that DAG")
    refused = _refusal(dag_id, _dag_model(dag_id))
    if refused:
        raise HTTPException(*refused)
    conf = {"full_sync": False, "reconcile": False, **ACTIONS[body.action],
            "force_removals": body.force_removals, "takeover": body.takeover}
    triggered = DagRunTriggeredByType.UI if request.headers.get("referer") else DagRunTriggeredByType.REST_API
    try:
        run = trigger_dag(dag_id, triggered_by=triggered, triggering_user_name=user.get_name(), conf=conf,
                          note=(body.note or "").strip() or None)
    except DagNotFound:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"Airflow does not know the DAG {dag_id}") from None
    except DagRunAlreadyExists as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, f"{dag_id}: {exc}") from None
    except ValueError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, f"{dag_id}: {exc}") from None
    state = getattr(run.state, "value", run.state)
    log.info("%s triggered %s (%s): DAG run %s", user.get_name(), dag_id, body.action, run.run_id)
    return {"portal": portal.name, "dag_id": dag_id, "dag_run_id": run.run_id, "action": body.action, "conf": conf,
            "state": str(state), "dag_run_url": dag_run_url(airflow_root(request), dag_id, run.run_id)}
