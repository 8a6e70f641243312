"""One harvest run as plain functions: begin, fetch_modified, reconcile, hash_compare, embed_changed, upsert.

Connections are in autocommit mode; what must be atomic runs in an explicit transaction.
Each takes what it works with (a portal, a run id, a database connection, the portal's source
(sources/: CKAN, DCAT data.json, DCAT-AP RDF; a bare CkanClient is taken as a CKAN source), an
embedding provider) and returns counts only: dataset content moves through PostgreSQL, never
through the caller (in Airflow, never through XCom). Airflow-free: tasks.py wires these to Airflow.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time

from harvester.domain import dataset as ds
from harvester.sources import CAPABILITIES, Listing, Source, as_source, count_kind, source_for  # noqa: F401  (source_for: tasks, CLI)
from harvester.sources.base import FilterRejected
from harvester.pipeline.readahead import read_ahead
from harvester.embeddings.batching import EmbedSettings, embed_pending, plan_shards
from harvester.embeddings.base import EmbeddingProvider
from harvester.config.portals import Portal
from harvester.domain.run import (FULL, INCREMENTAL, RECONCILE_KEYS, SAVINGS_KEYS, STAT_KEYS, count_drift, plan_run, summary)
from harvester.domain.tasklog import Progress
from harvester.store import (claims, datasets, deletions, duplicates, history, listing, outcomes, portal_indexes, review,
                             runs, staging, vectors)

log = logging.getLogger(__name__)


def begin(conn, portal: Portal, *, dag_run_id: str | None = None, full_sync: bool = False,
          backfill: bool = False, reconcile: bool = False, takeover: bool = False) -> dict:
    """Open a run: decide full or incremental from the watermark (and whether an incremental run
    reconciles), record it as running. Another running run of the portal makes this
    runs.RunInProgress, unless it made no progress for the portal's stale_after (it is marked
    abandoned) or ``takeover`` aborts it."""
    past = runs.status(conn, portal.url)
    if reconcile and not CAPABILITIES[portal.type].reconcile:
        log.info("%s is a %s catalogue, read whole on every run: there is nothing to reconcile", portal.name,
                 portal.type)
        reconcile = False
    plan = plan_run(past.watermark, full_sync=full_sync, backfill=backfill, lookback=portal.lookback,
                    reconcile=reconcile, last_full_sync=past.last_full_sync, full_sync_every=portal.full_sync_every,
                    last_reconciliation=past.last_reconciliation, reconcile_every=portal.reconcile_every)
    run = runs.start(conn, portal_url=portal.url, portal_name=portal.name, dag_run_id=dag_run_id,
                     mode=plan.mode, since=plan.since, reconcile_reason=plan.reconcile, takeover=takeover,
                     stale_after=portal.stale_after)
    claims.prune(conn)  # claims a killed worker left behind (a small table; they bind nobody already)
    # (the begin task's summary says it again, in its table)
    log.debug("run %s of %s: %s sync, %s%s", run.run_id, portal.name, run.mode, plan.reason,
              f"; reconciles: {run.reconcile_reason}" if run.reconcile_reason else "")
    return {"run_id": run.run_id, "mode": run.mode, "reason": plan.reason, "reconciles": run.reconcile_reason}


# Failed records a step names in the task log; the rest are counted (every one is a row of the
# run's report: `harvester report`, the run's page).
LOGGED_FAILURES = 20


def _stage(conn, run_id: int, seq: int, records: list[ds.DatasetRecord], logged: list[int],
           attempt) -> tuple[int, int]:
    """COPY normalized records into staging from ``seq`` on, if the run's staging is still this
    attempt's (``attempt``: runs.claim_staging's token; runs.AttemptSuperseded otherwise), logging
    the first LOGGED_FAILURES of the step's records that cannot be used (``logged``: how many the
    step logged so far, a one-item list); returns (how many were staged, how many of them failed).
    The records the portal says it deleted (``deleted``) go apart (store/deletions.py), after the
    page's records: they are not counted."""
    gone = [r for r in records if r.deleted]
    if gone:
        records = [r for r in records if not r.deleted]
    with runs.staging_page(conn, run_id, attempt):
        staging.write(conn, run_id, seq, records)
        if gone:
            deletions.write(conn, run_id, seq + len(records), gone)
        runs.touch(conn, run_id)
    bad = [r for r in records if not r.ok]
    for rec in bad:
        if logged[0] < LOGGED_FAILURES:
            log.warning("record failed: %s", rec.error)
        elif logged[0] == LOGGED_FAILURES:
            log.warning("more records failed: they are counted, not logged one by one; every one is in the run's "
                        "report (`harvester report %s`, the run's page on the Harvester page)", run_id)
        logged[0] += 1
    return len(records), len(bad)


