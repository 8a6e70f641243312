"""Benchmark: the memory a large DCAT data.json catalogue costs, read over HTTP as a stream.

Generates a ~200 MB ``data.json`` from the real datos.gob.ar records in
../shared/dcat-samples/datos-gob-ar (new identifiers, varied titles and dates), serves it from a
local HTTP server on 127.0.0.1, and reads every record through ``DcatJsonSource.iter_pages`` in a
fresh process, as a harvest worker would (each page dropped once counted). Prints the file size,
records, seconds and the reading process's peak RSS against the target (300 MB); exits 1 when
the target is exceeded. A second, conditional request shows the 304 path.

    .venv/bin/python bench/dcat_memory_bench.py --size-mb 200

``generate(path, size_mb)`` and ``serve(directory) -> (url, stop)`` are meant to be reused.
"""
from __future__ import annotations

import argparse
import functools
import gzip
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins")]
SAMPLES = Path(os.environ.get("HARVESTER_DCAT_SAMPLES_DIR") or ROOT.parent / "shared" / "dcat-samples")
BASE_SNAPSHOT = SAMPLES / "datos-gob-ar" / "data.json-2018-07-10.json.gz"
TARGET_MB = 300


def _base_entries(path: Path = BASE_SNAPSHOT) -> list[dict]:
    with gzip.open(path, "rb") as handle:
        return json.load(handle)["dataset"]


def generate(path: Path, size_mb: float, *, base: Path = BASE_SNAPSHOT) -> int:
    """Write a catalogue of about ``size_mb`` MB to ``path``, entry by entry, from the real records
    of ``base`` (each copy with a unique identifier, a numbered title and its own modified date).
    Returns the number of entries written."""
    entries = _base_entries(base)
    limit = int(size_mb * 1024 * 1024)
    written = n = 0
    with Path(path).open("w", encoding="utf-8") as out:
        head = '{"@type": "dcat:Catalog", "title": "Generated from datos.gob.ar", "dataset": [\n'
        out.write(head)
        written += len(head)
        while written < limit:
            src = entries[n % len(entries)]
            item = {**src, "identifier": f"{src['identifier']}-{n:07d}", "title": f"{src['title']} #{n}",
                    "modified": f"2024-{1 + n % 12:02d}-{1 + n % 28:02d}T{n % 24:02d}:{n % 60:02d}:00"}
            text = ("," if n else "") + json.dumps(item, ensure_ascii=False) + "\n"
            out.write(text)
            written += len(text.encode("utf-8"))
            n += 1
        out.write("]}\n")
    return n


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no access log on stderr
        pass


def serve(directory: Path) -> tuple[str, Callable[[], None]]:
    """Serve ``directory`` over HTTP on 127.0.0.1 (Last-Modified, 304 to If-Modified-Since) from a
    background thread. Returns the base URL and a function that stops the server."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(directory)))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="dcat-bench-http", daemon=True)
    thread.start()

    def stop() -> None:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)

    return f"http://127.0.0.1:{httpd.server_address[1]}", stop


def _rss_mb() -> float:
    """The current resident set size (Linux /proc), in MB."""
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _read_catalogue(url: str, page_size: int, validators: dict | None, out) -> None:
    """In a fresh process: every record of the catalogue at ``url``, pages dropped once counted."""
    from harvester.sources.dcat_json import DcatJsonSource
    from harvester.http import HttpFetcher

    baseline = _rss_mb()
    source = DcatJsonSource(url, fetcher=HttpFetcher(url), page_size=page_size)
    started = time.monotonic()
    records = failed = pages = 0
    for page in source.iter_pages(validators):
        pages += 1
        records += len(page)
        failed += sum(not r.ok for r in page)
        del page
    out.put({
        "records": records, "failed": failed, "pages": pages, "seconds": time.monotonic() - started,
        "baseline_rss_mb": baseline, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "requests": source.requests_made, "bytes": source.bytes_received, "not_modified": source.not_modified,
        "validators": source.validators,
    })


def measure(url: str, *, page_size: int = 1000, validators: dict | None = None) -> dict:
    """Read the catalogue at ``url`` in a fresh process and return its figures (its peak RSS is
    the reading's alone, not this process's)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_read_catalogue, args=(url, page_size, validators, out))
    child.start()
    result = out.get()
    child.join()
    if child.exitcode:
        raise RuntimeError(f"the reading process exited with {child.exitcode}")
    return result


