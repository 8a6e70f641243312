-- Reconciliation: a run may list every identifier of the portal (with metadata_modified only) and
-- compare that list with datasets: what we lack or hold stale is fetched in full, what the portal
-- no longer lists is removed (under the same guard as a full sync). See plugins/harvester/store/listing.py.

-- Why a run reconciles (requested, due by reconcile_every, or the portal's count disagreed with
-- ours); NULL: it did not. A full sync lists the whole portal and needs no reconciliation.
ALTER TABLE sync_runs ADD COLUMN reconcile_reason text;

-- When the portal was last listed whole (start times of committed runs), for reconcile_every and
-- full_sync_every, and how many records that listing held that cannot be used (no id): the
-- portal's count includes them, so the count check allows for them.
ALTER TABLE portal_sync_status
    ADD COLUMN last_full_sync      timestamptz,
    ADD COLUMN last_reconciliation timestamptz,
    ADD COLUMN listing_unusable    integer NOT NULL DEFAULT 0 CHECK (listing_unusable >= 0);

UPDATE portal_sync_status p SET
    last_full_sync = r.last_full, last_reconciliation = r.last_full
FROM (SELECT portal_url, max(started_at) AS last_full FROM sync_runs
      WHERE status = 'committed' AND mode = 'full' GROUP BY portal_url) r
WHERE r.portal_url = p.portal_url;

-- The identifiers (and metadata_modified, truncated to the millisecond like the portal's search
-- index) a reconciling run listed; state: 'missing' (not held live) or 'stale' (held with another
-- metadata_modified), both fetched in full; NULL: in sync. Emptied at commit or failure.
CREATE TABLE staging_listing (
    run_id            bigint NOT NULL REFERENCES sync_runs (run_id) ON DELETE CASCADE,
    source_id         text NOT NULL,
    metadata_modified timestamptz,
    state             text CHECK (state IN ('missing', 'stale'))
);
CREATE INDEX staging_listing_run_source ON staging_listing (run_id, source_id);
