"""`harvester export`'s files: row batches (store/export.py) written as Parquet, CSV or JSON Lines,
and the manifest that says what they hold.

Memory stays flat in the number of rows: each batch is written (Parquet: as one row group) before
the next is read. At every moment manifest.json describes the files beside it, or is absent (see
``export``): the data goes to a temporary file of our own (O_CREAT|O_EXCL|O_NOFOLLOW), is fsynced and
checksummed; only then the old manifest and the stale files of an earlier export go, the data file is
renamed into place, and the new manifest comes last, each step fsynced. Nothing inside the output
directory is followed through a symbolic link: one at a name the export writes or removes is refused.

Every format reads without options in pyarrow/pandas, DuckDB and Polars: Parquet with an explicit
schema (an empty export keeps its columns and types), CSV with a header row (RFC 4180 quoting,
UTF-8, lists and JSON as JSON text), JSON Lines one object per row; instants in UTC (Parquet
timestamp[us, tz=UTC]; text: ISO 8601 with +00:00).
"""
from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import json
import io
import os
import stat
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from harvester.config.secrets import redact_url
from harvester.store import export as store

SCHEMA_VERSION = 1
FORMATS = ("parquet", "csv", "jsonl")
WHATS = ("datasets", "changes")
MANIFEST = "manifest.json"


class ExportRefused(Exception):
    """The export cannot write into its directory as asked (the message names the path)."""


class ExportExists(ExportRefused):
    """The files an export would write exist already (and were not to be overwritten)."""


def file_names(what: str, fmt: str) -> tuple[str, str]:
    """The data file's name and the manifest's, in the output directory."""
    return f"{what}.{fmt}", MANIFEST


def partial_name(name: str) -> str:
    """The temporary name ``name`` is written under before it is renamed into place."""
    return f".{name}.partial"