def _stage_listing(conn, portal: Portal, run_id: int, source: Source, since, listing: Listing,
                   validators: dict | None = None, *, resume: bool = True) -> dict:
    """Stage the source's listing page by page, as the run's only writer of staging (an earlier
    attempt of the task still running stops at its next page: runs.claim_staging). The source
    reads (fetches, parses, normalizes) the next page in a thread of its own while this one is
    staged (pipeline/readahead.py): one item queued at most, a page or, for a source whose pages
    can be large (CKAN), a slice of a few MB of one; its errors reach the caller as they are; the
    thread has ended on return.

    What an earlier attempt of this listing staged is cleared (the listing starts over), unless
    the source can resume (``Capabilities.resumable``, a kind fetched one record a request) and
    ``resume``: then it is kept, the source is told its ids (``Listing.already_staged``) and skips
    them, and staging goes on after them."""
    attempt = runs.claim_staging(conn, run_id)
    seq = failed = 0
    kept = staging.staged_ids(conn, run_id) if resume and source.capabilities.resumable else set()
    if kept:
        seq, failed = staging.next_seq(conn, run_id), staging.failed_count(conn, run_id)
        listing.already_staged = frozenset(kept)
        log.info("resuming the listing of %s: %d records an earlier attempt of this run staged are kept and not "
                 "fetched again", portal.name, len(kept))
    else:
        staging.clear(conn, run_id)
        deletions.clear(conn, run_id)
    progress = Progress(f"listing records of {portal.name}", None, log, unit="records")
    kind = count_kind(portal, source)
    logged = [0]
    with read_ahead(source.iter_records(since, portal.page_size, listing, validators), depth=1,
                    name=f"harvester-listing-{run_id}") as pages:
        for page in pages:
            total = getattr(source, "total", None)
            progress.set_total(total, exact=kind.is_exact(total))
            staged, bad = _stage(conn, run_id, seq, page, logged, attempt)
            seq, failed = seq + staged, failed + bad
            progress.advance(staged)
            del page  # not held while the next one is awaited
    if kept:
        staged_in_all = staging.staged_count(conn, run_id)
        return {"fetched": staged_in_all - failed, "failed": failed}
    return {"fetched": seq - failed, "failed": failed}


@contextlib.contextmanager
def _portal_traffic(conn, run_id: int, source: Source):
    """Add the step's requests and bytes received to the run's stats, whether it succeeds or not:
    every attempt's calls to the portal count."""
    requests0, bytes0 = source.requests_made, source.bytes_received
    try:
        yield
    finally:
        runs.add_counts(conn, run_id, {"portal_requests": source.requests_made - requests0,
                                       "portal_bytes": source.bytes_received - bytes0})


def fetch_modified(conn, portal: Portal, run_id: int, source: Source) -> dict:
    """Stream the portal's modified records (all of them on a full sync) into staging, page by page.

    A source that cannot filter by modification time lists its whole catalogue on every run, so
    the run becomes a full sync (removals included), unless the catalogue answered that it did not
    change since the last committed run (a conditional request: nothing to process). Whatever the
    kind, a full listing removes datasets only when the source says it read it to its end
    (``Listing.complete``): one cut short (a page loop, a repeated page, a keyset that does not
    advance, the page limit of a paged catalogue) removes nothing, and the run is incremental."""
    source = as_source(source, portal)
    run = runs.require_running(conn, run_id)
    started = time.monotonic()
    listing = Listing()
    mode = run.mode  # the listing's: full after a rejected filter
    validators = None
    if source.capabilities.conditional and run.mode != FULL:
        validators = runs.source_validators(conn, portal.url)
    with _portal_traffic(conn, run_id, source):
        try:
            counts = _stage_listing(conn, portal, run_id, source, run.since if run.mode != FULL else None, listing,
                                    validators)
        except FilterRejected as exc:
            # Only a filter the portal refuses or ignores makes this a full sync. Any other failure
            # (the portal down, an HTML page or broken JSON where its answer should be, a CKAN error
            # other than a refused filter) fails the step: the task retries, then the run fails
            # and the watermark stays; a full listing (which may remove datasets) never starts on it.
            if run.mode == FULL:
                raise
            log.warning("the portal rejected or ignored the modified-since filter (%s); "
                        "falling back to a full sync of %s", exc, portal.name)
            runs.set_mode(conn, run_id, FULL, None)
            mode = FULL
            counts = _stage_listing(conn, portal, run_id, source, None, listing, resume=False)
    if mode == FULL or not source.capabilities.incremental:
        _settle_mode(conn, portal, run, mode, listing)
    elif listing.validators and not listing.not_modified:
        # an incremental kind with validators of its own records (a WAF's undated files): the
        # portal's status takes them at commit, as a full listing's
        runs.set_source_validators(conn, run_id, listing.validators)
    runs.add_stats(conn, run_id, counts)
    # The Failed records' errors are the run's report from now on, whether it commits or fails.
    outcomes.record_errors(conn, run_id, portal.url)
    if counts["failed"] and not counts["fetched"] and (listing.complete or mode == FULL):
        raise NothingUsable(_nothing_usable(conn, portal, run_id, counts["failed"]))
    log.debug("fetch_modified done in %.1fs: %s, %d requests, %d bytes received", time.monotonic() - started,
             summary(counts, ("fetched", "failed")), source.requests_made, source.bytes_received)
    return {"run_id": run_id, **counts}


