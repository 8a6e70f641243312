"""Helpers the Harvester app's route modules share (harvester.ui.app, harvester.ui.actions_api):
a bad parameter's 422, a date parameter, links into the Airflow UI, and finding a portal by name
(in portals.yaml, else in the harvester database)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

from fastapi import HTTPException, Request, status

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


# -- portals: portals.yaml's, and those only the harvester database knows ----------------------------------
def configured_portals() -> list:
    """The portals of portals.yaml (enabled or not), in its order."""
    from harvester.config.portals import load_portals

    return load_portals()


@dataclass(frozen=True)
class UnlistedPortal:
    """A portal the harvester database knows (its runs recorded it) but portals.yaml does not:
    harvested from the CLI, or removed from portals.yaml. It has pages and API answers like a
    listed one, without a DAG (``dag_id`` None) or a schedule."""
    name: str
    url: str
    dag_id: None = None
    enabled: None = None
    schedule: None = None


NO_DAG = "not in portals.yaml: no DAG to run"


def portal_named(name: str, parameter: str | None = None, conn=None):
    """The portal of portals.yaml named ``name``; with ``conn``, else the one the harvester
    database knows by that name (store.known_portals: the name its latest run recorded), an
    UnlistedPortal unless its URL is in portals.yaml under another name. None anywhere: 404, or
    422 naming ``parameter``."""
    portals = configured_portals()
    for portal in portals:
        if portal.name == name:
            return portal
    if conn is not None:
        from harvester.store.known_portals import portals_named

        known = portals_named(conn, name)
        if known:  # the most recently run first; a portal renamed in portals.yaml keeps its old name's links
            return next((p for p in portals if p.url == known[0].url), None) or UnlistedPortal(name, known[0].url)
    where = "in portals.yaml" + (" or the harvester database" if conn is not None else "")
    if parameter:
        raise invalid(parameter, f"no portal named {name!r} {where}")
    raise HTTPException(status.HTTP_404_NOT_FOUND, f"no portal named {name!r} {where}")


def database_only_portals(conn, configured: list | None = None) -> list[UnlistedPortal]:
    """The portals only the harvester database knows, by name: one per name that is not in
    portals.yaml, the one ``portal_named`` finds by it (the most recently run), unless its URL is
    in portals.yaml under another name (then it is that portal). ``configured``: portals.yaml's
    portals, when read already."""
    from harvester.store.known_portals import known_portals

    configured = configured_portals() if configured is None else configured
    names = {p.name for p in configured}
    urls = {p.url for p in configured}
    found: dict[str, UnlistedPortal] = {}
    for known in known_portals(conn):  # by name, the most recently run first
        if known.name not in names and known.name not in found:
            found[known.name] = UnlistedPortal(known.name, known.url)
    return [p for p in found.values() if p.url not in urls]


def portal_names(conn) -> dict[str, str]:
    """Portal URL -> the name its pages have: its name in portals.yaml, else the name the database
    knows it by (store.known_portals)."""
    from harvester.store.known_portals import known_portals

    return {p.url: p.name for p in known_portals(conn)} | {p.url: p.name for p in configured_portals()}


def database():
    """A connection to the harvester database for one request (as a DAG task opens one): the
    dependency of every route that reads or writes it."""
    from harvester.store import db

    conn = db.open_task(migrate=False)
    try:
        yield conn
    finally:
        conn.close()


def portal_dags(concerned) -> dict[str, str | None]:
    """Who must be allowed what, for a decision about datasets of several portals (a review, a
    duplicate group's change): portal name -> its DAG id, from (portal URL, name its runs recorded)
    pairs. A portal of portals.yaml by its configured name and DAG; another by its recorded name
    and ``harvest_<name>``; one without a recorded name None (nobody's DAG: refused)."""
    by_url = {p.url: p for p in configured_portals()}
    dags = {}
    for url, recorded in concerned:
        portal = by_url.get(url)
        if portal is not None:
            dags[portal.name] = portal.dag_id
        else:
            dags[recorded or "a portal not in portals.yaml"] = f"harvest_{recorded}" if recorded else None
    return dags
