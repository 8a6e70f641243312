"""Per-run staging: fetched records streamed into PostgreSQL page by page with binary COPY."""
from __future__ import annotations

from typing import Iterable

from psycopg.types.json import Jsonb

from ..dataset import DatasetRecord

_COLUMNS = ("run_id", "seq", "source_id", "name", "url", "url_hash", "content_hash", "metadata_hash", "title",
            "description", "tags", "organization", "metadata_modified", "raw", "error")
_TYPES = ("int8", "int8", "text", "text", "text", "text", "text", "text", "text",
          "text", "jsonb", "text", "timestamptz", "jsonb", "text")


def clear(conn, run_id: int) -> None:
    """Forget what an earlier attempt of this run staged (a retried fetch starts over)."""
    conn.execute("DELETE FROM staging_records WHERE run_id = %s", (run_id,))


def _strip_nul(value):
    """PostgreSQL text and jsonb cannot hold U+0000; real portals do send it."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {_strip_nul(k): _strip_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_nul(v) for v in value]
    return value


def write(conn, run_id: int, first_seq: int, records: Iterable[DatasetRecord]) -> int:
    """COPY records into staging; returns how many were written."""
    n = 0
    with conn.cursor() as cur:
        with cur.copy(f"COPY staging_records ({', '.join(_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(list(_TYPES))
            for rec in records:
                copy.write_row((
                    run_id, first_seq + n, _strip_nul(rec.source_id), _strip_nul(rec.name), rec.url, rec.url_hash,
                    rec.content_hash, rec.metadata_hash, _strip_nul(rec.title), _strip_nul(rec.description),
                    Jsonb(_strip_nul(rec.tags)), _strip_nul(rec.organization), rec.metadata_modified,
                    Jsonb(_strip_nul(rec.raw)), rec.error,
                ))
                n += 1
    return n
