"""Telling people about the runs that need them, through Airflow notifiers.

A portal's ``notify:`` list in portals.yaml names where its runs are announced and which ones:

    notify:
      - webhook: ${HARVEST_WEBHOOK_URL}         # HTTP POST of JSON (WebhookNotifier below)
        on: [failed, degraded]                  # default: failed, degraded, review
      - class: airflow.providers.slack.notifications.slack.SlackNotifier
        kwargs: {slack_conn_id: slack_api_default, channel: "#data", text: "{{ harvester.message }}"}

Outcomes: ``failed`` (the DAG run failed), ``degraded`` (committed, but embeddings were skipped
while the breaker was open or the removal guard withheld removals), ``review`` (committed with
changes that need review). A clean run announces nothing.

Any ``BaseNotifier`` subclass works by import path, unchanged: it is called as Airflow calls it,
with the task's context, plus ``harvester`` (the payload WebhookNotifier posts) for its templates.
A notifier that fails is logged as a warning and never fails the run nor hides its failure.
Webhook URLs may hold secrets: they are expanded from the environment when sent and only ever
shown as scheme://host/…
"""
from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseNotifier

from harvester.config.portals import _expand_env as expand_env  # ${VAR} and ${VAR:-default}, as in a portal's url

log = logging.getLogger(__name__)

OUTCOMES = ("failed", "degraded", "review")
# The counts a notification carries (of the run's stats; 0 when absent).
COUNT_KEYS = ("fetched", "created", "updated", "unchanged", "removed", "failed", "skipped", "review",
              "removals_withheld")
DEFAULT_TIMEOUT = 10.0
_ENTRY_KEYS = ("webhook", "class", "kwargs", "on", "timeout")


class NotificationError(RuntimeError):
    """A notification could not be delivered; the message never holds a secret."""


def redact_url(url: str) -> str:
    """scheme://host[:port], with /… when there was more: webhook paths and queries hold tokens."""
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


@dataclass(frozen=True)
class NotifyTarget:
    """One entry of a portal's notify list: a webhook, or a notifier class by import path."""

    on: frozenset
    webhook: str | None = None          # as written in portals.yaml; ${VAR} expanded when sent
    class_path: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    timeout: float = DEFAULT_TIMEOUT

    @property
    def label(self) -> str:
        """What the target is called in logs: never a secret."""
        if self.class_path:
            return self.class_path
        try:
            return f"webhook {redact_url(expand_env(self.webhook or ''))}"
        except ValueError:
            return "webhook (URL not set)"

    def __repr__(self) -> str:
        return f"NotifyTarget({self.label}, on={sorted(self.on)})"

    def build(self) -> BaseNotifier:
        """A fresh notifier (Airflow renders templates into a notifier's attributes, for good)."""
        if self.class_path:
            return _import_class(self.class_path)(**self.kwargs)
        return WebhookNotifier(url=expand_env(self.webhook or ""), timeout=self.timeout)


def _import_class(path: str) -> type:
    module_name, _, name = path.rpartition(".")
    if not module_name or not name:
        raise ValueError(f"class {path!r} must be a dotted import path, e.g. "
                         "airflow.providers.slack.notifications.slack.SlackNotifier")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"class {path!r} cannot be imported ({type(exc).__name__}: {exc})") from None
    if not (inspect.isclass(cls) and issubclass(cls, BaseNotifier)):
        raise ValueError(f"class {path!r} is not an Airflow notifier (a subclass of airflow.sdk.BaseNotifier)")
    return cls


def _check_webhook(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("webhook must be the http(s) URL to POST to")
    value = value.strip()
    try:
        url = expand_env(value)
    except ValueError as exc:
        raise ValueError(f"webhook: {exc}") from None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"webhook {redact_url(url) if parts.netloc else 'value'} must be an http(s) URL")
    return value


