"""One DAG per enabled portal in portals.yaml: harvest_<name>.

begin -> fetch_modified -> reconcile -> hash_compare -> embed_changed -> upsert. All logic is in the harvester
package (plugins/harvester); this file only wires tasks to it. A bad portals.yaml fails this file's
import with a message naming the bad entry, and leaves other DAG files alone.
"""
from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import Asset, Param, dag, task

from harvester import tasks
from harvester.portal import Portal, load_portals
from harvester.run import format_duration

DOC = """
### Harvest {name}
Harvests dataset metadata from the {kind} portal {url} into PostgreSQL + pgvector.

* **fetch_modified** lists datasets modified since the last completed run (minus a {lookback} overlap),
  or all of them on a full sync, into a per-run staging table. A DCAT catalogue is read whole every run
  (then a full sync), unless it answers that it did not change since the last one (HTTP 304).
* **reconcile** asks the portal for its count (one request); when it disagrees with ours, when asked
  (`reconcile`) or {reconcile_every}, lists every identifier (ids and modification times only),
  fetches what we lack or hold stale, and lets upsert remove what the portal no longer lists.
* **hash_compare** classifies them against what we hold: created, updated, unchanged, failed.
* **embed_changed** embeds only texts that have no vector yet (mapped over shards of them), through
  the embedding provider's shared circuit breaker; while it is open, datasets stay pending.
* **upsert** commits everything in one transaction (datasets, versions, changes, removals after a
  clean full sync or reconciliation) and moves the watermark, then emits the `harvester://{name}/datasets` Asset event.

Trigger with `reconcile` to compare the whole portal cheaply, with `full_sync` to re-read every record.
Backfills always run as full syncs.
A failed run changes nothing users see; the next run starts from the same watermark. After fixing
the cause, clear the failed task (with downstream) or the whole DAG run: the run resumes where it
failed, until the portal's next run supersedes it. One run writes the portal at a time: while
another is running (e.g. `harvester harvest`), begin fails naming it (Airflow retries later);
trigger with `takeover` to abort it. A run with no progress for {stale_after} is abandoned.
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
        tags=["harvester", portal.type, portal.name],
        doc_md=DOC.format(name=portal.name, url=portal.url, kind=portal.type,
                          lookback=format_duration(portal.lookback),
                          reconcile_every="when the last one is older than " + format_duration(portal.reconcile_every)
                          if portal.reconcile_every is not None else "(reconcile_every is off)",
                          stale_after=format_duration(portal.stale_after)),
        params={
            "full_sync": Param(False, type="boolean", title="Full sync",
                               description="List every dataset of the portal instead of only those "
                                           "modified since the last completed run."),
            "reconcile": Param(False, type="boolean", title="Reconcile",
                               description="Also list every identifier of the portal (ids and modification "
                                           "times only, a small fraction of a full sync), fetch what we lack or "
                                           "hold stale and remove what the portal no longer lists."),
            "force_removals": Param(False, type="boolean", title="Force removals",
                                    description="On a full sync or a reconciliation, mark datasets the portal no "
                                                "longer lists as "
                                                f"removed even if they are more than {portal.max_removal_share:.0%} "
                                                "of the portal (the guard against a half-broken portal)."),
            "takeover": Param(False, type="boolean", title="Take over",
                              description="If another run of this portal is running (e.g. `harvester harvest` "
                                          "from the CLI), abort it and run this one instead of waiting for it."),
        },
        default_args={
            "retries": int(os.environ.get("HARVESTER_TASK_RETRIES", "3")),
            "retry_delay": timedelta(seconds=int(os.environ.get("HARVESTER_TASK_RETRY_DELAY_SECS", "30"))),
            "retry_exponential_backoff": True,
            "max_retry_delay": timedelta(minutes=10),
            # Shorter than stale_after: a task still alive is never taken for a dead one.
            "execution_timeout": portal.stale_after * 3 / 4,
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
        def reconcile(run: dict):
            return tasks.reconcile(portal, run)

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
            return tasks.upsert(portal, run)  # emits an Asset event (counts), announces degraded runs

        run = begin()
        embed_changed.expand(work=hash_compare(reconcile(fetch_modified(run)))) >> upsert(run)

    return harvest()


for _portal in load_portals():
    if _portal.enabled:
        globals()[_portal.dag_id] = build(_portal)
