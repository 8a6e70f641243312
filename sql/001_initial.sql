-- Harvester schema, version 1: portals' watermarks, runs, datasets, vectors, per-run staging.
CREATE EXTENSION IF NOT EXISTS vector;

-- The watermark per portal. last_successful_sync is the START time of the last run that
-- completed; only a completed run moves it.
CREATE TABLE portal_sync_status (
    portal_url           text PRIMARY KEY,
    portal_name          text NOT NULL,
    last_successful_sync timestamptz,
    last_sync_mode       text CHECK (last_sync_mode IN ('full', 'incremental')),
    sync_status          text NOT NULL CHECK (sync_status IN ('completed', 'cancelled', 'failed')),
    datasets_synced      integer NOT NULL DEFAULT 0,
    updated_at           timestamptz NOT NULL DEFAULT now()
);

-- One row per harvest run (an Airflow DAG run, or a CLI run).
CREATE TABLE sync_runs (
    run_id      bigserial PRIMARY KEY,
    portal_url  text NOT NULL,
    portal_name text NOT NULL,
    dag_run_id  text,
    mode        text NOT NULL CHECK (mode IN ('full', 'incremental')),
    status      text NOT NULL CHECK (status IN ('running', 'committed', 'failed', 'cancelled')),
    since       timestamptz,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    error       text,
    stats       jsonb NOT NULL DEFAULT jsonb_build_object(
        'fetched', 0, 'created', 0, 'updated', 0, 'unchanged', 0, 'failed', 0, 'skipped', 0,
        'removed', 0, 'embedding_requests', 0, 'embedded', 0, 'embeddings_reused', 0,
        'portal_requests', 0)
);
CREATE INDEX sync_runs_portal_started ON sync_runs (portal_url, started_at DESC);
-- At most one run of a portal writes at a time.
CREATE UNIQUE INDEX sync_runs_one_running ON sync_runs (portal_url) WHERE status = 'running';

-- The current state of every dataset ever seen, live or removed.
CREATE TABLE datasets (
    id                    bigserial PRIMARY KEY,
    portal_url            text NOT NULL,
    source_id             text NOT NULL,
    name                  text,
    url                   text NOT NULL,
    url_hash              text NOT NULL,
    content_hash          text NOT NULL,
    metadata_hash         text NOT NULL,
    title                 text NOT NULL,
    description           text NOT NULL DEFAULT '',
    tags                  jsonb NOT NULL DEFAULT '[]',
    organization          text,
    metadata_modified     timestamptz,
    first_seen_at         timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    last_seen_at          timestamptz NOT NULL,
    removed_at            timestamptz,
    embedded_content_hash text,
    raw                   jsonb NOT NULL,
    UNIQUE (portal_url, source_id)
);
CREATE INDEX datasets_content_hash ON datasets (content_hash);
CREATE INDEX datasets_url_hash ON datasets (url_hash);
CREATE INDEX datasets_pending ON datasets (portal_url) WHERE embedded_content_hash IS DISTINCT FROM content_hash;

-- Vectors, content-addressed: one per (text, model). Datasets reach theirs through content_hash.
-- The column has no fixed dimension so models of different sizes live side by side; each model
-- gets its own partial HNSW index over an expression cast to its dimension (see store/vectors.py).
CREATE TABLE embeddings (
    content_hash text NOT NULL,
    model        text NOT NULL,
    dimension    integer NOT NULL CHECK (dimension > 0),
    embedding    vector NOT NULL CHECK (vector_dims(embedding) = dimension),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (content_hash, model)
);

-- Fetched records of running runs, streamed in page by page; emptied at commit or failure.
CREATE TABLE staging_records (
    run_id            bigint NOT NULL REFERENCES sync_runs (run_id) ON DELETE CASCADE,
    seq               bigint NOT NULL,
    source_id         text,
    name              text,
    url               text,
    url_hash          text,
    content_hash      text,
    metadata_hash     text,
    title             text,
    description       text,
    tags              jsonb,
    organization      text,
    metadata_modified timestamptz,
    raw               jsonb,
    error             text,
    outcome           text CHECK (outcome IN ('created', 'updated', 'unchanged', 'failed', 'duplicate')),
    content_changed   boolean,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX staging_records_run_source ON staging_records (run_id, source_id);
