"""Per-run staging: fetched records streamed into PostgreSQL page by page with binary COPY."""
from __future__ import annotations

import json
from typing import Iterable

import orjson
import psycopg
from psycopg.types.json import Jsonb

from harvester.config.languages import text_search_config
from harvester.domain.dataset import DatasetRecord
from harvester.domain.screening import may_hold_non_finite

_COLUMNS = ("run_id", "seq", "source_id", "name", "url", "url_hash", "content_hash", "metadata_hash", "title",
            "description", "tags", "organization", "metadata_modified", "raw", "error", "problems", "language")
_TYPES = ("int8", "int8", "text", "text", "text", "text", "text", "text", "text",
          "text", "jsonb", "text", "timestamptz", "jsonb", "text", "jsonb", "text")


# The tables a run stages into, each keyed by run_id: all runs (of every portal) share them.
RUN_TABLES = ("staging_records", "staging_changes", "staging_deleted", "staging_listing", "embedding_claims")


# A table with nothing to hand back: no heap page (none written, or a vacuum truncated them all)
# and no index of more than its metapage and root (a vacuum never hands an index's pages back).
_EMPTY = """
    SELECT pg_relation_size(%(table)s::regclass) = 0
       AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = %(table)s::regclass
                         AND pg_relation_size(i.indexrelid) > 2 * current_setting('block_size')::int)
"""


def release(conn, table: str, run_id: int) -> int:
    """Forget the rows ``run_id`` holds in the staging table ``table`` (one of ``RUN_TABLES``);
    returns how many there were.

    A staging table's rows are deleted by the thousands once a run commits (a first sync's staged
    records and changes: several KB a dataset, out of line too), and deleted rows keep their pages:
    until a vacuum comes by they are scanned by every later statement of the table and counted in
    its size, and a vacuum hands the heap's pages back but never an index's (issue 40: 2.4 KB a
    dataset in staging_changes after a first sync of 100,000). So when no other run holds rows in
    the table (the usual case: runs of different portals rarely overlap) and it can be locked at
    once, it is truncated: its heap, TOAST and indexes go back to empty files. Otherwise (another
    run's rows are there, or a COPY, a scan or a vacuum of the table is under way: NOWAIT, never a
    wait) the run's rows are deleted, and the next run that finds the table alone truncates it.
    Nothing is done when the table has nothing to hand back (a run that staged nothing there).

    The ACCESS EXCLUSIVE lock is held to the end of the caller's transaction: at commit, the
    upsert's last statements, during which another portal's run that writes to the table waits.
    TRUNCATE is safe under concurrency here: holding the lock, no other transaction has uncommitted
    rows in the table, and the committed rows of other runs are what the check sees (READ COMMITTED)."""
    if table not in RUN_TABLES:
        raise ValueError(f"{table!r} is not a staging table (one of {', '.join(RUN_TABLES)})")
    params = {"run": run_id, "table": table}
    if conn.execute(_EMPTY, params).fetchone()[0]:
        return 0
    try:
        with conn.transaction():
            conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE NOWAIT")  # (a name of RUN_TABLES)
            mine, others = conn.execute(
                f"SELECT (SELECT count(*) FROM {table} WHERE run_id = %(run)s),"
                f" EXISTS (SELECT 1 FROM {table} WHERE run_id < %(run)s)"
                f" OR EXISTS (SELECT 1 FROM {table} WHERE run_id > %(run)s)", params).fetchone()
            if not others:
                conn.execute(f"TRUNCATE {table}")
                return mine
    except (psycopg.errors.LockNotAvailable, psycopg.errors.InsufficientPrivilege):
        pass  # (a role that may delete but not truncate: deleting is what it always did)
    return conn.execute(f"DELETE FROM {table} WHERE run_id = %(run)s", params).rowcount


def clear(conn, run_id: int) -> None:
    """Forget what this run staged: what an earlier attempt staged (a retried fetch starts over),
    or, at commit, the whole run's records and the changes history worked out from them
    (``release``: each table truncated when no other run's rows are there)."""
    release(conn, "staging_records", run_id)
    release(conn, "staging_changes", run_id)


def _strip_nul(value):
    """PostgreSQL text and jsonb cannot hold U+0000; real portals do send it."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {_strip_nul(k): _strip_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_nul(v) for v in value]
    return value


def _text(value):
    """A text column's value without U+0000 (the common case, without one, costs a scan in C)."""
    return value.replace("\x00", "") if isinstance(value, str) and "\x00" in value else value


