"""The SQL of `harvester export`: datasets and changes as row batches, and the runs they reflect.

One read-only REPEATABLE READ transaction (``snapshot``) holds the whole export, so the rows and the
committed runs listed beside them are one consistent picture even while harvests commit. Rows come
in batches from a server-side (named) cursor: one set-based query, never one per dataset, and the
client holds one batch at a time whatever the number of rows.

Each export's columns are listed with a type from a small vocabulary the writers know
(pipeline/export_files.py): ``int32``, ``int64``, ``float64``, ``bool``, ``string``, ``json`` (JSON
text), ``list<string>`` and ``timestamp`` (an instant, UTC).
"""
from __future__ import annotations

from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from functools import lru_cache
from typing import Iterator, NamedTuple

from harvester.config.secrets import redact_url

# A batch ends at BATCH_ROWS rows or at about BATCH_CHARS characters of text, whichever comes first:
# datasets with their raw records run to several KB a row, and the client holds a batch two or three
# times over (psycopg's rows, Python's strings, pyarrow's arrays) while writing it.
BATCH_ROWS = 10_000
BATCH_CHARS = 8_000_000
_FETCH_ROWS = 500


class Column(NamedTuple):
    name: str
    type: str
    description: str


DATASET_COLUMNS = (
    Column("dataset_id", "int64", "the dataset's id in Harvester (datasets.id)"),
    Column("portal_name", "string", "the portal's name (as its last run recorded it in portal_sync_status)"),
    Column("portal_url", "string", "the portal's base URL"),
    Column("source_id", "string", "the dataset's identifier on its portal (a CKAN id, a DCAT identifier...)"),
    Column("name", "string", "the dataset's short name (CKAN's name), if it has one"),
    Column("url", "string", "the dataset's landing page"),
    Column("title", "string", "the title"),
    Column("description", "string", "the description ('' for none)"),
    Column("organization", "string", "the publishing organization, if known"),
    Column("tags", "list<string>", "the keywords, in the record's order"),
    Column("formats", "list<string>", "the distinct formats of the dataset's resources, sorted"),
    Column("license", "string", "the licence (the record's license_title, else license_id, else license)"),
    Column("metadata_modified", "timestamp", "when the portal says the metadata last changed"),
    Column("first_seen_at", "timestamp", "when Harvester first saw the dataset"),
    Column("updated_at", "timestamp", "when Harvester last stored a change of it"),
    Column("last_seen_at", "timestamp", "when a run last saw it on its portal"),
    Column("removed_at", "timestamp", "when it was found gone from its portal (null: live)"),
    Column("content_hash", "string", "SHA-256 of its title and description as embedded"),
    Column("metadata_hash", "string", "SHA-256 of its tracked metadata"),
    Column("version", "int32", "its current version number (dataset_versions)"),
    Column("group_id", "int64", "its duplicate group (null: in no group, alone)"),
    Column("is_canonical", "bool", "whether it is its group's canonical member (null when alone)"),
    Column("canonical_dataset_id", "int64", "the dataset_id of its group's canonical member (null when alone)"),
    Column("copies", "int32", "how many other datasets are in its group (0 when alone)"),
)
RAW_COLUMN = Column("raw", "json", "the record as fetched from the portal, as JSON text (only with --raw)")

CHANGE_COLUMNS = (
    Column("change_id", "int64", "the change's id (dataset_changes.id)"),
    Column("dataset_id", "int64", "the dataset that changed"),
    Column("portal_name", "string", "the portal's name"),
    Column("portal_url", "string", "the portal's base URL"),
    Column("source_id", "string", "the dataset's identifier on its portal"),
    Column("title", "string", "the dataset's current title"),
    Column("url", "string", "the dataset's landing page"),
    Column("change_type", "string", "new, content_updated, title_changed, date_changed, metadata_updated, "
                                    "removed or restored"),
    Column("changed_fields", "json", "what changed: field -> {old, new}, as JSON text"),
    Column("summary", "string", "the change in words, as `harvester changes` and the UI say it"),
    Column("significance", "float64", "how much it changed, 0 to 1"),
    Column("requires_review", "bool", "whether the change waits for a person's review"),
    Column("review_outcome", "string", "reviewed or dismissed (null: not reviewed)"),
    Column("old_version", "int32", "the version before (null for a new dataset)"),
    Column("new_version", "int32", "the version after"),
    Column("detected_at", "timestamp", "when the run detected it"),
    Column("run_id", "int64", "the run that detected it (null when that run was deleted)"),
)

