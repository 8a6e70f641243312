"""Whether a failure may pass: the one rule every error of the harvester follows.

An error says it through its ``transient`` attribute (a class attribute; a property when it depends
on the instance, as for a failed migration):

- ``transient = True``: the same work may succeed later. A portal or an embedding provider that did
  not answer (5xx, 429, timeouts, connection errors that outlived the HTTP retries), a database or
  secrets backend that could not be reached, a lock waited on too long, a portal another run holds.
  The task is retried by Airflow (HARVESTER_TASK_RETRIES, HARVESTER_TASK_RETRY_DELAY_SECS).
- ``transient = False``: trying again meets the same error. A rejected key, missing credentials,
  bad configuration (portals.yaml, a setting, the database connection, the embedding provider), a
  catalogue that is not one, a pgvector that cannot run, a migration whose SQL fails, a run that
  cannot be resumed. The task fails on its first try with the error's message; fix the cause,
  then clear the task.

An error that does not say is transient: an unexpected failure is retried, as Airflow does by
default. So a new error class that retrying cannot help declares ``transient = False``.

Pure: the task glue (pipeline/tasks.py) reads this; nothing here knows Airflow.
"""
from __future__ import annotations


def is_transient(exc: BaseException) -> bool:
    """True when trying the same work again later may succeed (the rule above)."""
    flag = getattr(exc, "transient", None)
    return flag if isinstance(flag, bool) else True