def _harvest(url: str, database_url: str, out) -> None:
    """In a fresh process: a harvest run of the catalogue at ``url`` into ``database_url`` (fetch,
    classification and change detection, the upsert's merge and history), embedding left for a
    later run, as when the provider's breaker is open: the steps whose memory could grow with the
    catalogue. (Embedding holds one batch of texts at a time.)"""
    from harvester.pipeline import steps as pipeline
    from harvester.config.portals import Portal
    from harvester.store import db

    baseline = _rss_mb()
    portal = Portal(name="bench", url=url, type="dcat-json", politeness_delay=0, reconcile_every=None)
    started = time.monotonic()
    with db.prepare(db.connect_url(database_url)) as conn, db.prepare(db.connect_url(database_url)) as reader:
        run_id = pipeline.begin(conn, portal)["run_id"]
        pipeline.fetch_modified(conn, portal, run_id, pipeline.source_for(portal))
        pipeline.hash_compare(conn, reader, portal, run_id)
        stats = pipeline.upsert(conn, portal, run_id, "none")
    out.put({"seconds": time.monotonic() - started, "baseline_rss_mb": baseline,
             "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
             **{k: stats.get(k, 0) for k in ("fetched", "created", "failed", "skipped", "portal_requests")}})


def measure_run(url: str, database_url: str) -> dict:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_harvest, args=(url, database_url, out))
    child.start()
    result = out.get()
    child.join()
    if child.exitcode:
        raise RuntimeError(f"the harvesting process exited with {child.exitcode}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=200, help="size of the generated data.json")
    parser.add_argument("--page-size", type=int, default=1000, help="records per page (what a run holds at once)")
    parser.add_argument("--dir", type=Path, help="generate here and keep the file (default: a temporary directory)")
    parser.add_argument("--no-run", action="store_true", help="only read the catalogue, no harvest run into PostgreSQL")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="dcat-bench-") as tmp:
        directory = args.dir or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "data.json"
        started = time.monotonic()
        entries = generate(path, args.size_mb)
        size_mb = path.stat().st_size / 1024 / 1024
        print(f"generated {path}: {size_mb:.1f} MB, {entries} entries in {time.monotonic() - started:.1f}s")

        url, stop = serve(directory)
        try:
            full = measure(f"{url}/data.json", page_size=args.page_size)
            again = measure(f"{url}/data.json", page_size=args.page_size, validators=full["validators"])
            run = None
            if not args.no_run:
                from harvester.store import db
                from harvester.store.embedded.server import EmbeddedServer

                server = EmbeddedServer(directory / "pg")
                try:
                    database_url = server.start()
                    with db.prepare(db.connect_url(database_url)):
                        pass  # migrated
                    run = measure_run(f"{url}/data.json", database_url)
                finally:
                    server.stop()
        finally:
            stop()

    ok = full["peak_rss_mb"] < TARGET_MB
    print(f"file size       {size_mb:10.1f} MB")
    print(f"records         {full['records']:10d} ({full['failed']} failed) in {full['pages']} pages of "
          f"{args.page_size}")
    print(f"seconds         {full['seconds']:10.1f} ({size_mb / max(full['seconds'], 1e-9):.1f} MB/s)")
    print(f"bytes received  {full['bytes']:10d} in {full['requests']} request(s)")
    print(f"RSS after imports {full['baseline_rss_mb']:8.1f} MB")
    print(f"peak RSS        {full['peak_rss_mb']:10.1f} MB (target < {TARGET_MB} MB: {'OK' if ok else 'EXCEEDED'})")
    print(f"second run      {'304 not modified' if again['not_modified'] else 'read again'}: "
          f"{again['records']} records, {again['requests']} request(s), {again['seconds']:.2f}s")
    if run is not None:
        run_ok = run["peak_rss_mb"] < TARGET_MB
        ok = ok and run_ok
        print(f"harvest run     {run['seconds']:10.1f} s: fetched {run['fetched']}, created {run['created']}, "
              f"failed {run['failed']}, {run['portal_requests']} portal request(s); embedding left pending "
              f"({run['skipped']})")
        print(f"run peak RSS    {run['peak_rss_mb']:10.1f} MB (after imports {run['baseline_rss_mb']:.1f} MB; "
              f"target < {TARGET_MB} MB: {'OK' if run_ok else 'EXCEEDED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
