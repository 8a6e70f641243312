"""The Harvester plugin from Airflow's plugins folder (a checkout or mounted plugins/ folder).

A pip-installed Harvester registers the same plugin as the ``airflow.plugins`` entry point
``harvester`` (pyproject.toml). When that entry point is installed, this file exposes nothing and
Airflow loads the plugin once, from the entry point; otherwise the plugin comes from here.
"""
from __future__ import annotations

from importlib.metadata import entry_points

ENTRY_POINT = "harvester.ui.plugin:HarvesterPlugin"

if not any(ep.value.replace(" ", "") == ENTRY_POINT for ep in entry_points(group="airflow.plugins")):
    from harvester.ui.plugin import HarvesterPlugin  # noqa: F401  found by Airflow's plugins manager
