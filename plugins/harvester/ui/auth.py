"""Who is asking, and what they may do: Airflow's own token, asked of Airflow's auth manager.

Every route of the Harvester app (harvester.ui.app) but its static assets resolves the user from
the token Airflow issued: ``Authorization: Bearer <token>`` when given, else the ``_token`` cookie
Airflow's UI sets at login. The app does not rely on Airflow's API dependencies being wired in
(a plugin's FastAPI app is mounted as it is), so it validates the token itself through the auth
manager the api-server initialized (``get_user_from_token``: signature, expiry, revocation).

- No token, or one that is expired, revoked or not valid: 401.
- Reading (every GET): the user needs access to the custom view "Harvester"
  (``is_authorized_custom_view``, method GET); else 403.
- Writing (every POST, PUT, PATCH or DELETE): first of all, before the body is read or anything
  looked up (``writer``, run by ``GatedRoute`` ahead of FastAPI's body parsing), the user needs
  to be allowed to edit at least one harvest DAG: ``is_authorized_dag`` with method PUT for the
  DAG id of a portal of portals.yaml, ``harvest_<portal>``, asked DAG by DAG (so a per-DAG policy
  is honoured: edit access to another DAG does not count); with no portal in portals.yaml, edit
  access to DAGs as such (``is_authorized_dag`` PUT without a DAG: in FAB terms, all DAGs); else
  403. ``POST /api/validate`` (which makes the server fetch URLs of the caller's choosing) is a
  write route unless HARVESTER_VALIDATE_READERS opens it to readers (``validator``).
- Then each operation needs edit access to the DAG of every portal it changes: reviewing a
  change (or many at once), its portal's; deciding about duplicates, the portal of each dataset whose decisions it
  writes or drops (harvester.ui.app); else 403 naming the DAGs, and nothing is changed.
- Starting a run of a portal's DAG from its page (run now, full sync now, reconcile now) needs
  what Airflow's own trigger route needs: ``is_authorized_dag`` POST on that DAG's runs
  (``can_trigger``); else 403 naming the DAG.

With Airflow's simple auth manager, ``is_authorized_dag`` answers by role alone: every role may
read, and the roles User, Op and Admin may write (Viewer may not). Other auth managers answer with
their own roles and permissions, per DAG.
"""
from __future__ import annotations

from typing import Iterable

from fastapi import HTTPException, Request, status
from fastapi.routing import APIRoute

RESOURCE_NAME = "Harvester"
COOKIE_NAME = "_token"  # airflow.api_fastapi.auth.managers.base_auth_manager.COOKIE_NAME_JWT_TOKEN


def auth_manager():
    """The auth manager the Airflow api-server initialized."""
    from airflow.api_fastapi.app import get_auth_manager

    try:
        return get_auth_manager()
    except RuntimeError:  # mounted outside an initialized api-server: nobody can be authenticated
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                            "Airflow's auth manager is not initialized: the Harvester app runs inside "
                            "the Airflow api-server") from None


def request_token(request: Request) -> str | None:
    """The bearer token of the request, else its ``_token`` cookie."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return request.cookies.get(COOKIE_NAME) or None


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


async def current_user(request: Request):
    """The Airflow user of the request; 401 without a valid token."""
    from jwt import ExpiredSignatureError, InvalidTokenError

    token = request_token(request)
    if not token:
        raise _unauthorized("Not authenticated: log in to Airflow, or send an Airflow API token "
                            "(Authorization: Bearer <token>, from POST /auth/token)")
    try:
        return await auth_manager().get_user_from_token(token)
    except ExpiredSignatureError:
        raise _unauthorized("Token expired: log in to Airflow again") from None
    except InvalidTokenError:
        raise _unauthorized("Invalid token: log in to Airflow again") from None


def can_read(user) -> bool:
    return bool(auth_manager().is_authorized_custom_view(method="GET", resource_name=RESOURCE_NAME, user=user))


def reviewable(user, dag_ids: Iterable[str]) -> set[str]:
    """Those of ``dag_ids`` the user may edit (``is_authorized_dag``, PUT): whose changes they may review."""
    wanted = {d for d in dag_ids if d}
    if not wanted:
        return set()
    return set(auth_manager().filter_authorized_dag_ids(dag_ids=wanted, user=user, method="PUT"))


def can_review(user, dag_id: str | None) -> bool:
    if not dag_id:
        return False
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    return bool(auth_manager().is_authorized_dag(method="PUT", details=DagDetails(id=dag_id), user=user))


def can_trigger(user, dag_id: str) -> bool:
    """Whether the user may create a run of the DAG ``dag_id``: what Airflow's own trigger route
    (POST /api/v2/dags/{dag_id}/dagRuns) asks its auth manager, a DAG run POST on that DAG."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    return bool(auth_manager().is_authorized_dag(method="POST", access_entity=DagAccessEntity.RUN,
                                                 details=DagDetails(id=dag_id), user=user))


