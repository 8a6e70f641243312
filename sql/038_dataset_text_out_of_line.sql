-- A dataset's description and raw record are kept out of its row, compressed (issue 40: bytes a
-- dataset). PostgreSQL toasts a row only when it is over 2,032 bytes (TOAST_TUPLE_THRESHOLD), and
-- then compresses and moves its long values out of line (TOAST) until the row is under
-- toast_tuple_target, 2,032 bytes by default: a description of a few hundred bytes to 2 KB stayed
-- in the row uncompressed, at fillfactor 70 (009: room for each run's last_seen_at). With a target
-- of 128 bytes (the lowest PostgreSQL takes), a toasted row is shrunk as far as it goes: the
-- description and the raw record (storage EXTENDED) are compressed and moved out, and nothing else
-- is. A row under 2,032 bytes before toasting (a small raw record: 409 of the storage bench's
-- 20,000, at most 1.3 KB of JSON) is not toasted and keeps both in line, as before:
-- - the hashes PLAIN: 64 hexadecimal characters, ours, never long, never compressible (not tried
--   again at each write of the row);
-- - the other text and the tags MAIN: compressed in the row, and out of it only as a last resort
--   (a row that would not fit a page), so a portal's 100 KB title is still stored.
-- Measured on the storage bench's 20,000 datasets after 10 runs of 1% (bench/README.md), paired:
-- `datasets` 5,855 -> 5,600 bytes a dataset (heap 1,807 -> 1,027, TOAST 3,674 -> 4,205: a
-- description moved out brings a chunk's header and index entry, and a short one does not
-- compress), 17,054 -> 16,788 in all. Reading a description costs a look-up where it is read:
-- search's snippets, the texts an embedding run sends, a version's snapshot, the export.
--
-- Only settings change, at once: no row is rewritten here. A row takes the new layout when it is
-- next written: inserted, changed by a run, or its last_seen_at set by a run that sees it (a full
-- sync brings every row of its portal over). `VACUUM FULL datasets` rewrites them all at once (it
-- locks the table: every run and search waits for it).
ALTER TABLE datasets SET (toast_tuple_target = 128);

ALTER TABLE datasets
    ALTER COLUMN url_hash SET STORAGE PLAIN,
    ALTER COLUMN content_hash SET STORAGE PLAIN,
    ALTER COLUMN metadata_hash SET STORAGE PLAIN,
    ALTER COLUMN embedded_content_hash SET STORAGE PLAIN,
    ALTER COLUMN portal_url SET STORAGE MAIN,
    ALTER COLUMN source_id SET STORAGE MAIN,
    ALTER COLUMN name SET STORAGE MAIN,
    ALTER COLUMN url SET STORAGE MAIN,
    ALTER COLUMN title SET STORAGE MAIN,
    ALTER COLUMN tags SET STORAGE MAIN,
    ALTER COLUMN organization SET STORAGE MAIN;
