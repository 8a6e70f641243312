-- Kinds of portal other than CKAN (plugins/harvester/sources/), and datasets that change identifier.

-- A dataset that vanished under one identifier and appeared under another with the same text in a
-- run that listed the whole portal is the same dataset re-identified: its row keeps its history
-- and takes the new identifier (store/datasets.py classify and merge).
ALTER TABLE staging_records ADD COLUMN previous_source_id text;
ALTER TABLE staging_records DROP CONSTRAINT staging_records_outcome_check;
ALTER TABLE staging_records ADD CONSTRAINT staging_records_outcome_check
    CHECK (outcome IN ('created', 'updated', 'unchanged', 'failed', 'duplicate', 'reidentified'));

ALTER TABLE dataset_changes DROP CONSTRAINT dataset_changes_change_type_check;
ALTER TABLE dataset_changes ADD CONSTRAINT dataset_changes_change_type_check CHECK (change_type IN (
    'new', 'content_updated', 'title_changed', 'date_changed', 'metadata_updated', 'removed', 'restored',
    'reidentified'));
ALTER TABLE dataset_versions DROP CONSTRAINT dataset_versions_change_type_check;
ALTER TABLE dataset_versions ADD CONSTRAINT dataset_versions_change_type_check CHECK (change_type IN (
    'new', 'content_updated', 'title_changed', 'date_changed', 'metadata_updated', 'restored', 'reidentified'));

-- What the portal said identifies its catalogue's last committed state (ETag, Last-Modified): sent
-- back by the next run, whose unchanged catalogue then costs one 304.
ALTER TABLE portal_sync_status ADD COLUMN source_validators jsonb;
ALTER TABLE sync_runs ADD COLUMN source_validators jsonb;