def export_names() -> tuple[list[str], list[str]]:
    """Every name an export may leave in its directory, and their temporary names: the data files of
    both exports in every format and the manifest. A directory holds one export (one manifest.json),
    so with --force these are replaced or removed, whichever export and format wrote them."""
    finals = [f"{what}.{fmt}" for what in WHATS for fmt in FORMATS] + [MANIFEST]
    return finals, [partial_name(name) for name in finals]


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _refuse_unless_regular(directory: Path, name: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise ExportRefused(f"{directory / name} is a symbolic link: the export neither follows nor replaces one; "
                            "remove it or choose another --output directory")
    if not stat.S_ISREG(st.st_mode):
        raise ExportRefused(f"{directory / name} is not a regular file: the export does not replace it; "
                            "remove it or choose another --output directory")


def _preflight(directory: Path, dir_fd: int, force: bool) -> list[str]:
    """Refuses (naming the path) a symbolic link or a non-file at any name an export writes or
    removes, and without ``force`` any file an earlier export left; removes leftover temporary files
    (of an export killed midway: the caller holds the directory's lock, so no export is writing
    them); the final names present, which the export replaces or removes once its data is written."""
    finals, partials = export_names()
    present = {}
    for name in finals + partials:
        st = _lstat(dir_fd, name)
        if st is not None:
            _refuse_unless_regular(directory, name, st)
            present[name] = st
    taken = [name for name in finals if name in present]
    if taken and not force:
        named = " and ".join(str(directory / name) for name in taken)
        raise ExportExists(f"{named} {'exists' if len(taken) == 1 else 'exist'} already: "
                           "choose another --output directory, or add --force to overwrite")
    for name in partials:
        if name in present:
            os.unlink(name, dir_fd=dir_fd)
    return taken


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
# ``fd``: the open file descriptor to write to (left open), or None: standard output (CSV, JSON Lines).
def write_parquet(fd: int, columns: Sequence[store.Column], batches: Iterable[list[tuple]]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema(columns)
    rows = 0
    with open(fd, "wb", closefd=False) as out, pq.ParquetWriter(out, schema) as writer:
        for batch in batches:
            arrays = [pa.array(values, type=field.type) for values, field in zip(zip(*batch), schema)]
            writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
            rows += len(batch)
            del arrays
    return rows


@contextlib.contextmanager
def _text_file(fd: int | None, newline: str):
    """``fd`` as UTF-8 text to write (left open); None: standard output."""
    if fd is None:
        yield sys.stdout
        sys.stdout.flush()
        return
    with open(fd, "w", encoding="utf-8", newline=newline, closefd=False) as out:
        yield out


def _csv_cell(value, kind):
    value = _text_value(value, kind)
    if value is None:
        return ""
    if kind == "bool":
        return "true" if value else "false"
    if kind == "list<string>":
        return json.dumps(value, ensure_ascii=False)
    return value


def write_csv(fd: int | None, columns: Sequence[store.Column], batches: Iterable[list[tuple]]) -> int:
    kinds = [c.type for c in columns]
    rows = 0
    with _text_file(fd, "") as out:
        writer = csv.writer(out, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
        writer.writerow([c.name for c in columns])
        for batch in batches:
            writer.writerows([_csv_cell(v, k) for v, k in zip(row, kinds)] for row in batch)
            rows += len(batch)
    return rows


def _jsonl_line(names, kinds, row) -> str:
    return json.dumps({n: _text_value(v, k) for n, v, k in zip(names, row, kinds)}, ensure_ascii=False) + "\n"


def write_jsonl(fd: int | None, columns: Sequence[store.Column], batches: Iterable[list[tuple]]) -> int:
    names, kinds = [c.name for c in columns], [c.type for c in columns]
    rows = 0
    with _text_file(fd, "\n") as out:
        for batch in batches:
            out.writelines(_jsonl_line(names, kinds, row) for row in batch)
            rows += len(batch)
    return rows


def text_chunks(fmt: str, columns: Sequence[store.Column], batches: Iterable[list[tuple]]) -> Iterator[bytes]:
    """CSV or JSON Lines as UTF-8 bytes, one chunk per batch (the same bytes as ``write_csv`` /
    ``write_jsonl``): what the Harvester page streams to a browser, never holding more than a batch."""
    if fmt not in ("csv", "jsonl"):
        raise ValueError(f"cannot stream {fmt!r}: choose csv or jsonl")
    names, kinds = [c.name for c in columns], [c.type for c in columns]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
    if fmt == "csv":
        writer.writerow(names)
        yield buffer.getvalue().encode("utf-8")
    for batch in batches:
        buffer.seek(0)
        buffer.truncate()
        if fmt == "csv":
            writer.writerows([_csv_cell(v, k) for v, k in zip(row, kinds)] for row in batch)
        else:
            buffer.writelines(_jsonl_line(names, kinds, row) for row in batch)
        yield buffer.getvalue().encode("utf-8")


WRITERS = {"parquet": write_parquet, "csv": write_csv, "jsonl": write_jsonl}


def _sha256_fd(fd: int, chunk: int = 1 << 20) -> str:
    """SHA-256 of the whole file open at ``fd`` (read from its start, whatever its offset)."""
    digest = hashlib.sha256()
    offset = 0
    while block := os.pread(fd, chunk, offset):
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()


# -- files in the output directory, never through a symbolic link ---------------------------------------
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _create(directory: Path, dir_fd: int, name: str) -> int:
    """A new file ``name`` in the directory, to write (and read back); refused, naming it, if anything is at that
    name already (a symbolic link planted there is neither followed nor replaced)."""
    try:
        return os.open(name, _CREATE, 0o666, dir_fd=dir_fd)
    except FileExistsError:
        st = _lstat(dir_fd, name)
        if st is not None:
            _refuse_unless_regular(directory, name, st)
        raise ExportRefused(f"{directory / name} appeared while the export was starting: another process is "
                            "writing into the directory") from None


def _lock(directory: Path) -> int:
    """The output directory opened (a symbolic link given as the directory is followed: the user's
    choice), locked against another export writing into it; the descriptor, which the lock lasts with."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(dir_fd)
        raise ExportRefused(f"another export is writing into {directory}: wait for it to end, "
                            "or choose another --output directory") from None
    return dir_fd


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
           raw: bool = False, force: bool = False, batch_rows: int = store.BATCH_ROWS) -> dict:
    """Write ``what`` (datasets or changes) as ``fmt`` into ``directory`` (which exists) and its
    manifest.json, from one snapshot of the database; the manifest.

    At every moment manifest.json is absent or describes the files beside it, whenever the process
    dies (each step is fsynced, the directory's entries too):

    1. The directory is locked (flock) against another export; a symbolic link or a non-file at any
       name an export writes or removes is refused, naming it, before anything is written; without
       ``force`` so is any file an earlier export left (ExportExists); leftover temporary files go.
    2. The data is written to ``.<what>.<fmt>.partial``, created with O_EXCL|O_NOFOLLOW (never
       through a link), fsynced, its size and SHA-256 taken from the bytes written. An earlier
       export's manifest and files are still whole: a failed or killed export leaves them so.
    3. The old manifest is removed, then the stale files of the earlier export (a data file of
       another format or of the other export): from here no manifest is there to describe them.
    4. The data file is renamed into place; then the manifest is written to
       ``.manifest.json.partial`` (O_EXCL|O_NOFOLLOW), fsynced, and renamed into place, last.
    """
    _check(what, fmt)
    data_name, manifest_name = file_names(what, fmt)
    generated_at = datetime.now(timezone.utc)
    dir_fd = _lock(directory)
    created: list[str] = []
    try:
        earlier = _preflight(directory, dir_fd, force)
        partial = partial_name(data_name)
        fd = _create(directory, dir_fd, partial)
        created.append(partial)
        try:
            with store.snapshot(conn):
                runs = store.committed_runs(conn, portal_url)
                columns, batches = _source(conn, what, portal_url=portal_url, since=since,
                                           include_removed=include_removed, raw=raw, batch_rows=batch_rows)
                rows = WRITERS[fmt](fd, columns, batches)
            os.fsync(fd)
            size, digest = os.fstat(fd).st_size, _sha256_fd(fd)
        finally:
            os.close(fd)
        filters = {"portal": portal_name, "portal_url": portal_url and redact_url(portal_url), "since": _utc(since)}
        if what == "datasets":
            filters.update(include_removed=include_removed, raw=raw)
        manifest = {
            "schema_version": SCHEMA_VERSION, "what": what, "format": fmt, "generated_at": _utc(generated_at),
            "filters": filters,
            "files": [{"path": data_name, "rows": rows, "bytes": size, "sha256": digest}],
            "columns": [{"name": c.name, "type": c.type, "description": c.description} for c in columns],
            "runs": [{**run, "finished_at": _utc(run["finished_at"])} for run in runs],
        }
        if manifest_name in earlier:
            os.unlink(manifest_name, dir_fd=dir_fd)
            os.fsync(dir_fd)
        for name in earlier:
            if name not in (manifest_name, data_name):
                os.unlink(name, dir_fd=dir_fd)
        os.rename(partial, data_name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        created.remove(partial)
        os.fsync(dir_fd)

        manifest_partial = partial_name(manifest_name)
        fd = _create(directory, dir_fd, manifest_partial)
        created.append(manifest_partial)
        try:
            os.write(fd, (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(manifest_partial, manifest_name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        created.remove(manifest_partial)
        os.fsync(dir_fd)
        return manifest
    finally:
        for name in created:  # only what this export created: never a link someone else planted
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)
        os.close(dir_fd)
