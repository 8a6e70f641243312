-- Dataset history: a version per distinct snapshot of a dataset, a change row per detected change,
-- and a per-run staging table for the changes compute_changes works out before the upsert.
-- (plugins/harvester/store/history.py writes all of it; plugins/harvester/changes.py decides what
-- changed.)

-- One row per distinct snapshot of a dataset (changes.snapshot: the cleaned title and description
-- and the tracked metadata). Versions of a dataset are numbered 1, 2, 3... without gaps; exactly one
-- is current, also for a removed dataset (its last known state). A run that sees the dataset
-- unchanged only moves the current version's last_seen_at.
CREATE TABLE dataset_versions (
    dataset_id     bigint NOT NULL REFERENCES datasets (id) ON DELETE CASCADE,
    version_number integer NOT NULL CHECK (version_number >= 1),
    content_hash   text NOT NULL,
    metadata_hash  text NOT NULL,
    title          text NOT NULL,
    description    text NOT NULL DEFAULT '',
    snapshot       jsonb NOT NULL,
    is_current     boolean NOT NULL DEFAULT true,
    -- the change that produced this version ('new' for the first; never 'removed')
    change_type    text NOT NULL CHECK (change_type IN (
        'new', 'content_updated', 'title_changed', 'date_changed', 'metadata_updated', 'restored')),
    first_seen_at  timestamptz NOT NULL,
    last_seen_at   timestamptz NOT NULL,
    PRIMARY KEY (dataset_id, version_number),
    CHECK (last_seen_at >= first_seen_at)
);
-- Exactly one current version per dataset (at most one here; write_history adds one for every
-- dataset it sees without one).
CREATE UNIQUE INDEX dataset_versions_one_current ON dataset_versions (dataset_id) WHERE is_current;

-- One row per detected change. old_version/new_version are version numbers of the dataset:
-- new: NULL -> 1; an edit: n -> n+1; removed: n -> n (the last version stays current);
-- restored: n -> n+1, or n -> n when nothing changed while the dataset was gone.
CREATE TABLE dataset_changes (
    id                 bigserial PRIMARY KEY,
    dataset_id         bigint NOT NULL REFERENCES datasets (id) ON DELETE CASCADE,
    -- the run that detected it; history outlives a deleted run
    run_id             bigint REFERENCES sync_runs (run_id) ON DELETE SET NULL,
    change_type        text NOT NULL CHECK (change_type IN (
        'new', 'content_updated', 'title_changed', 'date_changed', 'metadata_updated', 'removed', 'restored')),
    changed_fields     jsonb NOT NULL DEFAULT '{}',
    significance_score numeric(3, 2) NOT NULL CHECK (significance_score BETWEEN 0 AND 1),
    requires_review    boolean NOT NULL DEFAULT false,
    old_version        integer,
    -- NULL only for the removal of a dataset harvested before history existed (it has no version)
    new_version        integer,
    detected_at        timestamptz NOT NULL,
    FOREIGN KEY (dataset_id, old_version) REFERENCES dataset_versions (dataset_id, version_number) ON DELETE CASCADE,
    FOREIGN KEY (dataset_id, new_version) REFERENCES dataset_versions (dataset_id, version_number) ON DELETE CASCADE
);
CREATE INDEX dataset_changes_dataset ON dataset_changes (dataset_id, detected_at DESC);
CREATE INDEX dataset_changes_detected ON dataset_changes (detected_at DESC, id DESC);
CREATE INDEX dataset_changes_review ON dataset_changes (detected_at DESC, id DESC) WHERE requires_review;
CREATE INDEX dataset_changes_run ON dataset_changes (run_id);

-- The current version of every live dataset.
CREATE VIEW current_datasets AS
SELECT d.id AS dataset_id, d.portal_url, d.source_id, d.name, d.url,
       v.version_number, v.title, v.description, v.content_hash, v.metadata_hash, v.snapshot,
       v.change_type, v.first_seen_at AS version_first_seen_at, v.last_seen_at AS version_last_seen_at,
       d.first_seen_at, d.last_seen_at
FROM datasets d
JOIN dataset_versions v ON v.dataset_id = d.id AND v.is_current
WHERE d.removed_at IS NULL;

-- Changes with the dataset's title, url and portal, newest first.
CREATE VIEW recent_dataset_changes AS
SELECT c.id, c.dataset_id, c.run_id, c.change_type, c.changed_fields, c.significance_score,
       c.requires_review, c.old_version, c.new_version, c.detected_at,
       d.portal_url, p.portal_name, d.source_id, d.name, d.title, d.url, d.removed_at
FROM dataset_changes c
JOIN datasets d ON d.id = c.dataset_id
LEFT JOIN portal_sync_status p ON p.portal_url = d.portal_url
ORDER BY c.detected_at DESC, c.id DESC;

-- Changes of a running run, computed after hash_compare (store/history.compute_changes) and
-- written into the history by the upsert's transaction (write_history), which empties it.
--   new_version:   the dataset gets a new version (else its current version is refreshed in place)
--   record_change: a dataset_changes row is written (false: a baseline version for a dataset
--                  harvested before history existed, or a hash change no snapshot field shows)
CREATE TABLE staging_changes (
    run_id          bigint NOT NULL REFERENCES sync_runs (run_id) ON DELETE CASCADE,
    source_id       text NOT NULL,
    change_type     text NOT NULL,
    changed_fields  jsonb NOT NULL DEFAULT '{}',
    significance    numeric(3, 2) NOT NULL,
    requires_review boolean NOT NULL,
    snapshot        jsonb NOT NULL,
    new_version     boolean NOT NULL,
    record_change   boolean NOT NULL,
    PRIMARY KEY (run_id, source_id)
);