class NothingUsable(Exception):
    """Every record of a whole catalogue failed: the run fails rather than succeed with no dataset
    (and remove, on a full sync, every dataset it holds). Terminal: the same catalogue fails again."""

    transient = False


def _nothing_usable(conn, portal: Portal, run_id: int, failed: int) -> str:
    reasons = ", ".join(f"{n} {code}" for code, n in outcomes.by_code(conn, run_id).items())
    return (f"all {failed} records {portal.name} listed failed ({reasons}): nothing can be stored, so the run fails "
            f"instead of succeeding with no dataset; see `harvester report {run_id}` or the run's page")


def _settle_mode(conn, portal: Portal, run, mode: str, listing: Listing) -> None:
    """What a full listing (any kind's), or any listing of a source without a modified-since
    filter, makes of the run (``mode``: the listing's; ``run.since``: the planned run's): a full
    sync, whose removals apply, only when the listing says it was complete."""
    if listing.not_modified:
        log.info("the catalogue of %s did not change since the last committed run (the portal answered "
                 "304 Not Modified): nothing to process", portal.name)
        if mode == FULL:
            runs.set_mode(conn, run.run_id, INCREMENTAL, run.since)
        return
    if listing.validators:
        runs.set_source_validators(conn, run.run_id, listing.validators)
    if listing.complete:
        if mode != FULL:
            runs.set_mode(conn, run.run_id, FULL, None)  # the whole catalogue was read: removals apply
        return
    if listing.reached_since and mode != FULL:
        log.info("the listing of %s stopped at the datasets not modified since %s: an incremental run, "
                 "no removals", portal.name, run.since)
        return
    log.warning("the listing of %s was cut short: this run cannot tell which datasets are gone, so it "
                "removes none", portal.name)
    if mode == FULL:
        runs.set_mode(conn, run.run_id, INCREMENTAL, run.since)


def reconcile(conn, portal: Portal, run_id: int, source: Source, *, ids_per_request: int = 100) -> dict:
    """Make sure the run ends with an exact copy of the portal, cheaply.

    A full sync listed everything already: nothing to do. An incremental run that is not due to
    reconcile asks the portal for its count (``source.count()``; CKAN: one ``rows=0`` request);
    when that is what we hold live plus what this run brings, it is done. Otherwise (or when due,
    or asked) it lists every identifier with its modification time only (``source.list_ids``),
    fetches in full what we lack or hold stale (``source.fetch_by_ids``), and leaves the datasets
    the portal no longer lists to upsert, which removes them under the guard. Any kind whose
    Capabilities say ``reconcile`` gets this (sources/base.py)."""
    source = as_source(source, portal)
    run = runs.require_running(conn, run_id)
    if run.mode == FULL:
        log.info("run %s of %s is a full sync: it listed the whole portal, nothing to reconcile", run_id, portal.name)
        return {"run_id": run_id, "reconciled": 0}
    if not source.capabilities.reconcile:
        log.info("%s is a %s catalogue: it cannot list identifiers apart, and a run that read it whole removes "
                 "what it no longer lists; nothing to reconcile", portal.name, portal.type)
        return {"run_id": run_id, "reconciled": 0}
    started = time.monotonic()
    with _portal_traffic(conn, run_id, source):
        reason = run.reconcile_reason
        if reason is None:
            total = source.count()
            if total is None:
                log.info("reconcile: %s gives no count of its datasets; no reconciliation due", portal.name)
                return {"run_id": run_id, "reconciled": 0}
            live = datasets.live_count(conn, portal.url)
            new = datasets.new_in_run(conn, run_id, portal.url)
            kind = count_kind(portal, source)
            exact = kind.is_exact(total)
            reason = count_drift(total, live, new, runs.status(conn, portal.url).listing_unusable, exact=exact)
            runs.add_stats(conn, run_id, {"portal_count": total} if exact else
                           {"portal_count": total, "portal_count_capped": 1})
            if reason is None:
                if exact:
                    log.info("reconcile: the portal lists %d datasets, as we hold (%d live, %d new in this run); "
                             "no reconciliation due", total, live, new)
                else:
                    log.info("reconcile: the portal lists at least %d datasets (its count is %s, so not exact) and "
                             "we hold %d live, %d new in this run: the count cannot tell a drift; no "
                             "reconciliation due (reconcile_every or reconcile finds removals)", total,
                             kind.describe(), live, new)
                return {"run_id": run_id, "reconciled": 0}
            log.warning("reconcile: %s; reconciling now", reason)
            runs.set_reconcile(conn, run_id, reason)
        else:
            log.info("reconcile: %s", reason)
        counts = _reconcile(conn, portal, run_id, source, ids_per_request)
    runs.add_stats(conn, run_id, counts)
    log.debug("reconcile done in %.1fs: %s, %d requests, %d bytes received", time.monotonic() - started,
             summary(counts, ("reconcile_listed", "reconcile_missing", "reconcile_stale", "reconcile_fetched")),
             source.requests_made, source.bytes_received)
    return {"run_id": run_id, "reconciled": 1, **counts}


