-- The text-search configuration (the portal's language) a portal's datasets were last indexed
-- with. Each run's merge used to look at every dataset of the portal for one of another
-- configuration (a language changed in portals.yaml): a pass over 100,000 rows, about 70 ms of every
-- no-change run. It now looks only when this differs from the run's (or is not known yet).
ALTER TABLE portal_sync_status ADD COLUMN search_config regconfig;
