"""One DAG per enabled portal in portals.yaml: harvest_<name>.

begin -> fetch_modified -> hash_compare -> embed_changed -> upsert. All logic is in the harvester
package (plugins/harvester); this file only wires tasks to it. A bad portals.yaml fails this file's
import with a message naming the bad entry, and leaves other DAG files alone.
"""
from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import Asset, Param, dag, task

from harvester import tasks
from harvester.portal import Portal, load_portals

DOC = """
### Harvest {name}
Harvests dataset metadata from the CKAN portal {url} into PostgreSQL + pgvector.

* **fetch_modified** lists datasets modified since the last completed run (minus a {lookback} overlap),
  or all of them on a full sync, into a per-run staging table.
* **hash_compare** classifies them against what we hold: created, updated, unchanged, failed.
* **embed_changed** embeds only texts that have no vector yet (mapped over shards of them), through
  the embedding provider's shared circuit breaker; while it is open, datasets stay pending.
* **upsert** commits everything in one transaction (datasets, versions, changes, removals after a
  clean full sync) and moves the watermark, then emits the `harvester://{name}/datasets` Asset event.

Trigger with `full_sync` to re-list the whole portal. Backfills always run as full syncs.
A failed run changes nothing users see; the next run starts from the same watermark.
"""


def build(portal: Portal):
    @dag(
        dag_id=portal.dag_id,
        description=f"Harvest {portal.url}",
        schedule=portal.schedule,
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=1,
        dagrun_timeout=timedelta(hours=12),
        tags=["harvester", "ckan", portal.name],
        doc_md=DOC.format(name=portal.name, url=portal.url, lookback=portal.lookback),
        params={
            "full_sync": Param(False, type="boolean", title="Full sync",
                               description="List every dataset of the portal instead of only those "
                                           "modified since the last completed run."),
            "force_removals": Param(False, type="boolean", title="Force removals",
                                    description="On a full sync, mark datasets the portal no longer lists as "
                                                f"removed even if they are more than {portal.max_removal_share:.0%} "
                                                "of the portal (the guard against a half-broken portal)."),
        },
        default_args={
            "retries": int(os.environ.get("HARVESTER_TASK_RETRIES", "3")),
            "retry_delay": timedelta(seconds=int(os.environ.get("HARVESTER_TASK_RETRY_DELAY_SECS", "30"))),
            "retry_exponential_backoff": True,
            "max_retry_delay": timedelta(minutes=10),
            "on_failure_callback": tasks.on_task_failure(portal),
        },
        on_failure_callback=tasks.on_dag_failure(portal),
    )
    def harvest():
        @task
        def begin():
            return tasks.begin(portal)

        @task
        def fetch_modified(run: dict):
            return tasks.fetch_modified(portal, run)

        @task
        def hash_compare(run: dict):
            return tasks.hash_compare(portal, run)  # the shards embed_changed maps over

        # Mapped over shards of the pending texts: one task for a normal run, several for a big
        # first sync, so a Celery or Kubernetes executor spreads them over workers.
        @task(pool=os.environ.get("HARVESTER_EMBEDDING_POOL", "embedding_api"))
        def embed_changed(work: dict):
            return tasks.embed_changed(portal, work)

        @task(outlets=[Asset(tasks.asset_uri(portal))])
        def upsert(run: dict):
            return tasks.upsert(portal, run)  # emits an Asset event: created, updated, removed, review

        run = begin()
        embed_changed.expand(work=hash_compare(fetch_modified(run))) >> upsert(run)

    return harvest()


for _portal in load_portals():
    if _portal.enabled:
        globals()[_portal.dag_id] = build(_portal)
