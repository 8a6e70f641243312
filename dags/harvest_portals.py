"""One DAG per enabled portal in portals.yaml: harvest_<name>.

begin -> fetch_modified -> reconcile -> hash_compare -> embed_changed -> upsert. All logic is in the harvester
package (plugins/harvester); this file only wires tasks to it. A bad portals.yaml fails this file's
import with a message naming the bad entry, and leaves other DAG files alone.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Asset, Param, dag, task

from harvester.pipeline import tasks
from harvester.config.portals import Portal, load_portals
from harvester.config.secrets import redact_url
from harvester.config.settings import task_settings
from harvester.domain.run import DAG_RUN_TIMEOUT, format_duration

SETTINGS = task_settings()  # a bad value fails this file's import, naming the variable

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
* **embed_changed** embeds only texts that have no vector yet (mapped over shards of them, in the
  Airflow pool `{pool}`: `HARVESTER_EMBEDDING_POOL`), through
  the embedding provider's shared circuit breaker; while it is open, datasets stay pending.
* **upsert** commits everything in one transaction (datasets, versions, changes, removals after a
  clean full sync or reconciliation) and moves the watermark, then emits the `harvester://{name}/datasets` Asset event.

Trigger with `reconcile` to compare the whole portal cheaply, with `full_sync` to re-read every record.
A failed run changes nothing users see; the next run starts from the same watermark. After fixing
the cause, clear the failed task (with downstream) or the whole DAG run: the run resumes where it
failed, until the portal's next run supersedes it. One run writes the portal at a time: while
another is running (e.g. `harvester harvest`), **begin** waits for it, a sensor in reschedule mode
that holds no worker slot: it logs which run holds the portal, checks again every {busy_poll}, and
fails naming it after {busy_wait} (`HARVESTER_BUSY_POLL_SECS`, `HARVESTER_BUSY_WAIT_SECS`).
Trigger with `takeover` to abort that run instead. A run with no progress for {stale_after} is abandoned.

**Backfills mean one full sync.** A portal has no past to replay: each backfill date would read the
same portal as it is now. The first backfill DAG run to begin syncs the portal in full; the others
wait for that sync while it runs, and are covered by it once it committed (for
{backfill_cover}, `HARVESTER_BACKFILL_COVER_SECS`; 0: every backfill DAG run syncs): their begin
logs the run (run id and DAG run id) that did the work and adds itself to that run's
`sync_runs.covered_dag_runs`, their other tasks are skipped and the DAG run succeeds, with no Asset
event or notice of its own. If that sync failed, the next backfill DAG run syncs the portal itself.
To sync again within that time, trigger the DAG with `full_sync`.
"""


def build(portal: Portal):
    @dag(
        dag_id=portal.dag_id,
        description=f"Harvest {redact_url(portal.url)}",  # shown to every Airflow user: never a secret
        schedule=portal.schedule,
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=1,
        dagrun_timeout=DAG_RUN_TIMEOUT,
        tags=["harvester", portal.type, portal.name],
        doc_md=DOC.format(name=portal.name, url=redact_url(portal.url), kind=portal.type,
                          lookback=format_duration(portal.lookback),
                          reconcile_every="when the last one is older than " + format_duration(portal.reconcile_every)
                          if portal.reconcile_every is not None else "(reconcile_every is off)",
                          stale_after=format_duration(portal.stale_after),
                          busy_poll=format_duration(SETTINGS.busy_poll), busy_wait=format_duration(SETTINGS.busy_wait),
                          backfill_cover=format_duration(SETTINGS.backfill_cover), pool=SETTINGS.embedding_pool),
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
            "retries": SETTINGS.retries,
            "retry_delay": SETTINGS.retry_delay,
            "retry_exponential_backoff": True,
            "max_retry_delay": timedelta(minutes=10),
            # Shorter than stale_after: a task still alive is never taken for a dead one.
            "execution_timeout": portal.stale_after * 3 / 4,
            "on_failure_callback": tasks.on_task_failure(portal),
        },
        on_failure_callback=tasks.on_dag_failure(portal),
    )
    def harvest():
        # Each task's log ends with its own table of what it did (pipeline/tasks.py), so Airflow's
        # one-line dump of the returned dict (XCom: counts) is left out of it.
        # A sensor in reschedule mode: while another run holds the portal it frees its worker slot
        # between checks; its own limit (busy_wait) fails it naming that run, before this backstop.
        @task.sensor(poke_interval=SETTINGS.busy_poll, timeout=SETTINGS.busy_wait + 2 * SETTINGS.busy_poll,
                     mode="reschedule")
        def begin():
            return tasks.begin(portal, SETTINGS)

        @task(show_return_value_in_logs=False)
        def fetch_modified(run: dict):
            return tasks.fetch_modified(portal, run)

        @task(show_return_value_in_logs=False)
        def reconcile(run: dict):
            return tasks.reconcile(portal, run)

        @task(show_return_value_in_logs=False)
        def hash_compare(run: dict):
            return tasks.hash_compare(portal, run)  # the shards embed_changed maps over

        # Mapped over shards of the pending texts: one task for a normal run, several for a big
        # first sync, so a Celery or Kubernetes executor spreads them over workers.
        @task(pool=SETTINGS.embedding_pool, show_return_value_in_logs=False)
        def embed_changed(work: dict):
            return tasks.embed_changed(portal, work)

        @task(outlets=[Asset(tasks.asset_uri(portal))], show_return_value_in_logs=False)
        def upsert(run: dict):
            return tasks.upsert(portal, run)  # emits an Asset event (counts), announces degraded runs

        run = begin()
        embed_changed.expand(work=hash_compare(reconcile(fetch_modified(run)))) >> upsert(run)

    return harvest()


for _portal in load_portals():
    if _portal.enabled:
        globals()[_portal.dag_id] = build(_portal)