_DATASETS_SQL = """
SELECT d.id, p.portal_name, d.portal_url, d.source_id, d.name, d.url, d.title, d.description, d.organization,
       ARRAY(SELECT jsonb_array_elements_text(CASE WHEN jsonb_typeof(d.tags) = 'array' THEN d.tags ELSE '[]' END)),
       ARRAY(SELECT DISTINCT btrim(r ->> 'format')
             FROM jsonb_array_elements(CASE WHEN jsonb_typeof(d.raw -> 'resources') = 'array'
                                            THEN d.raw -> 'resources' ELSE '[]' END) r
             WHERE jsonb_typeof(r) = 'object' AND nullif(btrim(r ->> 'format'), '') IS NOT NULL
             ORDER BY 1),
       coalesce(nullif(d.raw ->> 'license_title', ''), nullif(d.raw ->> 'license_id', ''),
                nullif(d.raw ->> 'license', '')),
       d.metadata_modified, d.first_seen_at, d.updated_at, greatest(d.updated_at, k.last_seen_at), d.removed_at,
       d.content_hash, d.metadata_hash, v.version_number,
       m.group_id, m.is_canonical, c.dataset_id, coalesce(g.members - 1, 0)::int{raw}
FROM datasets d
LEFT JOIN portal_sync_status p ON p.portal_url = d.portal_url
LEFT JOIN dataset_seen k ON k.dataset_id = d.id
LEFT JOIN dataset_versions v ON v.dataset_id = d.id AND v.is_current
LEFT JOIN duplicate_members m ON m.dataset_id = d.id
LEFT JOIN duplicate_members c ON c.group_id = m.group_id AND c.is_canonical
LEFT JOIN (SELECT group_id, count(*) AS members FROM duplicate_members GROUP BY group_id) g
       ON g.group_id = m.group_id
WHERE (%(portal)s::text IS NULL OR d.portal_url = %(portal)s)
  AND (%(include_removed)s OR d.removed_at IS NULL)
  AND (%(since)s::timestamptz IS NULL OR d.updated_at >= %(since)s OR d.removed_at >= %(since)s)
  {narrowed}
ORDER BY d.id
"""

_CHANGES_SQL = """
SELECT c.id, c.dataset_id, p.portal_name, d.portal_url, d.source_id, d.title, d.url, c.change_type,
       c.changed_fields::text, c.changed_fields, c.significance_score::float8, c.requires_review, c.review_outcome,
       c.old_version, c.new_version, c.detected_at, c.run_id
FROM dataset_changes c
JOIN datasets d ON d.id = c.dataset_id
LEFT JOIN portal_sync_status p ON p.portal_url = d.portal_url
WHERE (%(portal)s::text IS NULL OR d.portal_url = %(portal)s)
  AND (%(since)s::timestamptz IS NULL OR c.detected_at >= %(since)s)
  AND (%(change_type)s::text IS NULL OR c.change_type = %(change_type)s)
  AND (NOT %(queue)s OR (c.requires_review AND c.review_outcome IS NULL))
  AND (%(min_significance)s::numeric IS NULL OR c.significance_score >= %(min_significance)s::numeric)
ORDER BY c.detected_at, c.id
"""


def dataset_columns(raw: bool = False) -> tuple[Column, ...]:
    return DATASET_COLUMNS + ((RAW_COLUMN,) if raw else ())


