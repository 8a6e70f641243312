"""One harvest run as plain functions: begin, fetch_modified, hash_compare, embed_changed, upsert.

Connections are in autocommit mode; what must be atomic runs in an explicit transaction.
Each takes what it works with (a portal, a run id, a database connection, a CKAN client, an
embedding provider) and returns counts only: dataset content moves through PostgreSQL, never
through the caller (in Airflow, never through XCom). Airflow-free: tasks.py wires these to Airflow.
"""
from __future__ import annotations

import logging
import math
import time

from . import dataset as ds
from .ckan import CkanClient, CkanError, FilterRejected, PortalUnavailable
from .embedder import EmbedSettings, embed_pending, plan_shards
from .embeddings.base import EmbeddingProvider
from .portal import Portal
from .run import FULL, SAVINGS_KEYS, STAT_KEYS, Progress, plan_run, summary
from .store import datasets, history, runs, staging, vectors

log = logging.getLogger(__name__)


def begin(conn, portal: Portal, *, dag_run_id: str | None = None, full_sync: bool = False,
          backfill: bool = False) -> dict:
    """Open a run: decide full or incremental from the watermark, record it as running."""
    plan = plan_run(runs.watermark(conn, portal.url), full_sync=full_sync, backfill=backfill,
                    lookback=portal.lookback)
    run = runs.start(conn, portal_url=portal.url, portal_name=portal.name, dag_run_id=dag_run_id,
                     mode=plan.mode, since=plan.since)
    log.info("run %s of %s: %s sync, %s", run.run_id, portal.name, run.mode, plan.reason)
    return {"run_id": run.run_id, "mode": run.mode}


def client_for(portal: Portal, **overrides) -> CkanClient:
    settings = {"politeness_delay": portal.politeness_delay, "max_retries": portal.max_retries,
                "timeout": portal.timeout, **overrides}
    return CkanClient(portal.url, **settings)


def _stage_listing(conn, portal: Portal, run_id: int, client: CkanClient, since) -> dict:
    staging.clear(conn, run_id)
    progress = Progress(f"fetch_modified {portal.name}", None, log)
    seq = fetched = failed = 0
    for page in client.iter_pages(since, page_size=portal.page_size):
        progress.total = getattr(client, "total", None) or progress.total
        records = [ds.normalize(pkg, portal.url) for pkg in page]
        seq += staging.write(conn, run_id, seq, records)
        bad = [r for r in records if not r.ok]
        for rec in bad:
            log.warning("record failed: %s", rec.error)
        failed += len(bad)
        fetched += len(records) - len(bad)
        progress.advance(len(records))
    return {"fetched": fetched, "failed": failed}


def fetch_modified(conn, portal: Portal, run_id: int, client: CkanClient) -> dict:
    """Stream the portal's modified records (all of them on a full sync) into staging, page by page."""
    run = runs.require_running(conn, run_id)
    started = time.monotonic()
    try:
        counts = _stage_listing(conn, portal, run_id, client, run.since if run.mode != FULL else None)
    except PortalUnavailable:
        raise  # transient: let the task retry rather than hammer a struggling portal with a full listing
    except CkanError as exc:
        if run.mode == FULL:
            raise
        why = "the portal rejected the modified-since filter" if isinstance(exc, FilterRejected) else "the incremental request failed"
        log.warning("%s (%s); falling back to a full sync of %s", why, exc, portal.name)
        runs.set_mode(conn, run_id, FULL, None)
        counts = _stage_listing(conn, portal, run_id, client, None)
    counts["portal_requests"] = client.requests_made
    runs.add_stats(conn, run_id, counts)
    log.info("fetch_modified done in %.1fs: %s", time.monotonic() - started,
             summary(counts, ("fetched", "failed", "portal_requests")))
    return {"run_id": run_id, **counts}


def hash_compare(conn, reader, portal: Portal, run_id: int, model: str | None = None,
                 settings: EmbedSettings | None = None) -> dict:
    """Classify staged records against what we hold (created, updated, unchanged, failed) and work
    out each new and updated dataset's change (type, fields, significance) into staging;
    ``reader`` is a second connection that streams them. With the provider's ``model``, also plan
    how many embed_changed tasks the pending texts need."""
    runs.require_running(conn, run_id)
    counts = datasets.classify(conn, run_id, portal.url)
    runs.add_stats(conn, run_id, counts)
    out = {"run_id": run_id, **counts}
    detected = history.compute_changes(conn, reader, run_id, portal.url, portal.significance)
    out["review"] = detected.get("review", 0)
    if model is not None:
        pending = vectors.count_pending(conn, run_id, portal.url, model)
        shards = plan_shards(pending, settings or EmbedSettings.from_env())
        out["pending_texts"] = pending
        out["embed_shards"] = [{"run_id": run_id, "shard": i, "shards": shards} for i in range(shards)]
    log.info("hash_compare done: %s", summary(out, ("created", "updated", "unchanged", "failed", "review", "pending_texts")))
    return out