def _target(entry: Any) -> NotifyTarget:
    if not isinstance(entry, dict):
        raise ValueError(f"must be a mapping with webhook or class, got {type(entry).__name__}")
    if True in entry and "on" not in entry:  # YAML 1.1 reads an unquoted `on:` key as true
        entry = {("on" if key is True else key): value for key, value in entry.items()}
    unknown = sorted(map(str, set(entry) - set(_ENTRY_KEYS)))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; valid keys are: {', '.join(_ENTRY_KEYS)}")
    if ("webhook" in entry) == ("class" in entry):
        raise ValueError("needs exactly one of webhook (a URL to POST to) or class (a notifier's import path)")
    on = entry.get("on", list(OUTCOMES))
    on = [on] if isinstance(on, str) else on
    if not isinstance(on, list) or not on or any(o not in OUTCOMES for o in on):
        raise ValueError(f"on {entry.get('on')!r} must be a list of: {', '.join(OUTCOMES)}")
    if "webhook" in entry:
        if "kwargs" in entry:
            raise ValueError("kwargs go with class, not webhook")
        timeout = entry.get("timeout", DEFAULT_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout {timeout!r} must be a number of seconds > 0")
        return NotifyTarget(on=frozenset(on), webhook=_check_webhook(entry["webhook"]), timeout=float(timeout))
    if "timeout" in entry:
        raise ValueError("timeout goes with webhook; give a class its own settings in kwargs")
    path = entry["class"]
    if not isinstance(path, str) or not path.strip():
        raise ValueError("class must be a notifier's import path, e.g. "
                         "airflow.providers.slack.notifications.slack.SlackNotifier")
    kwargs = entry.get("kwargs") or {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError("kwargs must be a mapping of the notifier's arguments")
    cls = _import_class(path.strip())
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # nothing to check the kwargs against: the first notification will
        signature = None
    if signature is not None:
        try:
            signature.bind(**kwargs)
        except TypeError as exc:
            raise ValueError(f"kwargs do not fit {path.strip()}: {exc}") from None
    return NotifyTarget(on=frozenset(on), class_path=path.strip(), kwargs=dict(kwargs))


def parse_notify(value: Any) -> tuple[NotifyTarget, ...]:
    """A portal's ``notify:`` list; ValueError naming the bad entry (``notify[1]: ...``)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError("notify must be a list of entries, each with webhook or class")
    targets = []
    for index, entry in enumerate(value):
        try:
            targets.append(_target(entry))
        except ValueError as exc:
            raise ValueError(f"notify[{index}]: {exc}") from None
    return tuple(targets)


# -- what is sent ---------------------------------------------------------------------------------
def dag_run_url(dag_id: str | None, dag_run_id: str | None) -> str | None:
    """The DAG run in the Airflow UI, under [api] base_url."""
    if not dag_id or not dag_run_id:
        return None
    try:
        from airflow.sdk.configuration import conf

        base = conf.get("api", "base_url", fallback=None)
    except Exception:  # configuration unreadable: a link to localhost is still a hint
        base = None
    return f"{(base or 'http://localhost:8080').rstrip('/')}/dags/{quote(dag_id, safe='')}/runs/{quote(dag_run_id, safe='')}"


def commit_outcomes(stats: Mapping[str, Any]) -> list[str]:
    """What a committed run has to say: degraded (embeddings skipped, removals withheld), review."""
    out = []
    if stats.get("skipped") or stats.get("removals_withheld"):
        out.append("degraded")
    if stats.get("review"):
        out.append("review")
    return out


def _message(portal: str, outcome: str, run_id: int | None, counts: Mapping[str, int], error: str | None) -> str:
    run = f"run {run_id} of {portal}" if run_id is not None else f"the run of {portal}"
    if outcome == "failed":
        return f"Harvest {run} failed: {error or 'see the DAG run'}"
    parts = []
    if counts.get("skipped"):
        parts.append(f"{counts['skipped']} datasets without vectors (embedding deferred: breaker open)")
    if counts.get("removals_withheld"):
        parts.append(f"{counts['removals_withheld']} removals withheld by the removal guard (trigger with "
                     "force_removals if they are real)")
    if counts.get("review"):
        parts.append(f"{counts['review']} changes need review")
    changed = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("created", "updated", "removed"))
    return f"Harvest {run} committed ({changed}): " + "; ".join(parts)


def payload(portal: str, outcomes: list[str], *, dag_id: str | None, dag_run_id: str | None,
            run_id: int | None, stats: Mapping[str, Any] | None, error: str | None = None) -> dict:
    """What WebhookNotifier posts, and what other notifiers find as ``harvester`` in their context."""
    counts = {key: int((stats or {}).get(key) or 0) for key in COUNT_KEYS}
    out = {"portal": portal, "dag_id": dag_id, "dag_run_id": dag_run_id, "run_id": run_id,
           "outcome": outcomes[0], "outcomes": list(outcomes), "counts": counts,
           "url": dag_run_url(dag_id, dag_run_id)}
    if error:
        out["error"] = error[:1000]
    out["message"] = _message(portal, outcomes[0], run_id, counts, error)
    return out


def _from_context(context: Mapping[str, Any]) -> dict:
    """The payload: the harvester's, or, for a notifier used as any DAG's callback, what the context tells."""
    if isinstance(context.get("harvester"), dict):
        return context["harvester"]
    dag = context.get("dag")
    dag_run = context.get("dag_run")
    dag_id = getattr(dag, "dag_id", None)
    dag_run_id = getattr(dag_run, "run_id", None) or context.get("run_id")
    failed = bool(context.get("exception")) or "fail" in str(context.get("reason") or "")
    return {"portal": None, "dag_id": dag_id, "dag_run_id": dag_run_id, "run_id": None,
            "outcome": "failed" if failed else str(context.get("reason") or "unknown"), "counts": {},
            "url": dag_run_url(dag_id, dag_run_id)}


class WebhookNotifier(BaseNotifier):
    """POSTs the run's outcome as JSON: portal, dag_id, dag_run_id, run_id, outcome, outcomes,
    counts, url (the DAG run in the Airflow UI), message, and error for a failed run. A receiver
    that does not answer within ``timeout`` seconds or answers an HTTP error raises
    NotificationError, naming the receiver by scheme and host only."""

    template_fields = ()  # the URL is never templated (nor logged)

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT, **kwargs):
        super().__init__(**kwargs)
        self.url = url
        self.timeout = float(timeout)
        try:  # Airflow masks it (and its path, where tokens go) in logs from now on, whoever logs it
            from airflow.sdk.log import mask_secret

            mask_secret(url)
            parts = urlsplit(url)
            if parts.path.strip("/") or parts.query:
                mask_secret(parts.path + (f"?{parts.query}" if parts.query else ""))
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"WebhookNotifier({redact_url(self.url)})"

    def notify(self, context) -> None:
        import requests

        body = _from_context(context)
        where = redact_url(self.url)
        error = None
        try:
            response = requests.post(self.url, json=body, timeout=self.timeout,
                                     headers={"User-Agent": "harvester-notify"})
        except requests.Timeout:
            error = NotificationError(f"webhook {where} did not answer within {self.timeout:g}s")
        except requests.RequestException as exc:
            error = NotificationError(f"webhook {where} could not be reached ({type(exc).__name__})")
        else:
            if response.status_code >= 400:
                error = NotificationError(f"webhook {where} answered HTTP {response.status_code}")
        if error is not None:
            raise error  # outside the except block: no chained exception carrying the URL
        log.info("notified webhook %s: %s", where, body.get("message") or body.get("outcome"))


# -- sending --------------------------------------------------------------------------------------
class _TemplatableDag:
    """dag.test() hands DAG callbacks the scheduler's serialized DAG, which has no Jinja
    environment for a notifier to render its templates with; this lends it the default one
    (what a harvest DAG's own would be: no macros, not native)."""

    render_template_as_native_obj = False

    def __init__(self, dag):
        self._dag = dag

    def __getattr__(self, name):
        return getattr(self._dag, name)

    def get_template_env(self, *, force_sandboxed: bool = False):
        from airflow.sdk.definitions._internal.templater import SandboxedEnvironment

        return SandboxedEnvironment(cache_size=0)


def announce(portal, outcomes: list[str], context: Mapping[str, Any] | None, *, run_id: int | None,
             stats: Mapping[str, Any] | None, error: str | None = None) -> int:
    """Send the run's outcome to each of the portal's notify targets that asked for one of
    ``outcomes`` (the first is the one reported). Never raises: a notifier that fails is a
    warning. Returns how many notifiers were called successfully."""
    sent = 0
    try:
        wanted = set(outcomes)
        targets = [t for t in portal.notify if t.on & wanted]
        if not targets:
            return 0
        context = dict(context or {})
        dag = context.get("dag")
        if dag is not None and not hasattr(dag, "get_template_env"):
            context["dag"] = _TemplatableDag(dag)
        dag_run = context.get("dag_run")
        body = payload(portal.name, list(outcomes), dag_id=getattr(dag, "dag_id", None) or portal.dag_id,
                       dag_run_id=getattr(dag_run, "run_id", None) or context.get("run_id"),
                       run_id=run_id, stats=stats, error=error)
    except Exception as exc:
        log.warning("could not announce the run of %s (the run is not affected): %s: %s",
                    portal.name, type(exc).__name__, str(exc)[:300])
        return 0
    for target in targets:
        try:
            notifier = target.build()
            notifier({**context, "harvester": dict(body)})  # each its own copy: notifiers add to it
            sent += 1
        except Exception as exc:  # never fail the run, never mask its failure
            log.warning("could not notify %s that run %s of %s is %s (the run is not affected): %s: %s",
                        target.label, run_id, portal.name, body["outcome"], type(exc).__name__, str(exc)[:300])
    return sent
