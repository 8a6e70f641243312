"""Telling people about the runs that need them, through Airflow notifiers.

A portal's ``notify:`` list in portals.yaml (config/notify.py: its targets, validated when the
file is loaded) names where its runs are announced and which ones: failed, degraded, review. A
clean run announces nothing.

Any ``BaseNotifier`` subclass works by import path, unchanged: it is called as Airflow calls it,
with the task's context, plus ``harvester`` (the payload WebhookNotifier posts) for its templates.
A notifier that fails is logged as a warning and never fails the run nor hides its failure.
Webhook URLs may hold secrets: they are expanded from the environment when sent and only ever
shown as scheme://host/…
"""
from __future__ import annotations

import logging
from typing import Any, Mapping
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseNotifier

from harvester.config.notify import DEFAULT_TIMEOUT, NotifyTarget, import_class
from harvester.config.secrets import expand_env, mask, redact_text, redact_url
from harvester.domain.outcomes import CODES, ERROR

log = logging.getLogger(__name__)

# The counts a notification carries (of the run's stats; 0 when absent).
COUNT_KEYS = ("fetched", "created", "updated", "unchanged", "removed", "failed", "skipped", "review",
              "removals_withheld")


class NotificationError(RuntimeError):
    """A notification could not be delivered; the message never holds a secret."""


def notifier(target: NotifyTarget) -> BaseNotifier:
    """A fresh notifier for ``target`` (Airflow renders templates into a notifier's attributes, for good)."""
    if target.class_path:
        return import_class(target.class_path)(**target.kwargs)
    return WebhookNotifier(url=expand_env(target.webhook or ""), timeout=target.timeout)


# -- what is sent ---------------------------------------------------------------------------------
def _base_url() -> str:
    """Airflow's [api] base_url (where its UI and the Harvester page are served)."""
    try:
        from airflow.sdk.configuration import conf

        base = conf.get("api", "base_url", fallback=None)
    except Exception:  # configuration unreadable: a link to localhost is still a hint
        base = None
    return (base or "http://localhost:8080").rstrip("/")


def dag_run_url(dag_id: str | None, dag_run_id: str | None) -> str | None:
    """The DAG run in the Airflow UI, under [api] base_url."""
    if not dag_id or not dag_run_id:
        return None
    return f"{_base_url()}/dags/{quote(dag_id, safe='')}/runs/{quote(dag_run_id, safe='')}"


def report_url(run_id: int | None) -> str | None:
    """The run's page on the Harvester page (its records' errors and warnings, grouped)."""
    return None if run_id is None else f"{_base_url()}/harvester/runs/{int(run_id)}"


def commit_outcomes(stats: Mapping[str, Any]) -> list[str]:
    """What a committed run has to say: degraded (records failed, embeddings skipped, removals
    withheld), review."""
    out = []
    if stats.get("failed") or stats.get("skipped") or stats.get("removals_withheld"):
        out.append("degraded")
    if stats.get("review"):
        out.append("review")
    return out


def _reasons_text(reasons: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {code}" for code, n in reasons.items())


def _message(portal: str, outcome: str, run_id: int | None, counts: Mapping[str, int], error: str | None,
             reasons: Mapping[str, int] | None = None) -> str:
    run = f"run {run_id} of {portal}" if run_id is not None else f"the run of {portal}"
    errors = {c: n for c, n in (reasons or {}).items() if CODES.get(c) and CODES[c].severity == ERROR}
    if outcome == "failed":
        text = f"Harvest {run} failed: {error or 'see the DAG run'}"
        return text + (f" (records: {_reasons_text(errors)})" if errors and "records: " not in text else "")
    parts = []
    if counts.get("failed"):
        parts.append(f"{counts['failed']} records failed" + (f" ({_reasons_text(errors)})" if errors else ""))
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
            run_id: int | None, stats: Mapping[str, Any] | None, error: str | None = None,
            reasons: Mapping[str, int] | None = None) -> dict:
    """What WebhookNotifier posts, and what other notifiers find as ``harvester`` in their context.
    ``reasons``: the run's per-record outcomes per reason code (store.outcomes.by_code)."""
    counts = {key: int((stats or {}).get(key) or 0) for key in COUNT_KEYS}
    error = redact_text(error) if error else error  # a URL in it without its secrets, like every error shown
    out = {"portal": portal, "dag_id": dag_id, "dag_run_id": dag_run_id, "run_id": run_id,
           "outcome": outcomes[0], "outcomes": list(outcomes), "counts": counts,
           "reasons": {str(c): int(n) for c, n in (reasons or {}).items()},
           "url": dag_run_url(dag_id, dag_run_id), "report_url": report_url(run_id)}
    if error:
        out["error"] = error[:1000]
    out["message"] = _message(portal, outcomes[0], run_id, counts, error, reasons)
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
    counts, reasons (the run's record outcomes per reason code), url (the DAG run in the Airflow
    UI), report_url (the run's page on the Harvester page), message, and error for a failed run. A receiver
    that does not answer within ``timeout`` seconds or answers an HTTP error raises
    NotificationError, naming the receiver by scheme and host only."""

    template_fields = ()  # the URL is never templated (nor logged)

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT, **kwargs):
        super().__init__(**kwargs)
        self.url = url
        self.timeout = float(timeout)
        # Airflow masks it (and its path, where tokens go) in logs from now on, whoever logs it.
        mask(url)
        try:
            parts = urlsplit(url)
        except ValueError:  # no path to tell apart; the request will say what is wrong
            parts = None
        if parts is not None and (parts.path.strip("/") or parts.query):
            mask(parts.path + (f"?{parts.query}" if parts.query else ""))

    def __repr__(self) -> str:
        return f"WebhookNotifier({redact_url(self.url, hide_path=True)})"

    def notify(self, context) -> None:
        import requests

        body = _from_context(context)
        where = redact_url(self.url, hide_path=True)
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
             stats: Mapping[str, Any] | None, error: str | None = None,
             reasons: Mapping[str, int] | None = None) -> int:
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
                       run_id=run_id, stats=stats, error=error, reasons=reasons)
    except Exception as exc:
        log.warning("could not announce the run of %s (the run is not affected): %s: %s",
                    portal.name, type(exc).__name__, redact_text(str(exc))[:300])
        return 0
    for target in targets:
        try:
            notifier(target)({**context, "harvester": dict(body)})  # each its own copy: notifiers add to it
            sent += 1
        except Exception as exc:  # never fail the run, never mask its failure
            log.warning("could not notify %s that run %s of %s is %s (the run is not affected): %s: %s",
                        target.label, run_id, portal.name, body["outcome"], type(exc).__name__,
                        redact_text(str(exc))[:300])
    return sent