def _as_is(text):
    return text


def _serialized(value) -> bytes | str:
    """``value`` as JSON text that PostgreSQL reads into the same jsonb as the text of
    ``json.dumps`` (what psycopg's Jsonb sends). orjson writes it six times faster; json.dumps
    writes it where the two would differ: what orjson refuses (integers beyond 64 bits, keys that
    are not strings, lone surrogates, datetimes, dataclasses and other types json.dumps refuses
    too) and NaN or ±Infinity (orjson writes null; json.dumps tokens PostgreSQL rejects: the records
    domain/dataset.py builds hold none, domain/screening.py made them null with a warning). Numbers
    may be spelled differently (1e-05, 0.00001): PostgreSQL reads the same numeric."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS)
    except TypeError:
        return json.dumps(value)
    return json.dumps(value) if may_hold_non_finite(value) else text


def as_jsonb(value) -> Jsonb:
    """``Jsonb(value)`` (no U+0000 stripped), serialized faster into the same jsonb (_serialized)."""
    return Jsonb(_serialized(value), _as_is)


def _jsonb(value) -> Jsonb:
    """A jsonb column's value, serialized once, with U+0000 stripped from every string and key. A
    JSON text holds U+0000 only escaped, as \\u0000: only a value whose text shows that sequence (a
    NUL, or a literal backslash-u0000) is walked and serialized again."""
    text = _serialized(value)
    if (b"\\u0000" if isinstance(text, bytes) else "\\u0000") in text:
        text = _serialized(_strip_nul(value))
    return Jsonb(text, _as_is)


def _problems(rec: DatasetRecord) -> Jsonb | None:
    """The record's problems (domain/outcomes.py) as the staging column holds them; None: none."""
    reported = rec.reported()
    return _jsonb([p.as_dict() for p in reported]) if reported else None


def write(conn, run_id: int, first_seq: int, records: Iterable[DatasetRecord]) -> int:
    """COPY records into staging; returns how many were written."""
    n = 0
    with conn.cursor() as cur:
        with cur.copy(f"COPY staging_records ({', '.join(_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(list(_TYPES))
            for rec in records:
                copy.write_row((
                    run_id, first_seq + n, _text(rec.source_id), _text(rec.name), rec.url, rec.url_hash,
                    rec.content_hash, rec.metadata_hash, _text(rec.title), _text(rec.description),
                    _jsonb(rec.tags), _text(rec.organization), rec.metadata_modified, _jsonb(rec.raw), rec.error,
                    _problems(rec),
                    # the configuration of its declared language (None: the portal's)
                    text_search_config(rec.language),
                ))
                n += 1
    return n


# -- a resumed listing (pipeline/steps.py _stage_listing, Capabilities.resumable) -----------------------
# staging_records.seq of the records a reconciliation stages (store/listing.py); fetch_modified's
# count up from 0, below it.
RECONCILE_SEQ = 1 << 40


def staged_ids(conn, run_id: int) -> set[str]:
    """The source ids an earlier attempt of the run's listing staged (failed records included)."""
    rows = conn.execute("SELECT source_id FROM staging_records WHERE run_id = %s AND seq < %s"
                        " AND source_id IS NOT NULL", (run_id, RECONCILE_SEQ)).fetchall()
    return {r[0] for r in rows}


def next_seq(conn, run_id: int) -> int:
    """Where the run's listing's next staged record goes (after an earlier attempt's)."""
    row = conn.execute("SELECT max(seq) FROM staging_records WHERE run_id = %s AND seq < %s",
                       (run_id, RECONCILE_SEQ)).fetchone()
    return 0 if row[0] is None else row[0] + 1


def staged_count(conn, run_id: int) -> int:
    """How many records the run's listing staged, in every attempt."""
    return conn.execute("SELECT count(*) FROM staging_records WHERE run_id = %s AND seq < %s",
                        (run_id, RECONCILE_SEQ)).fetchone()[0]


def failed_count(conn, run_id: int) -> int:
    """How many of them failed."""
    return conn.execute("SELECT count(*) FROM staging_records WHERE run_id = %s AND seq < %s AND error IS NOT NULL",
                        (run_id, RECONCILE_SEQ)).fetchone()[0]