def embed_changed(conn, reader, portal: Portal, run_id: int, provider: EmbeddingProvider, *,
                  shard: int = 0, shards: int = 1, settings: EmbedSettings | None = None,
                  breaker_config=None) -> dict:
    """Embed every text of the portal (in this shard) that has no vector for the provider's model
    yet: this run's new and changed texts and whatever earlier runs left pending, each distinct
    text once, through the shared circuit breaker. ``reader`` streams the pending texts."""
    runs.require_running(conn, run_id)
    counts = embed_pending(conn, reader, portal.url, run_id, provider, shard=shard, shards=shards,
                           settings=settings, breaker_config=breaker_config, label=f"{portal.name} ")
    return {"run_id": run_id, "shard": shard, **counts}


def upsert(conn, portal: Portal, run_id: int, model: str, max_batch: int = 1, *,
           force_removals: bool = False) -> dict:
    """One transaction: staging merged into datasets, vectors linked, versions and changes written,
    datasets gone from a clean full sync marked removed, the run's stats written, the watermark
    moved to the run's start, the run's staging dropped."""
    done = runs.get(conn, run_id)
    if done.status == "committed":
        # A retry of a task whose commit went through (the worker died after it): nothing to redo.
        log.info("run %s of %s is already committed", run_id, portal.name)
        return {"run_id": run_id, **done.stats}
    with conn.transaction():
        run = runs.require_running(conn, run_id)
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (portal.url,))
        reuse = vectors.reuse(conn, run_id, model, run.started_at)
        reuse["embedding_calls_saved"] = math.ceil(reuse["embeddings_reused"] / max(1, max_batch))
        merged = datasets.merge(conn, run_id, portal.url, run.started_at, model)
        written = history.write_history(conn, run_id, portal.url, run.started_at)
        removals = {"removed": 0}
        if run.mode == FULL:
            # A run that reached upsert listed the whole portal: every page, nothing skipped.
            removals = history.apply_removals(
                conn, run_id, portal.url, run.started_at, max_share=portal.max_removal_share,
                force=force_removals, removed_significance=portal.significance.removed,
                review_threshold=portal.significance.review_threshold)
        review = conn.execute("SELECT count(*) FROM dataset_changes WHERE run_id = %s AND requires_review",
                              (run_id,)).fetchone()[0]
        stats = {**run.stats, **reuse, **merged, "removed": removals.get("removed", 0), "review": int(review),
                 "versions": written.get("versions", 0)}
        if removals.get("removal_guard_tripped"):
            stats["removals_withheld"] = removals.get("would_remove", 0)
        runs.commit(conn, run, stats, datasets_synced=stats.get("fetched", 0))
        staging.clear(conn, run_id)
        final = runs.get(conn, run_id).stats
    if final.get("skipped"):
        log.warning("%d changed datasets have no vector yet (embedding deferred); the next run embeds them",
                    final["skipped"])
    log.info("upsert committed run %s of %s (%s): %s", run_id, portal.name, run.mode,
             summary(final, STAT_KEYS + SAVINGS_KEYS + ("review", "versions")))
    return {"run_id": run_id, **final}


def abort(conn, run_id: int, error: str, status: str = "failed") -> bool:
    """Mark a run failed (or cancelled): nothing users see changes, the watermark stays."""
    done = runs.abort(conn, run_id, status, error)
    if done:
        log.warning("run %s %s: %s", run_id, status, error)
    return done


def harvest(conn, reader, portal: Portal, client: CkanClient, provider: EmbeddingProvider, *,
            full_sync: bool = False, force_removals: bool = False, dag_run_id: str | None = None) -> dict:
    """A whole run in one call (the CLI's `harvester harvest`); a failure marks the run failed."""
    run_id = begin(conn, portal, dag_run_id=dag_run_id, full_sync=full_sync)["run_id"]
    try:
        fetch_modified(conn, portal, run_id, client)
        hash_compare(conn, reader, portal, run_id, provider.model)
        embed_changed(conn, reader, portal, run_id, provider)
        return upsert(conn, portal, run_id, provider.model, provider.max_batch)
    except BaseException as exc:
        abort(conn, run_id, f"{type(exc).__name__}: {exc}")
        raise
