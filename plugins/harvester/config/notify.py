"""A portal's ``notify:`` list in portals.yaml: where its runs are announced, and which ones.

    notify:
      - webhook: ${HARVEST_WEBHOOK_URL}         # HTTP POST of JSON (pipeline/notify.py WebhookNotifier)
        on: [failed, degraded]                  # default: failed, degraded, review
      - class: airflow.providers.slack.notifications.slack.SlackNotifier
        kwargs: {slack_conn_id: slack_api_default, channel: "#data", text: "{{ harvester.message }}"}

Outcomes: ``failed`` (the DAG run failed), ``degraded`` (committed, but embeddings were skipped
while the breaker was open or the removal guard withheld removals), ``review`` (committed with
changes that need review). A clean run announces nothing.

Validated when portals.yaml is loaded: a class must import and be an Airflow notifier whose
signature takes its kwargs (that imports Airflow, only for portals that name a class). Webhook URLs
may hold secrets: they are kept as written (``${VAR}`` expanded when sent) and only ever shown as
scheme://host/… . Sending is pipeline/notify.py's business.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlsplit

from harvester.config.secrets import expand_env, redact_url

OUTCOMES = ("failed", "degraded", "review")
DEFAULT_TIMEOUT = 10.0
_ENTRY_KEYS = ("webhook", "class", "kwargs", "on", "timeout")


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
            return f"webhook {redact_url(expand_env(self.webhook or ''), hide_path=True)}"
        except ValueError:
            return "webhook (URL not set)"

    def __repr__(self) -> str:
        return f"NotifyTarget({self.label}, on={sorted(self.on)})"


def import_class(path: str) -> type:
    """The notifier class at dotted import ``path``; ValueError saying why it will not do."""
    from airflow.sdk import BaseNotifier

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
        raise ValueError(f"webhook {redact_url(url, hide_path=True) if parts.netloc else 'value'} "
                         "must be an http(s) URL")
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
    cls = import_class(path.strip())
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
