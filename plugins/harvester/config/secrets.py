"""Secrets: ``${VAR}`` expansion, the one redactor of URLs, and Airflow connections looked up.

- ``expand_env``: ``${VAR}`` and ``${VAR:-default}`` in portals.yaml values (a portal's url, a
  webhook), so secrets stay in the environment.
- ``redact_url`` / ``redact_text``: a URL, or every URL in a message, fit for a log line, an error
  or a page (the policy is on ``redact_url``). Every room shows URLs through these two.
  ``secret_parameters``: a URL's parameters named like secrets, by the same rule (portals.yaml
  refuses a portal url with any).
- ``lookup_connection``: an Airflow connection by id, None when nothing defines it, and a failure
  of the lookup named as one that may pass (``ConnectionLookupError``) or one that cannot
  (``ConnectionValueError``: the value does not parse). ``redact_connection`` shows a connection's
  value (a URI or Airflow's JSON form) without its password.

Nothing here imports Airflow until a connection is looked up. A portal's token (its ``conn_id``)
is looked up in credentials.py.
"""
from __future__ import annotations

import os
import re
from typing import Callable
from urllib.parse import unquote_plus, urlsplit

# -- ${VAR} ----------------------------------------------------------------------------------------
ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _reference(match: re.Match) -> str:
    """The value of one ``${VAR}`` / ``${VAR:-default}``; ValueError naming the variable when it is
    not set and has no default."""
    value = os.environ.get(match.group(1))
    if value:
        return value
    if match.group(2) is not None:
        return match.group(2)
    raise ValueError(f"environment variable {match.group(1)} is not set")


def expand_env(text: str, *, literal: Callable[[str], str] | None = None) -> str:
    """``text`` with every ``${VAR}`` and ``${VAR:-default}`` replaced by its value; ValueError
    naming a variable that is not set. ``literal``, when given, is applied to the text around the
    references only (a url's user or password: literal text percent-decoded, values as they are)."""
    if literal is None:
        return ENV_REFERENCE.sub(_reference, text)
    out, pos = [], 0
    for match in ENV_REFERENCE.finditer(text):
        out += [literal(text[pos:match.start()]), _reference(match)]
        pos = match.end()
    return "".join(out + [literal(text[pos:])])


# -- redaction -------------------------------------------------------------------------------------
# Query (and fragment) parameters whose value is a secret: these names, and any name ending in one
# of them once lower-cased without - and _ (api_key, apiKey, access_token, client_secret,
# X-Amz-Signature, subscription-key, ...).
SECRET_PARAMETERS = ("key", "token", "secret", "signature", "password", "passwd", "credential")
SECRET_PARAMETER_NAMES = frozenset({"sig", "pwd", "auth"})
_PARAMETER = re.compile(r"(?<=[?&;#])([^=&;#\s'\"<>]+)=([^&;#,\s'\"<>)]*)")
_HOST_PORT = re.compile(r"^(?:\[[^\]]*\]|[^\[\]:@]*)(?::\d*)?$")
_URL_IN_TEXT = re.compile(r"(?:\b[A-Za-z][A-Za-z0-9+.-]*:)?//[^\s'\"<>]+")


def _secret_parameter(name: str) -> bool:
    name = name.lower().replace("-", "").replace("_", "")
    return name in SECRET_PARAMETER_NAMES or name.endswith(SECRET_PARAMETERS)


def secret_parameters(url: str) -> list[str]:
    """The names of ``url``'s query and fragment parameters (``name=value``, split at & and ;)
    named like a secret, as ``redact_url`` tells them (``SECRET_PARAMETERS``), in order: a name
    counts as written and percent-decoded (``api%5Fkey``). portals.yaml refuses a portal url with
    any (config/portals.py): a url is shown and stored; a secret goes in a header."""
    _, _, rest = url.partition("?")
    query, _, fragment = rest.partition("#") if rest else ("", "", url.partition("#")[2])
    names = []
    for part in re.split(r"[&;]", query) + re.split(r"[&;]", fragment):
        name, equals, _ = part.partition("=")
        if equals and (_secret_parameter(name) or _secret_parameter(unquote_plus(name))) and name not in names:
            names.append(name)
    return names


def _parameter(match: re.Match) -> str:
    name, value = match.group(1), match.group(2)
    return f"{name}=***" if value and _secret_parameter(name) else match.group(0)


