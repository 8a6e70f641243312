"""A portal's token, from the Airflow connection its ``conn_id`` names, and the header it goes in.

The token is the connection's password or, when that is empty, its extra ``api_key``: a CKAN API
token, a Socrata app token, an OpenDataSoft API key, an ArcGIS access token, or whatever a DCAT
catalogue or CSW service takes in the header its ``auth_header`` names. ``auth_header`` gives the
header as the portal's HTTP client sends it (config/portals.py ``Portal.auth_header``: each
platform's documented header). Airflow masks a connection's password in task logs; the token is
also registered with Airflow's secrets masker here, so it is masked whichever field held it.
Nothing here logs or repeats it.

Inside DAG tasks the connection comes from wherever Airflow keeps connections (its metadata
database, ``AIRFLOW_CONN_<ID>`` variables, a secrets backend). Outside a task (the CLI), Airflow
looks only at ``AIRFLOW_CONN_<ID>`` variables and a configured secrets backend
(secrets.lookup_connection).
"""
from __future__ import annotations

import logging
import re

from harvester.config.portals import TOKEN_NAMES, Portal, PortalConfigError
from harvester.config.secrets import ConnectionValueError, conn_env, lookup_connection, mask

log = logging.getLogger(__name__)

# What a header value can carry: visible ASCII and spaces (no line break, no control character).
_HEADER_SAFE = re.compile(r"^[\x20-\x7e]*$")


class CredentialsError(PortalConfigError):
    """A portal's conn_id names a connection that is missing or holds no usable token."""


def api_key(portal: Portal) -> str | None:
    """The portal's token (for CKAN, its API token); None when it names no connection."""
    if not portal.conn_id:
        return None
    what = TOKEN_NAMES.get(portal.type, "API token")
    where = f"portal {portal.name}: conn_id {portal.conn_id!r}"
    try:
        conn = lookup_connection(portal.conn_id)
    except ImportError:
        raise CredentialsError(f"{where} needs Airflow to look the connection up, and it is not installed") from None
    except ConnectionValueError as exc:
        raise CredentialsError(f"{where}: {exc}") from None
    if conn is None:
        raise CredentialsError(
            f"{where}: there is no Airflow connection {portal.conn_id!r}; create it with the portal's {what} "
            f"as its password (or as extra api_key), e.g. {conn_env(portal.conn_id)}="
            "'{\"conn_type\": \"generic\", \"password\": \"<token>\"}'")
    try:
        extra = conn.extra_dejson
    except Exception:  # noqa: BLE001  an extra that is not JSON: the password may still do
        extra = {}
    key = conn.password or (extra.get("api_key") if isinstance(extra, dict) else None)
    if not isinstance(key, str) or not key.strip():
        raise CredentialsError(f"{where}: the Airflow connection has neither a password nor an extra api_key "
                               f"(the portal's {what})")
    key = key.strip()
    if not mask(key):  # nothing logs the key anyway
        log.debug("could not register the token of %s with Airflow's secrets masker", portal.name)
    if not _HEADER_SAFE.match(key):
        position = next(i for i, c in enumerate(key) if not _HEADER_SAFE.match(c))
        raise CredentialsError(f"{where}: the token in the Airflow connection holds a character an HTTP header "
                               f"cannot carry (a line break, a control or non-ASCII character, at position "
                               f"{position + 1} of {len(key)}); store the token alone, as the portal issued it")
    return key


def auth_header(portal: Portal) -> tuple[str, str] | None:
    """(header name, value) that carries the portal's token, as its ``auth_header`` says (e.g.
    ``("X-App-Token", <token>)`` for Socrata); None when it names no connection."""
    token = api_key(portal)
    if token is None:
        return None
    name, template = portal.auth_header or ("Authorization", "{token}")
    return name, template.replace("{token}", token)