async def reader(request: Request):
    """Dependency: the user, who may read the Harvester pages; 401 / 403 otherwise."""
    user = await current_user(request)
    if not can_read(user):
        raise _cannot_read(user)
    return user


def _cannot_read(user) -> HTTPException:
    return HTTPException(status.HTTP_403_FORBIDDEN,
                         f"{user.get_name()} may not read the Harvester view (the custom view "
                         f"{RESOURCE_NAME!r} of Airflow's auth manager)")


# -- writing ------------------------------------------------------------------------------------------
def harvest_dag_ids() -> list[str]:
    """The DAG ids of the portals of portals.yaml (enabled or not)."""
    from harvester.config.portals import load_portals

    return sorted({p.dag_id for p in load_portals()})


def _listing(dag_ids: list[str], shown: int = 5) -> str:
    if len(dag_ids) <= shown:
        return ", ".join(dag_ids)
    return ", ".join(dag_ids[:shown]) + f", ... ({len(dag_ids)} in all)"


def require_writer(user) -> None:
    """403 unless the user may edit at least one harvest DAG (with no portal in portals.yaml: DAGs
    as such)."""
    dag_ids = harvest_dag_ids()
    if dag_ids:
        if reviewable(user, dag_ids):
            return
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"{user.get_name()} may not edit any harvest DAG ({_listing(dag_ids)}): the Harvester's "
                            "write routes need edit access (PUT) to at least one")
    if not auth_manager().is_authorized_dag(method="PUT", user=user):
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"{user.get_name()} may not edit DAGs: with no portal in portals.yaml, the Harvester's "
                            "write routes need edit access (PUT) to DAGs")


async def writer(request: Request):
    """Dependency of every write route: the user, who may edit at least one harvest DAG; 401 / 403
    otherwise, before anything else of the request is read."""
    user = getattr(request.state, "harvester_writer", None)
    if user is None:
        user = await current_user(request)
        require_writer(user)
        request.state.harvester_writer = user
    return user


async def validator(request: Request):
    """Dependency of ``POST /api/validate``: ``writer``, or ``reader`` when
    HARVESTER_VALIDATE_READERS is on (503 naming the setting when it holds a bad value)."""
    user = getattr(request.state, "harvester_validator", None)
    if user is None:
        from harvester.config.settings import SettingError, report_settings

        user = await current_user(request)
        try:
            readers = report_settings().validate_readers
        except SettingError as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"validation is misconfigured: {exc}") from None
        if not readers:
            require_writer(user)
        elif not can_read(user):
            raise _cannot_read(user)
        request.state.harvester_validator = user
    return user


WRITE_GATES = (writer, validator)


class GatedRoute(APIRoute):
    """A route whose write gate (a dependency of ``WRITE_GATES``) runs before FastAPI reads and
    parses the body: FastAPI reads a declared body first (a malformed one is a 422 before any
    dependency), so a user who may not write would learn about the body, or make the server read
    a large one, before being refused. The gate leaves the user on the request; its run as the
    route's dependency then returns that user. Routes without a gate are left as they are."""

    def get_route_handler(self):
        handle = super().get_route_handler()
        gates = [d.call for d in self.dependant.dependencies if d.call in WRITE_GATES]
        if not gates:
            return handle

        async def gated(request: Request):
            for gate in gates:
                await gate(request)
            return await handle(request)

        return gated


def login_url(request: Request) -> str:
    """Airflow's login page, coming back to this page afterwards."""
    return auth_manager().get_url_login(next_url=str(request.url))
