"""An Airflow auth manager with per-DAG edit rights, for tests of who may write what.

Airflow's simple auth manager grants by role alone: whoever may edit one DAG may edit them all. Real
deployments often grant per DAG (the FAB auth manager's "DAG:<dag_id>" permissions, a policy of
another auth manager): a user may edit ``harvest_national`` and not ``harvest_aggregator``.
``PerDagAuthManager`` is the simple auth manager with such a policy on top, read from Airflow's
configuration (``AIRFLOW__HARVESTER_TESTING__DAG_EDITORS``, as the simple manager's users come
from ``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS``)::

    nat_editor=harvest_national;etl_editor=etl_daily

A user listed there may edit (any method but GET) only the DAGs listed for them, as a FAB user
with per-DAG permissions and no "all DAGs" permission: ``is_authorized_dag`` without a DAG
(Airflow's question "all DAGs?") is False for them. Reading, and every user not listed, is
exactly the simple auth manager. Point Airflow at it with
``AIRFLOW__CORE__AUTH_MANAGER=harvester.testing.per_dag_auth.PerDagAuthManager``.
"""
from __future__ import annotations

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

AUTH_MANAGER = f"{__name__}.PerDagAuthManager"
SECTION, KEY = "harvester_testing", "dag_editors"


def dag_editors() -> dict[str, frozenset[str]]:
    """user -> the DAG ids they may edit, from Airflow's configuration."""
    from airflow.configuration import conf

    out = {}
    for entry in (conf.get(SECTION, KEY, fallback="") or "").split(";"):
        user, _, dags = entry.strip().partition("=")
        if user.strip():
            out[user.strip()] = frozenset(d.strip() for d in dags.split(",") if d.strip())
    return out


def policy(editors: dict[str, list[str] | set[str]]) -> str:
    """The configuration value of ``editors`` (user -> DAG ids)."""
    return ";".join(f"{user}={','.join(sorted(dags))}" for user, dags in editors.items())


class PerDagAuthManager(SimpleAuthManager):
    """The simple auth manager, with the edit rights of the users of ``dag_editors()`` per DAG."""

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        allowed = super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
        if method == "GET" or not allowed:
            return allowed
        editable = dag_editors().get(user.get_name())
        if editable is None:
            return allowed
        return bool(details and details.id and details.id in editable)