_reconcile_step = reconcile  # harvest()'s `reconcile` flag shadows the step's name


def _reconcile(conn, portal: Portal, run_id: int, source: Source, ids_per_request: int) -> dict:
    attempt = runs.claim_staging(conn, run_id)  # an earlier attempt still running stops at its next page
    listing.clear(conn, run_id)
    seq = listing.next_seq(conn, run_id)
    unusable = whole_records = 0
    logged = [0]
    progress = Progress(f"reconcile {portal.name}: listing identifiers", None, log, unit="ids")
    kind = count_kind(portal, source)
    for page in source.list_ids(portal.page_size):
        progress.set_total(source.total, exact=kind.is_exact(source.total))
        unusable += page.unusable
        with runs.staging_page(conn, run_id, attempt):
            listing.write(conn, run_id, page.ids)
        if page.records:
            # The portal ignored the narrowing: it sent whole records, so use them (a full listing, only heavier).
            if not whole_records:
                log.warning("reconcile: %s ignored %s and sends whole records; reconciling from them as from "
                            "a full listing (same outcome, more bytes)", portal.name, page.ignored or "the narrowing")
            staged, _ = _stage(conn, run_id, seq, page.records, logged, attempt)
            seq, whole_records = seq + staged, whole_records + staged
        progress.advance(len(page.ids) + page.unusable)
    if unusable:
        log.warning("reconcile: %d listed records have no id and cannot be harvested", unusable)
    found = listing.compare(conn, run_id, portal.url)
    fetched = 0
    to_fetch = found["missing"] + found["stale"]
    if to_fetch:
        log.info("reconcile: %d listed ids we do not hold and %d held with another metadata_modified; fetching them",
                 found["missing"], found["stale"])
    progress = Progress(f"reconcile {portal.name}: fetching records", to_fetch, log, unit="records")
    for ids in listing.iter_to_fetch(conn, run_id):
        for page in source.fetch_by_ids(ids, per_request=ids_per_request):
            staged, _ = _stage(conn, run_id, seq, page, logged, attempt)
            seq, fetched = seq + staged, fetched + staged
            progress.advance(staged)
    if not whole_records and fetched < to_fetch:
        log.info("reconcile: %d of the ids to fetch were no longer shown by the portal (deleted or hidden since "
                 "the listing); the next reconciliation sees them again", to_fetch - fetched)
    if fetched or whole_records:
        outcomes.record_errors(conn, run_id, portal.url)  # the records it staged that failed, too
    return {"reconcile_listed": found["listed"], "reconcile_missing": found["missing"],
            "reconcile_stale": found["stale"], "reconcile_fetched": fetched + whole_records,
            "reconcile_unusable": unusable}


def _plan_index(conn, portal: Portal, run_id: int, model: str, pending: int, settings: EmbedSettings,
                index_settings: vectors.IndexSettings | None) -> bool:
    """Whether this run is a bulk load of the model's vectors: the model has no HNSW index of the
    configured kind yet (its first load, a model switch, a change of HARVESTER_INDEX_KIND: then the
    other kind's index serves searches and is kept up until the new one replaces it) and the run
    brings enough of them (IndexSettings). Then its vectors are written without upkeep of the new
    index and an upsert builds it once, concurrently, when no bulk load of the model is still
    running. A model that has its index (shared by every portal's runs and searches) keeps it: no
    run drops or rebuilds it, whatever it brings. What the run brings is what it embeds: its own
    new texts and at most HARVESTER_EMBED_BACKLOG_PER_RUN of those earlier runs left pending."""
    index_settings = index_settings or vectors.IndexSettings.from_env()
    if pending < max(1, index_settings.bulk_min) or vectors.index_state(conn, model) != "missing":
        return False  # (no second count for a small run)
    own, backlog = vectors.count_run_pending(conn, run_id, portal.url, model)
    incoming = own + (backlog if settings.backlog_per_run is None else min(backlog, settings.backlog_per_run))
    if incoming < max(1, index_settings.bulk_min):
        return False
    held = vectors.held(conn, model)
    if not vectors.bulk_load_wanted(held, incoming, index_settings):
        return False
    runs.set_bulk_model(conn, run_id, model)
    serving = vectors.search_kind(conn, model)
    if serving is None:
        log.info("bulk load: %d texts to embed against %d vectors of %s held, which has no HNSW index yet: the "
                 "vectors are written without one, and it is built once, concurrently, by the upsert of the last "
                 "bulk load of the model still running (searches of this model use exact scans until then)",
                 incoming, held, model)
    else:  # HARVESTER_INDEX_KIND changed: the index of the other kind is there until the new one is valid
        log.info("bulk load: %d texts to embed against %d vectors of %s held, which has no %s index yet "
                 "(HARVESTER_INDEX_KIND): its %s index serves searches and takes these vectors meanwhile; the %s "
                 "index is built once, concurrently, by the upsert of the last bulk load of the model still "
                 "running, and replaces it when valid", incoming, held, model, vectors.index_kind(), serving,
                 vectors.index_kind())
    return True


