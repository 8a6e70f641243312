"""A portal's CKAN API token, from the Airflow connection its ``conn_id`` names.

The token is the connection's password or, when that is empty, its extra ``api_key``. Airflow
masks a connection's password in task logs; the token is also registered with Airflow's secrets
masker here, so it is masked whichever field held it. Nothing here logs or repeats it.

Inside DAG tasks the connection comes from wherever Airflow keeps connections (its metadata
database, ``AIRFLOW_CONN_<ID>`` variables, a secrets backend). Outside a task (the CLI), Airflow
looks only at ``AIRFLOW_CONN_<ID>`` variables and a configured secrets backend
(secrets.lookup_connection).
"""
from __future__ import annotations

import logging

from harvester.config.portals import Portal, PortalConfigError
from harvester.config.secrets import ConnectionValueError, conn_env, lookup_connection, mask

log = logging.getLogger(__name__)


class CredentialsError(PortalConfigError):
    """A portal's conn_id names a connection that is missing or holds no API token."""


def api_key(portal: Portal) -> str | None:
    """The portal's CKAN API token; None when it names no connection."""
    if not portal.conn_id:
        return None
    where = f"portal {portal.name}: conn_id {portal.conn_id!r}"
    try:
        conn = lookup_connection(portal.conn_id)
    except ImportError:
        raise CredentialsError(f"{where} needs Airflow to look the connection up, and it is not installed") from None
    except ConnectionValueError as exc:
        raise CredentialsError(f"{where}: {exc}") from None
    if conn is None:
        raise CredentialsError(
            f"{where}: there is no Airflow connection {portal.conn_id!r}; create it with the portal's CKAN API "
            f"token as its password (or as extra api_key), e.g. {conn_env(portal.conn_id)}="
            "'{\"conn_type\": \"generic\", \"password\": \"<token>\"}'")
    try:
        extra = conn.extra_dejson
    except Exception:  # noqa: BLE001  an extra that is not JSON: the password may still do
        extra = {}
    key = conn.password or (extra.get("api_key") if isinstance(extra, dict) else None)
    if not isinstance(key, str) or not key.strip():
        raise CredentialsError(f"{where}: the Airflow connection has neither a password nor an extra api_key "
                               "(the portal's CKAN API token)")
    key = key.strip()
    if not mask(key):  # nothing logs the key anyway
        log.debug("could not register the API token of %s with Airflow's secrets masker", portal.name)
    return key