@contextmanager
def snapshot(conn) -> Iterator:
    """A read-only REPEATABLE READ transaction on ``conn`` (an autocommit connection of store.db):
    every query inside sees the database as of the first one."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield conn


def committed_runs(conn, portal_url: str | None = None) -> list[dict]:
    """Per portal (all, or ``portal_url``'s): its last committed run, the newest state the export holds."""
    rows = conn.execute(
        """
        SELECT DISTINCT ON (portal_url) portal_name, portal_url, run_id, finished_at
        FROM sync_runs
        WHERE status = 'committed' AND (%(portal)s::text IS NULL OR portal_url = %(portal)s)
        ORDER BY portal_url, finished_at DESC NULLS LAST, run_id DESC
        """, {"portal": portal_url}).fetchall()
    return [dict(zip(("portal_name", "portal_url", "run_id", "finished_at"), row), portal_url=_shown(row[1]))
            for row in rows]


# A portal's url as an export shows it: a secret in a url stored before portals.yaml refused them
# (config/portals.py) never leaves in a file. A handful of portals: each url redacted once.
_shown = lru_cache(maxsize=1024)(redact_url)


def _with_shown_url(batches: Iterator[list[tuple]], at: int) -> Iterator[list[tuple]]:
    """``batches`` with each row's portal url (column ``at``) as ``_shown`` makes it."""
    for batch in batches:
        yield [row[:at] + (_shown(row[at]),) + row[at + 1:] for row in batch]


def _batches(conn, name: str, sql: str, params: dict, batch_rows: int) -> Iterator[list[tuple]]:
    """The rows of ``sql`` from a server-side cursor, in batches of at most ``batch_rows`` rows and
    about BATCH_CHARS characters of text."""
    with conn.cursor(name=name) as cur:
        cur.execute(sql, params)
        batch: list[tuple] = []
        chars = 0
        while rows := cur.fetchmany(min(_FETCH_ROWS, batch_rows - len(batch))):
            batch.extend(rows)
            chars += sum(len(value) for row in rows for value in row if type(value) is str)
            if len(batch) >= batch_rows or chars >= BATCH_CHARS:
                yield batch
                batch, chars = [], 0
        if batch:
            yield batch


def dataset_batches(conn, *, portal_url: str | None = None, since: datetime | None = None,
                    include_removed: bool = False, raw: bool = False, filters=None,
                    batch_rows: int = BATCH_ROWS) -> Iterator[list[tuple]]:
    """The datasets, by id, as tuples in ``dataset_columns(raw)``'s order: live ones only unless
    ``include_removed``; with ``since``, those updated (or removed) at or after it; with
    ``filters`` (a store.search.SearchFilters: organization, tag, format, licence, modified from /
    until, as search filters), those the search's filters keep (the Harvester page's export of
    its search filters)."""
    narrowed, params = "", {}
    if filters is not None:
        from harvester.store.search import filter_sql

        where, params = filter_sql(filters, "s")
        narrowed = f"AND d.id IN (SELECT s.dataset_id FROM dataset_search s WHERE {where})"
    sql = _DATASETS_SQL.format(raw=", d.raw::text" if raw else "", narrowed=narrowed)
    yield from _with_shown_url(_batches(conn, "harvester_export_datasets", sql, {
        **params, "portal": portal_url, "since": since, "include_removed": include_removed}, batch_rows), 2)


def change_batches(conn, *, portal_url: str | None = None, since: datetime | None = None,
                   change_type: str | None = None, queue: bool = False, min_significance: float | None = None,
                   batch_rows: int = BATCH_ROWS) -> Iterator[list[tuple]]:
    """The changes oldest first, as tuples in ``CHANGE_COLUMNS``' order; with ``since``, those
    detected at or after it; ``change_type``, ``queue`` (only those waiting for review) and
    ``min_significance`` narrow them as the Harvester page's changes list does
    (store.history.page_changes)."""
    from harvester.store.history import describe

    # the summary from the change's type and fields, as `harvester changes` words it
    params = {"portal": portal_url, "since": since, "change_type": change_type, "queue": bool(queue),
              "min_significance": None if min_significance is None else Decimal(str(min_significance))}
    for batch in _batches(conn, "harvester_export_changes", _CHANGES_SQL, params, batch_rows):
        yield [row[:3] + (_shown(row[3]),) + row[4:9] + (describe(row[7], row[9] or {}),) + row[10:] for row in batch]