def hash_compare(conn, reader, portal: Portal, run_id: int, model: str | None = None,
                 settings: EmbedSettings | None = None, index_settings: vectors.IndexSettings | None = None) -> dict:
    """Classify staged records against what we hold (created, updated, unchanged, failed) and work
    out each new and updated dataset's change (type, fields, significance) into staging;
    ``reader`` is a second connection that streams them. With the provider's ``model``, also plan
    how many embed_changed tasks the pending texts need."""
    runs.require_running(conn, run_id)
    counts = datasets.classify(conn, run_id, portal.url)
    runs.add_stats(conn, run_id, counts)
    # Now the records are classified: the report gets the warnings of those the run takes in.
    warned = outcomes.record_warnings(conn, run_id, portal.url)
    reported = outcomes.counts(conn, [run_id]).get(run_id, {"errors": 0})
    out = {"run_id": run_id, **counts, "record_errors": reported["errors"], "record_warnings": warned}
    detected = history.compute_changes(conn, reader, run_id, portal.url, portal.significance)
    out["review"] = detected.get("review", 0)
    if model is not None:
        settings = settings or EmbedSettings.from_env()
        pending = vectors.count_pending(conn, run_id, portal.url, model)
        shards = plan_shards(pending, settings)
        bulk = _plan_index(conn, portal, run_id, model, pending, settings, index_settings)
        out["pending_texts"] = pending
        out["bulk_index"] = bulk
        out["embed_shards"] = [{"run_id": run_id, "shard": i, "shards": shards, "bulk_index": bulk}
                               for i in range(shards)]
    log.debug("hash_compare done: %s", summary(out, ("created", "updated", "reidentified", "unchanged",
                                                     "failed", "review", "pending_texts", "record_errors",
                                                     "record_warnings")))
    return out


def embed_changed(conn, reader, portal: Portal, run_id: int, provider: EmbeddingProvider, *,
                  shard: int = 0, shards: int = 1, settings: EmbedSettings | None = None,
                  breaker_config=None, bulk_index: bool = False, planned: int | None = None) -> dict:
    """Embed every text of the portal (in this shard) that has no vector for the provider's model
    yet: this run's new and changed texts and whatever earlier runs left pending, each distinct
    text once, through the shared circuit breaker. ``reader`` streams the pending texts.
    ``bulk_index``: hash_compare found this run a bulk load (said in the log; the model has no index
    to keep up, and upsert builds it).
    ``planned``: the pending texts hash_compare counted for the whole run; 0 skips looking for them
    again (a pass over every dataset of the portal: most of a no-change run's time at 100k)."""
    runs.require_running(conn, run_id)
    if planned == 0:
        log.info("embed_changed shard %d/%d: hash_compare found no text to embed", shard + 1, shards)
        return {"run_id": run_id, "shard": shard, "embedding_requests": 0, "embedded": 0, "left_pending": 0}
    if bulk_index:
        serving = vectors.search_kind(conn, provider.model)
        if serving is None:
            log.info("embed_changed shard %d/%d: a bulk load of %s: its vectors go in without index upkeep",
                     shard + 1, shards, provider.model)
        else:  # a change of HARVESTER_INDEX_KIND: the old kind's index is kept up until the new one replaces it
            log.info("embed_changed shard %d/%d: a bulk load of %s: its vectors go in without upkeep of the %s index "
                     "the upsert builds; its %s index, serving searches until then, takes them", shard + 1, shards,
                     provider.model, vectors.index_kind(), serving)
    counts = embed_pending(conn, reader, portal.url, run_id, provider, shard=shard, shards=shards,
                           settings=settings, breaker_config=breaker_config, label=f"{portal.name} ")
    return {"run_id": run_id, "shard": shard, **counts}