def _origin(url: str) -> str:
    """scheme://host[:port], with /… when anything followed."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparseable URL>"
    if not parts.scheme or not host:
        return "<not a URL>"
    more = "/…" if parts.path.strip("/") or parts.query or parts.fragment else ""
    return f"{parts.scheme}://{host}{port}{more}"


def redact_url(url: str, *, hide_path: bool = False) -> str:
    """``url`` fit for a log line, an error message or a page; never raises.

    - A userinfo (``user:password@``, or a lone ``token@``) becomes ``***@``.
    - The value of a query or fragment parameter named like a secret (``SECRET_PARAMETERS``:
      key, token, api_key, apikey, access_token, signature, secret, password, ...) becomes ``***``.
    - A URL whose host and port do not parse, and which has an ``@`` further on (a password with
      an unencoded / ? or #): everything up to that last ``@`` becomes ``***@``; without ``//``,
      everything up to the last ``@``.
    - ``hide_path`` (webhooks, whose path is the token: Slack's /services/T…/B…/XXXX): only
      ``scheme://host[:port]``, with ``/…`` when anything followed; ``<not a URL>`` or
      ``<unparseable URL>`` for what has no scheme and host.
    """
    if hide_path:
        return _origin(url)
    head, sep, rest = url.partition("//")
    if not sep:
        if "@" in url:
            url = "***@" + url.rpartition("@")[2]
        return _PARAMETER.sub(_parameter, url)
    end = min([i for i in (rest.find(c) for c in "/?#") if i >= 0] or [len(rest)])
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    elif "@" in tail and not _HOST_PORT.match(authority):
        authority, tail = "***@", tail.rpartition("@")[2]
    return head + sep + authority + _PARAMETER.sub(_parameter, tail)


def redact_text(text: str) -> str:
    """``text`` (an error message, a log line) with every URL in it redacted as ``redact_url``
    does, and secret-named parameters redacted wherever they follow a ? & ; or #."""
    text = _URL_IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)
    return _PARAMETER.sub(_parameter, text)


_JSON_PASSWORD = re.compile(r'("password"\s*:\s*)"(?:[^"\\]|\\.)*"')


def redact_connection(value: str) -> str:
    """An Airflow connection's value (a URI, or Airflow's JSON form) fit for a log or a message."""
    value = value.strip()
    if value.startswith("{"):
        return _JSON_PASSWORD.sub(r'\1"***"', value)
    return redact_url(value)


def scrub_connection(text: str, value: str) -> str:
    """``text`` (an error message) with the connection value ``value``, and its password, in it
    replaced by the redacted form."""
    text = text.replace(value, redact_connection(value))
    try:
        password = urlsplit(value.strip()).password
    except ValueError:
        password = None
    return text.replace(password, "***") if password else text


# -- Airflow connections ---------------------------------------------------------------------------
class ConnectionLookupError(RuntimeError):
    """Looking an Airflow connection up failed (a secrets backend raised): it may pass."""

    transient = True  # domain/errors.py


class ConnectionValueError(ValueError):
    """An Airflow connection's value does not parse: retrying cannot help."""

    transient = False  # domain/errors.py


def conn_env(conn_id: str) -> str:
    """The environment variable that defines Airflow connection ``conn_id``."""
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def lookup_connection(conn_id: str):
    """The Airflow connection ``conn_id`` (from wherever Airflow keeps connections: inside a task
    its metadata database too; outside, ``AIRFLOW_CONN_<ID>`` variables and a configured secrets
    backend), None when nothing defines it. ConnectionLookupError or ConnectionValueError naming
    the connection, where it was looked up and why; ImportError without Airflow."""
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return Connection.get(conn_id)
    except AirflowNotFoundException:
        pass
    except Exception as exc:  # e.g. AirflowSecretsBackendAccessDenied
        raise ConnectionLookupError(f"could not look up the Airflow connection {conn_id}: "
                                    f"{type(exc).__name__}: {redact_text(str(exc))}") from None
    # Airflow also says "not defined" when a secrets backend raised or a value did not parse (it
    # logs those at DEBUG and asks the next backend): ask each backend again to tell them apart.
    from airflow.sdk.execution_time.supervisor import ensure_secrets_backend_loaded

    for backend in ensure_secrets_backend_loaded():
        found = _ask_backend(backend, conn_id)
        if found is not None:
            return found
    return None


def _ask_backend(backend, conn_id: str):
    """What one secrets backend holds for ``conn_id`` (None: nothing), its failures named: a value
    that does not parse is a configuration error, the backend failing may pass."""
    from airflow.secrets.environment_variables import EnvironmentVariablesBackend

    where = (f"{conn_env(conn_id)} (the Airflow connection {conn_id})"
             if isinstance(backend, EnvironmentVariablesBackend)
             else f"the Airflow connection {conn_id} in the secrets backend {type(backend).__name__}")
    try:
        try:
            value = backend.get_conn_value(conn_id)
        except NotImplementedError:  # a backend that implements get_connection only
            return backend.get_connection(conn_id)
    except Exception as exc:
        raise ConnectionLookupError(f"could not look up {where}: {type(exc).__name__}: "
                                    f"{redact_text(str(exc))}") from None
    if not value:
        return None
    try:
        return backend.deserialize_connection(conn_id=conn_id, value=value)
    except Exception as exc:
        raise ConnectionValueError(f"{where} does not parse ({redact_connection(value)}): "
                                   f"{type(exc).__name__}: {scrub_connection(str(exc), value)}") from None


def mask(secret: str) -> bool:
    """Register ``secret`` with Airflow's secrets masker, which masks it in every log line from then
    on (a second line of defence: nothing logs it anyway). False when that could not be done."""
    try:
        from airflow.sdk.log import mask_secret

        mask_secret(secret)
    except Exception:  # noqa: BLE001  no Airflow, or no masker to register with
        return False
    return True
