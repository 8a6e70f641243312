"""Example consumer: logs the dataset changes that need review whenever a harvest commits.

Scheduled on the Asset events of every enabled portal's upsert (harvester://<portal>/datasets),
so it runs only after something was harvested; on events of runs that changed nothing and have
nothing to review it does nothing, and says so in its log. It is created paused: unpause it in
the UI to use it, or copy it as a starting point for alerts (email, Slack, a ticket per review).
"""
from __future__ import annotations

from datetime import datetime

from airflow.sdk import Asset, dag, task

from harvester.config.portals import load_portals
from harvester.pipeline.tasks import asset_uri

_assets = [Asset(asset_uri(p)) for p in load_portals() if p.enabled]

if _assets:
    schedule = _assets[0]
    for _asset in _assets[1:]:
        schedule = schedule | _asset

    @dag(dag_id="review_changes", schedule=schedule, start_date=datetime(2024, 1, 1), catchup=False,
         is_paused_upon_creation=True, tags=["harvester", "example"], doc_md=__doc__)
    def review_changes():
        @task
        def log_changes_needing_review():
            from airflow.sdk import get_current_context

            from harvester.pipeline import review

            return review.log_triggering_changes(get_current_context())

        log_changes_needing_review()

    review_changes()
