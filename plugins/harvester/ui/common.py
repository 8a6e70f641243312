"""Helpers the Harvester app's route modules share (harvester.ui.app, harvester.ui.actions_api):
a bad parameter's 422, a date parameter, and links into the Airflow UI."""
from __future__ import annotations

from datetime import datetime
from urllib.parse import quote

from fastapi import HTTPException, Request

PREFIX = "/harvester"  # where the plugin mounts the app (under Airflow's [api] base_url path)


def invalid(parameter: str, message: str, where: str = "query") -> HTTPException:
    """422 shaped like FastAPI's own validation errors, naming the parameter."""
    return HTTPException(422,
                         [{"loc": [where, parameter], "msg": f"{parameter}: {message}", "type": "value_error"}])


def user_date(text: str | None, parameter: str, end: bool = False) -> datetime | None:
    """A date parameter (domain.dates.parse_user_date; ``end``: a date is up to its last instant);
    None when absent or blank, else a 422 naming the parameter."""
    from harvester.domain.dates import parse_user_date

    if text is None or not text.strip():
        return None
    try:
        return parse_user_date(text, end=end)
    except ValueError as exc:
        raise invalid(parameter, str(exc)) from None


def airflow_root(request: Request) -> str:
    """The Airflow UI's path prefix ([api] base_url's path), from where this app is mounted."""
    root = request.scope.get("root_path", "")
    return root[: -len(PREFIX)] if root.endswith(PREFIX) else ""


def dag_run_url(root: str, dag_id: str | None, dag_run_id: str | None) -> str | None:
    """A DAG run's page (its grid) in the Airflow UI."""
    if not dag_id or not dag_run_id:
        return None
    return f"{root}/dags/{quote(dag_id, safe='')}/runs/{quote(dag_run_id, safe='')}"
