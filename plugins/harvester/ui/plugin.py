"""The Airflow plugin: the Harvester app at /harvester, a "Harvester" entry in the navigation and
a "Harvester" tab on every DAG (for a harvest_<portal> DAG it shows that portal).

Registered twice over, on purpose, and loaded once: as the ``airflow.plugins`` entry point
``harvester`` of the package (pyproject.toml), for a pip-installed Harvester, and by
plugins/harvester_plugin.py in Airflow's plugins folder, which stands aside when that entry point
is installed (Airflow would otherwise find the plugin twice and report the second as an import
error).
"""
from __future__ import annotations

from urllib.parse import urlsplit

from airflow.plugins_manager import AirflowPlugin

from harvester.ui.app import PREFIX, app


def _ui_root() -> str:
    """The Airflow UI's path prefix: the path of [api] base_url, without its trailing slash."""
    try:
        from airflow.configuration import conf

        base = conf.get("api", "base_url", fallback="") or ""
    except Exception:  # noqa: BLE001  no readable configuration: Airflow at the root
        base = ""
    return urlsplit(base).path.rstrip("/")


class HarvesterPlugin(AirflowPlugin):
    name = "harvester"
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "Harvester"}]
    external_views = [
        # The top-level navigation entry: the portals, runs, changes and their review, search.
        {"name": "Harvester", "href": f"{_ui_root()}{PREFIX}/", "destination": "nav", "url_route": "harvester",
         "nav_top_level": True},
        # A tab on every DAG; Airflow fills in {DAG_ID}. A harvest DAG's tab shows its portal.
        {"name": "Harvester", "href": f"{_ui_root()}{PREFIX}/dags/{{DAG_ID}}", "destination": "dag",
         "url_route": "harvester-portal"},
    ]
