"""`harvester export`'s files: row batches (store/export.py) written as Parquet, CSV or JSON Lines,
and the manifest that says what they hold.

Memory stays flat in the number of rows: each batch is written (Parquet: as one row group) before
the next is read. A file is written under a temporary name and renamed when complete, its SHA-256
computed by re-reading it in chunks; manifest.json comes last, so a directory with a manifest holds
a whole export. Every format reads without options in pyarrow/pandas, DuckDB and Polars: Parquet
with an explicit schema (an empty export keeps its columns and types), CSV with a header row
(RFC 4180 quoting, UTF-8, lists and JSON as JSON text), JSON Lines one object per row; instants in
UTC (Parquet timestamp[us, tz=UTC]; text: ISO 8601 with +00:00).
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

from harvester.config.secrets import redact_url
from harvester.store import export as store

SCHEMA_VERSION = 1
FORMATS = ("parquet", "csv", "jsonl")
WHATS = ("datasets", "changes")
MANIFEST = "manifest.json"


class ExportExists(Exception):
    """The files an export would write exist already (and were not to be overwritten)."""


def file_names(what: str, fmt: str) -> tuple[str, str]:
    """The data file's name and the manifest's, in the output directory."""
    return f"{what}.{fmt}", MANIFEST


def check_free(directory: Path, what: str, fmt: str) -> None:
    """ExportExists naming the files of this export that ``directory`` holds already."""
    taken = [str(directory / name) for name in file_names(what, fmt) if (directory / name).exists()]
    if taken:
        raise ExportExists(f"{' and '.join(taken)} {'exists' if len(taken) == 1 else 'exist'} already: "
                           "choose another --output directory, or add --force to overwrite")


# -- values per format ------------------------------------------------------------------------------
def _utc(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(timezone.utc).isoformat()


def _text_value(value, kind: str):
    """A value as JSON Lines holds it (CSV further writes null as empty and booleans as true/false)."""
    if value is None:
        return None
    if kind == "timestamp":
        return _utc(value)
    return value


def _arrow_type(kind: str):
    import pyarrow as pa

    return {"int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(),
            "string": pa.string(), "json": pa.string(), "list<string>": pa.list_(pa.string()),
            "timestamp": pa.timestamp("us", tz="UTC")}[kind]


def arrow_schema(columns: Sequence[store.Column]):
    import pyarrow as pa

    return pa.schema([pa.field(c.name, _arrow_type(c.type), metadata={"description": c.description})
                      for c in columns])


# -- writers: each takes the batches, writes the file, returns how many rows ---------------------------
def write_parquet(path: Path, columns: Sequence[store.Column], batches: Iterable[list[tuple]]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema(columns)
    rows = 0
    with pq.ParquetWriter(str(path), schema) as writer:
        for batch in batches:
            arrays = [pa.array(values, type=field.type) for values, field in zip(zip(*batch), schema)]
            writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
            rows += len(batch)
            del arrays
    return rows


@contextlib.contextmanager
def _text_file(path: Path | None, newline: str):
    """``path`` opened for writing UTF-8 text; None: standard output."""
    if path is None:
        yield sys.stdout
        sys.stdout.flush()
        return
    with open(path, "w", encoding="utf-8", newline=newline) as out:
        yield out


def write_csv(path: Path | None, columns: Sequence[store.Column], batches: Iterable[list[tuple]]) -> int:
    kinds = [c.type for c in columns]
    rows = 0

    def cell(value, kind):
        value = _text_value(value, kind)
        if value is None:
            return ""
        if kind == "bool":
            return "true" if value else "false"
        if kind == "list<string>":
            return json.dumps(value, ensure_ascii=False)
        return value

    with _text_file(path, "") as out:
        writer = csv.writer(out, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
        writer.writerow([c.name for c in columns])
        for batch in batches:
            writer.writerows([cell(v, k) for v, k in zip(row, kinds)] for row in batch)
            rows += len(batch)
    return rows


def write_jsonl(path: Path | None, columns: Sequence[store.Column], batches: Iterable[list[tuple]]) -> int:
    names, kinds = [c.name for c in columns], [c.type for c in columns]
    rows = 0
    with _text_file(path, "\n") as out:
        for batch in batches:
            out.writelines(json.dumps({n: _text_value(v, k) for n, v, k in zip(names, row, kinds)},
                                      ensure_ascii=False) + "\n" for row in batch)
            rows += len(batch)
    return rows


WRITERS = {"parquet": write_parquet, "csv": write_csv, "jsonl": write_jsonl}


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# -- one export ---------------------------------------------------------------------------------------
def _source(conn, what: str, *, portal_url, since, include_removed, raw, batch_rows):
    if what == "datasets":
        return store.dataset_columns(raw), store.dataset_batches(
            conn, portal_url=portal_url, since=since, include_removed=include_removed, raw=raw, batch_rows=batch_rows)
    return store.CHANGE_COLUMNS, store.change_batches(conn, portal_url=portal_url, since=since, batch_rows=batch_rows)


def _check(what: str, fmt: str) -> None:
    if what not in WHATS:
        raise ValueError(f"cannot export {what!r}: choose one of {', '.join(WHATS)}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}")


def to_stdout(conn, what: str, fmt: str, *, portal_url: str | None = None, since: datetime | None = None,
              include_removed: bool = False, raw: bool = False, batch_rows: int = store.BATCH_ROWS) -> int:
    """CSV or JSON Lines on standard output, for a pipe (no manifest: nothing to checksum); the rows."""
    _check(what, fmt)
    if fmt == "parquet":
        raise ValueError("Parquet is not written to standard output: give --output a directory")
    with store.snapshot(conn):
        columns, batches = _source(conn, what, portal_url=portal_url, since=since, include_removed=include_removed,
                                   raw=raw, batch_rows=batch_rows)
        return WRITERS[fmt](None, columns, batches)


def export(conn, directory: Path, what: str, fmt: str, *, portal_name: str | None = None,
           portal_url: str | None = None, since: datetime | None = None, include_removed: bool = False,
           raw: bool = False, batch_rows: int = store.BATCH_ROWS) -> dict:
    """Write ``what`` (datasets or changes) as ``fmt`` into ``directory`` (which exists) and its
    manifest.json, from one snapshot of the database; the manifest."""
    _check(what, fmt)
    data_name, manifest_name = file_names(what, fmt)
    target = directory / data_name
    partial = directory / f".{data_name}.partial"
    generated_at = datetime.now(timezone.utc)
    try:
        with store.snapshot(conn):
            runs = store.committed_runs(conn, portal_url)
            columns, batches = _source(conn, what, portal_url=portal_url, since=since,
                                       include_removed=include_removed, raw=raw, batch_rows=batch_rows)
            rows = WRITERS[fmt](partial, columns, batches)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    filters = {"portal": portal_name, "portal_url": portal_url and redact_url(portal_url), "since": _utc(since)}
    if what == "datasets":
        filters.update(include_removed=include_removed, raw=raw)
    manifest = {
        "schema_version": SCHEMA_VERSION, "what": what, "format": fmt, "generated_at": _utc(generated_at),
        "filters": filters,
        "files": [{"path": data_name, "rows": rows, "bytes": target.stat().st_size, "sha256": sha256_of(target)}],
        "columns": [{"name": c.name, "type": c.type, "description": c.description} for c in columns],
        "runs": [{**run, "finished_at": _utc(run["finished_at"])} for run in runs],
    }
    manifest_partial = directory / f".{manifest_name}.partial"
    manifest_partial.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(manifest_partial, directory / manifest_name)
    return manifest