class _IndexBuild:
    """The model's HNSW index built concurrently (vectors.ensure_index) on a connection of its own
    (``open_connection()``, a context manager) in a thread, while the upsert's transaction merges:
    the build keeps PostgreSQL's parallel workers busy, the merge is one backend. A concurrent build
    waits for the transactions older than it (this merge among them) before it is valid, so the
    merge never waits for the build: the run commits, then ``wait`` gives the build a bounded time
    to end. A build still going on then finishes in the server on its own (the server notices the
    gone client only when it answers); one that failed is left for the next upsert to build."""

    def __init__(self, open_connection, model: str, settings: vectors.IndexSettings):
        import threading

        self.model, self.settings = model, settings
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(open_connection,), name="harvester-index-build",
                                        daemon=True)
        self._thread.start()

    def _run(self, open_connection) -> None:
        try:
            with open_connection() as conn:
                vectors.restore_index(conn, self.model, self.settings)
        except BaseException as exc:  # handed to wait()
            self._error = exc

    def wait(self, timeout: float) -> bool:
        """True once the build ended well; logs what else happened."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the HNSW index of %s is still being built after %.0fs (HARVESTER_INDEX_BUILD_WAIT_SECS, or "
                        "what the task's execution_timeout left): the build goes on in PostgreSQL, concurrently "
                        "(nobody waits for it); searches of the model use exact scans until it is valid",
                        self.model, timeout)
            return False
        if self._error is not None:
            log.warning("the HNSW index of %s was not built: %s: %s; the run is committed, and the next upsert "
                        "builds it", self.model, type(self._error).__name__, self._error)
            return False
        return True


def _start_index_build(conn, run_id: int, model: str, open_connection,
                       settings: vectors.IndexSettings) -> _IndexBuild | None:
    """After a bulk load, a model's first vectors, or a build that failed: the model's index is
    built by this upsert, concurrently, unless another bulk load of the model is still running
    (the last one to upsert builds it once) or someone builds it already."""
    if vectors.index_missing(conn, model) is None:
        return None
    loading = runs.bulk_loads_running(conn, model, besides=run_id)
    if loading:
        log.info("the HNSW index of %s is left to the bulk load still running (run %s of %s), whose upsert builds "
                 "it once", model, loading[-1].run_id, loading[-1].portal_name)
        return None
    if open_connection is None:  # no second connection: build it now, before the merge
        try:
            vectors.restore_index(conn, model, settings)
        except vectors.IndexBuildError as exc:
            log.warning("%s", exc)
        return None
    return _IndexBuild(open_connection, model, settings)


def _build_wait(settings: vectors.IndexSettings, deadline: float | None) -> float:
    """How long the upsert waits for the build it started: HARVESTER_INDEX_BUILD_WAIT_SECS, but never
    past ``deadline`` (time.monotonic(): what the task's execution_timeout leaves), so that a long
    build (a million vectors) never gets the task killed after its commit: the build goes on in
    the server."""
    if deadline is None:
        return settings.build_wait
    left = max(0.0, deadline - time.monotonic())
    if left < settings.build_wait:
        log.info("waiting at most %.0fs for the HNSW index build: the task's execution_timeout leaves no more "
                 "(HARVESTER_INDEX_BUILD_WAIT_SECS=%g)", left, settings.build_wait)
        return left
    return settings.build_wait


def upsert(conn, portal: Portal, run_id: int, model: str, max_batch: int = 1, *,
           force_removals: bool = False, open_connection=None, wait_deadline: float | None = None) -> dict:
    """One transaction: staging merged into datasets, vectors linked, versions and changes written,
    datasets gone from a clean full sync marked removed, the run's stats written, the watermark
    moved to the run's start, the run's staging dropped. ``open_connection``: a context manager
    giving a second connection, on which the model's HNSW index, when it is missing (a bulk load
    or a model's first vectors), is built concurrently during the merge (without it: before the
    merge); the upsert returns once it is built, or after HARVESTER_INDEX_BUILD_WAIT_SECS, or at
    ``wait_deadline`` (a time.monotonic() value: its task's execution_timeout, less a margin)."""
    done = runs.get(conn, run_id)
    if done.status == "committed":
        # A retry of a task whose commit went through (the worker died after it): nothing to redo
        # but the grouping that follows the commit.
        log.info("run %s of %s is already committed", run_id, portal.name)
        group_duplicates(conn, wait_deadline)
        return {"run_id": run_id, **done.stats}
    settings = vectors.IndexSettings.from_env()
    build = _start_index_build(conn, run_id, model, open_connection, settings)
    committed = False
    try:
        out = _merge_and_commit(conn, portal, run_id, model, max_batch, force_removals)
        committed = True
    finally:
        if build is not None:
            # After a failed merge the build is left to go on by itself (the retry finds it under way).
            build.wait(_build_wait(settings, wait_deadline) if committed else 0)
    if build is None:
        # The bulk loads still running when this upsert began may all have committed meanwhile
        # (several first syncs whose upserts overlap each left the index to the others): the last
        # one to commit sees none running now, and builds it.
        late = _start_index_build(conn, run_id, model, open_connection, settings)
        if late is not None:
            late.wait(_build_wait(settings, wait_deadline))
    _settle(conn, out)
    group_duplicates(conn, wait_deadline)
    # the portal's own HNSW index when it is large (store/portal_indexes.py): built, kept or dropped;
    # a failure is a warning (the run is committed)
    portal_indexes.after_run(conn, portal.url, model, wait_deadline)
    return out


def group_duplicates(conn, wait_deadline: float | None = None) -> dict | None:
    """After a commit: group the datasets queued for it (this run's and any other portal's), waiting
    at most HARVESTER_GROUPING_WAIT_SECS (or until ``wait_deadline``) for another grouping to end.
    Never fails the task: what cannot be grouped now stays queued for the next grouping."""
    wait = duplicates.grouping_wait()
    if wait_deadline is not None:
        wait = max(1.0, min(wait, wait_deadline - time.monotonic()))
    try:
        grouped = duplicates.regroup_pending(conn, wait=wait, until=wait_deadline)
    except duplicates.GroupingDeferred as exc:
        log.warning("duplicate grouping deferred: %s", exc)
        return None
    if grouped["touched"]:
        log.info("duplicates: %d datasets re-keyed, %d examined with their neighbours in %.2fs (after waiting "
                 "%.2fs for another grouping): %d in %d groups%s", grouped["touched"], grouped["examined"],
                 grouped["seconds"] - grouped["waited"], grouped["waited"], grouped["grouped"], grouped["groups"],
                 f"; {grouped['chunks']} groupings of at most {duplicates.GROUPING_CHUNK:,} queued datasets"
                 if grouped["chunks"] > 1 else "")
    if grouped["stopped"] == "deadline":
        log.warning("duplicate grouping: the task's time ran out with %d datasets still waiting to be grouped: the "
                    "next run of any portal groups them, or `harvester duplicates regroup`", grouped["left"])
    return grouped


def _merge_and_commit(conn, portal: Portal, run_id: int, model: str, max_batch: int, force_removals: bool) -> dict:
    runs.touch(conn, run_id)
    with conn.transaction():
        run = runs.require_running(conn, run_id)
        runs.lock_portal(conn, portal.url)
        reuse = vectors.reuse(conn, run_id, model, run.started_at)
        reuse["embedding_calls_saved"] = math.ceil(reuse["embeddings_reused"] / max(1, max_batch))
        # Search's copies of the vectors (sql/010): merge writes those of the datasets it links; a
        # run that listed the whole portal, or the first of a model, checks every dataset's after it
        # (and then the merge inserts new datasets already linked: ``prelink``).
        check_copies = run.lists_whole_portal or not vectors.copies_checked(conn, portal.url, model)
        # classify's count of unchanged records (hash_compare's, in the run's stats): none (a first
        # sync) spares the merge its pass over staging marking them seen
        unchanged = run.stats.get("unchanged")
        merged = datasets.merge(conn, run_id, portal.url, run.started_at, model, portal.language,
                                prelink=check_copies, unchanged=unchanged)
        if check_copies:
            vectors.copy_for_search(conn, portal.url, model)
        written = history.write_history(conn, run_id, portal.url, run.started_at)
        removals = {"removed": 0}
        if run.lists_whole_portal:
            # A full sync or a reconciliation that reached upsert listed the whole portal: every
            # page, nothing skipped.
            removals = history.apply_removals(
                conn, run_id, portal.url, run.started_at, max_share=portal.max_removal_share,
                force=force_removals, removed_significance=portal.significance.removed,
                review_threshold=portal.significance.review_threshold)
        elif deletions.staged(conn, run_id):
            # The portal said it deleted these (an OAI-PMH status="deleted"): removed by any run,
            # under the same guard.
            removals = history.apply_removals(
                conn, run_id, portal.url, run.started_at, max_share=portal.max_removal_share,
                force=force_removals, removed_significance=portal.significance.removed,
                review_threshold=portal.significance.review_threshold, deleted_only=True)
        # Cross-portal duplicates (store/duplicates.py): what this run touched, queued with the run's
        # commit (a group never reflects a run that did not commit) and grouped right after it.
        duplicates.queue_run(conn, run_id, portal.url)
        to_review = review.count_needing_review(conn, run_id)
        stats = {**run.stats, **reuse, **merged, "removed": removals.get("removed", 0), "review": to_review,
                 "versions": written.get("versions", 0)}
        if run.reconcile_reason is not None:
            stats["reconcile_removed"] = removals.get("removed", 0)
        if removals.get("removal_guard_tripped"):
            stats["removals_withheld"] = removals.get("would_remove", 0)
        unusable = stats.get("reconcile_unusable", 0) if run.mode != FULL else stats.get("failed", 0)
        # datasets_synced: the live datasets held for the portal now (after the merge and removals).
        runs.commit(conn, run, stats, datasets_synced=datasets.live_count(conn, portal.url), listing_unusable=unusable,
                    search_config=portal.language)
        staging.clear(conn, run_id)
        deletions.clear(conn, run_id)
        listing.drop(conn, run_id)
        claims.release_run(conn, run_id)  # (any left: a killed attempt's; they lapse with the run anyway)
        final = runs.get(conn, run_id).stats
    if final.get("skipped"):
        log.warning("%d changed datasets have no vector yet (embedding deferred); the next run embeds them",
                    final["skipped"])
    keys = STAT_KEYS + SAVINGS_KEYS + ("review", "versions")
    # (one long line, for the CLI's --verbose; the upsert task ends with a table of them)
    log.debug("upsert committed run %s of %s (%s%s): %s", run_id, portal.name, run.mode,
             ", reconciled" if run.reconcile_reason else "",
             summary(final, keys + (RECONCILE_KEYS if run.reconcile_reason else ())))
    _log_report(conn, run_id)
    return {"run_id": run_id, **final}


def _settle(conn, stats: dict) -> None:
    """After a large run's commit, and after the index build that ran beside its merge (whose
    snapshot would keep a vacuum from marking the new rows visible to all): fresh statistics of the
    tables it wrote and the visibility map of datasets (datasets.analyze_after_bulk), so that the
    next run's lookups are planned for their size and its counts read indexes only."""
    changed = sum(int(stats.get(k) or 0) for k in ("created", "updated", "removed", "reidentified"))
    started = time.perf_counter()
    analyzed = datasets.analyze_after_bulk(conn, changed)
    if analyzed:
        log.info("fresh statistics after %d changed datasets: analyzed %s (vacuumed: %s) in %.1fs (without them "
                 "the next run's statements are planned for the tables' size before this run, and its counts read "
                 "every row)",
                 changed, ", ".join(analyzed), ", ".join(t for t in analyzed if t in datasets.VACUUMED_AFTER_BULK),
                 time.perf_counter() - started)


def _log_report(conn, run_id: int) -> None:
    """The run's per-record outcomes, grouped, in the task log (the run's page and `harvester report`
    show every row)."""
    found = outcomes.groups(conn, run_id)
    if not found:
        return
    lines = [f"  {g['severity']:<7} {g['code']:<22} {g['count']:>7}  e.g. {', '.join(g['examples'])}: "
             f"{g['message'][:160]}" for g in found]
    log.warning("run %s: records with errors or warnings, by reason (`harvester report %s` lists them all):\n%s",
                run_id, run_id, "\n".join(lines))


def abort(conn, run_id: int, error: str, status: str = "failed", *, resumable: bool = False) -> bool:
    """Mark a run failed (or cancelled): nothing users see changes, the watermark stays. A
    ``resumable`` run keeps its staging until the portal's next run, so that clearing the failed
    task in Airflow completes it."""
    done = runs.abort(conn, run_id, status, error, resumable=resumable)
    if done:
        log.warning("run %s %s: %s%s", run_id, status, error,
                    "; clear the failed task (with downstream) in Airflow to resume it" if resumable else "")
    return done


def resume(conn, portal: Portal, run_id: int, dag_run_id: str | None, *, takeover: bool = False) -> None:
    """Before a DAG task works on its run: a run that failed and kept its staging is reopened (the
    user cleared the failed task in Airflow), so the cleared tasks complete it; see runs.resume."""
    before = runs.get(conn, run_id)
    run = runs.resume(conn, run_id, dag_run_id, takeover=takeover, stale_after=portal.stale_after)
    if before.status != run.status:
        log.warning("resuming run %s of %s (%s, was %s: %s): its staged work is intact, the cleared tasks "
                    "complete it", run_id, portal.name, run.mode, before.status, before.error)


def harvest(conn, reader, portal: Portal, source: Source, provider: EmbeddingProvider, *,
            full_sync: bool = False, reconcile: bool = False, force_removals: bool = False,
            takeover: bool = False, dag_run_id: str | None = None) -> dict:
    """A whole run in one call (the CLI's `harvester harvest`); a failure marks the run failed."""
    run_id = begin(conn, portal, dag_run_id=dag_run_id, full_sync=full_sync, reconcile=reconcile,
                   takeover=takeover)["run_id"]
    try:
        fetch_modified(conn, portal, run_id, source)
        _reconcile_step(conn, portal, run_id, source)
        planned = hash_compare(conn, reader, portal, run_id, provider.model)
        embed_changed(conn, reader, portal, run_id, provider, bulk_index=planned.get("bulk_index", False))
        return upsert(conn, portal, run_id, provider.model, provider.max_batch, force_removals=force_removals,
                      open_connection=lambda: contextlib.nullcontext(reader))  # idle by now
    except BaseException as exc:
        abort(conn, run_id, f"{type(exc).__name__}: {exc}")
        raise
