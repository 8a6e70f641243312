"""Who is asking, and what they may do: Airflow's own token, asked of Airflow's auth manager.

Every route of the Harvester app (harvester.ui.app) but its static assets resolves the user from
the token Airflow issued: ``Authorization: Bearer <token>`` when given, else the ``_token`` cookie
Airflow's UI sets at login. The app does not rely on Airflow's API dependencies being wired in
(a plugin's FastAPI app is mounted as it is), so it validates the token itself through the auth
manager the api-server initialized (``get_user_from_token``: signature, expiry, revocation).

- No token, or one that is expired, revoked or not valid: 401.
- Reading (every GET): the user needs access to the custom view "Harvester"
  (``is_authorized_custom_view``, method GET); else 403.
- Reviewing a change (POST): the user needs to be allowed to edit the DAG of the change's portal,
  ``harvest_<portal>`` (``is_authorized_dag`` with method PUT); else 403.

With Airflow's simple auth manager every role may read, and the roles User, Op and Admin may
review (Viewer may not). Other auth managers answer with their own roles and permissions.
"""
from __future__ import annotations

from typing import Iterable

from fastapi import HTTPException, Request, status

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


async def reader(request: Request):
    """Dependency: the user, who may read the Harvester pages; 401 / 403 otherwise."""
    user = await current_user(request)
    if not can_read(user):
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"{user.get_name()} may not read the Harvester view (the custom view "
                            f"{RESOURCE_NAME!r} of Airflow's auth manager)")
    return user


def login_url(request: Request) -> str:
    """Airflow's login page, coming back to this page afterwards."""
    return auth_manager().get_url_login(next_url=str(request.url))
