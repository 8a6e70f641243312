"""Benchmark: a first sync and a no-change incremental run of each new kind of portal, at scale.

For each kind (Socrata, OpenDataSoft, ArcGIS Hub, CSW, ISO WAF, udata, DCAT over SPARQL, STAC, SDMX,
OAI-PMH, and CKAN as the reference) a synthetic
catalogue of ``--datasets`` records is derived from the real recorded answers in tests/data/<kind>/
(CKAN: from ../shared/ckan-samples, as harvest_bench.py does): new ids, numbered titles, distinct
modification times in the past. Each is served by the kind's local server of
plugins/harvester/testing/ (in a child process) over real HTTP and harvested into the embedded
PostgreSQL through the pipeline's real steps (what ``harvest()`` does: begin, fetch_modified,
reconcile, hash_compare, embed_changed, upsert, timed each), without Airflow, each kind into a
database of its own (a copy of the same empty one), so that every first sync starts from an empty
table. Vectors come from the Gemini provider (the real google-genai SDK) talking to the local
Gemini-protocol stand-in (FakeGemini), so a first sync's time includes embedding every dataset at
zero provider latency; the no-change run embeds nothing.

Per kind it prints: the first sync's wall time (and each step's), portal requests, bytes received
and datasets/s; then a no-change incremental run's wall time, requests and bytes. Prints figures;
asserts nothing about time; exits 0 (a kind that fails is reported and the others go on).

    .venv/bin/python bench/sources_bench.py                       # every kind, 20,000 datasets each (WAF: 5,000)
    .venv/bin/python bench/sources_bench.py --datasets 2000 --kinds socrata,csw
    .venv/bin/python bench/sources_bench.py --datasets 12000 --kinds socrata   # past the capped count

Socrata past its capped count (issue 36): ``--datasets 12000 --kinds socrata`` is the run of the
finding. The Discovery API's ``resultSetSize`` (and its local server's) says 10000 for any larger
catalogue, so the first sync must read the scroll to its empty page (13 requests: 12 pages of 1,000
and the empty one) and store 12,000; the no-change run must take the capped count as "at least
10,000" and not reconcile (2 requests). Before issue 36 the first sync stored 10,000 and every
later run reconciled on the count's "2,000 fewer".
The CKAN reference needs the CKAN samples (../shared/ckan-samples or HARVESTER_SAMPLES_DIR), as
harvest_bench.py does; the other kinds need only tests/data/.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "bench")]
DATA = ROOT / "tests" / "data"
# The kinds of issue 39 are served by their test server module's ``bench_catalogue(n)``
# (plugins/harvester/testing/<module>_portal.py): a catalogue of ``n`` records derived from the real
# recorded answers of ../shared/portal-samples/, and the URL to harvest it from once it runs.
NEW_KINDS = {"iso-waf": "iso_waf_portal", "udata": "udata_portal", "dcat-sparql": "sparql_portal",
             "stac": "stac_portal", "sdmx": "sdmx_portal", "oai-pmh": "oai_pmh_portal"}
KINDS = ("ckan", "socrata", "opendatasoft", "arcgis-hub", "csw", *NEW_KINDS)
# A Web Accessible Folder is fetched one file a request: its bench serves 5,000 files (issue 39).
DEFAULT_DATASETS = {"iso-waf": 5000}
# Every synthetic modification time lies in 2024: far behind any lookback, so a no-change run sees nothing.
START = datetime(2024, 1, 1, tzinfo=timezone.utc)


def _when(i: int) -> datetime:
    return START + timedelta(minutes=i)


# -- the synthetic catalogues, one server per kind ----------------------------------------------------
def ckan_server(n: int):
    from harvest_bench import synthetic

    from harvester.testing.ckan_portal import DemoPortal

    server = DemoPortal(synthetic(n))
    return server, lambda: server.base_url  # known once it runs


def socrata_server(n: int):
    from harvester.testing.socrata_portal import SocrataServer

    base: dict[str, dict] = {}
    for name in ("chicago_transportation.json", "chicago_cta.json", "chicago_ids.json"):
        for result in json.loads((DATA / "socrata" / name).read_text(encoding="utf-8"))["results"]:
            base.setdefault(result["resource"]["id"], result)
    bases = list(base.values())
    server = SocrataServer()
    domain = "data.cityofchicago.org"
    for i in range(n):
        result = copy.deepcopy(bases[i % len(bases)])
        ident = f"b{i // 10000:03d}-{i % 10000:04d}"
        at = _when(i).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        result["resource"].update(id=ident, name=f"{result['resource']['name']} #{i}", updatedAt=at,
                                  metadata_updated_at=at)
        result["permalink"] = f"https://{domain}/d/{ident}"
        result["link"] = f"https://{domain}/d/{ident}"
        server.put(result)
    return server, lambda: server.base_url


def opendatasoft_server(n: int):
    from harvester.testing.opendatasoft_portal import OpenDataSoftPortal, fixture_datasets

    bases = fixture_datasets()
    datasets = []
    for i in range(n):
        ds = copy.deepcopy(bases[i % len(bases)])
        ds["dataset_id"] = f"bench-{i:06d}"
        default = ds.setdefault("metas", {}).setdefault("default", {})
        default["title"] = f"{default.get('title') or ds['dataset_id']} #{i}"
        default["modified"] = _when(i).strftime("%Y-%m-%dT%H:%M:%S+00:00")
        datasets.append(ds)
    server = OpenDataSoftPortal(datasets)
    return server, lambda: server.base_url


def arcgis_hub_server(n: int):
    from harvester.testing.arcgis_hub_portal import ArcGisHubServer, derived_features, features_from_dcat

    template = json.loads((DATA / "arcgis-hub" / "ogcItemsResponseWithNext.json").read_text(encoding="utf-8"))
    template = template["features"][0]
    feed = json.loads((DATA / "arcgis-hub" / "sce-drpep-hub-dcat-us-1.1.json").read_text(encoding="utf-8"))
    bases = [template] + features_from_dcat(feed, template)
    start_ms = int(START.timestamp() * 1000)
    features = []
    for b, base in enumerate(bases):  # n split among the real features, each's copies one minute apart
        count = n // len(bases) + (1 if b < n % len(bases) else 0)
        features += derived_features(base, count, start_ms=start_ms + b * 1000)
    server = ArcGisHubServer(features)
    return server, lambda: server.url


def csw_server(n: int):
    from harvester.testing.csw_portal import DC_RECORD, NS, CswServer, derive, load_records

    bases = []
    for name in ("iso_getrecords_pycsw.xml", "iso_getrecords_inspire.xml", "dc_getrecords_pycsw.xml"):
        bases += load_records(DATA / "csw" / name)
    # Only the records a harvester takes: a recorded Dublin Core record without dc:title is refused
    # (rightly), so it is left out of the copies.
    bases = [b for b in bases if b.tag != DC_RECORD or b.find("dc:title", NS) is not None]
    records = [derive(bases[i % len(bases)], f"bench-{i:06d}", title=f"Record {i}",
                      modified=_when(i).strftime("%Y-%m-%dT%H:%M:%SZ")) for i in range(n)]
    server = CswServer(records)
    return server, lambda: server.url


def _new_kind_server(kind: str):
    def serve(n: int):
        import importlib

        return importlib.import_module(f"harvester.testing.{NEW_KINDS[kind]}").bench_catalogue(n)
    return serve


SERVERS = {"ckan": ckan_server, "socrata": socrata_server, "opendatasoft": opendatasoft_server,
           "arcgis-hub": arcgis_hub_server, "csw": csw_server,
           **{kind: _new_kind_server(kind) for kind in NEW_KINDS}}


STEPS = ("begin", "fetch_modified", "reconcile", "hash_compare", "embed_changed", "upsert")


def timed_harvest(pipeline, conn, reader, portal, provider, *, full_sync: bool) -> tuple[dict, dict]:
    """What ``pipeline.harvest()`` does, step by step (as the DAG's tasks call them), timing each."""
    source = pipeline.source_for(portal)
    times = {}
    started = time.perf_counter()
    run_id = pipeline.begin(conn, portal, full_sync=full_sync)["run_id"]
    times["begin"] = time.perf_counter() - started
    try:
        for step in STEPS[1:]:
            started = time.perf_counter()
            if step == "fetch_modified":
                pipeline.fetch_modified(conn, portal, run_id, source)
            elif step == "reconcile":
                pipeline.reconcile(conn, portal, run_id, source)
            elif step == "hash_compare":
                planned = pipeline.hash_compare(conn, reader, portal, run_id, provider.model)
            elif step == "embed_changed":
                pipeline.embed_changed(conn, reader, portal, run_id, provider,
                                       bulk_index=planned.get("bulk_index", False))
            else:
                stats = pipeline.upsert(conn, portal, run_id, provider.model, provider.max_batch,
                                        open_connection=lambda: contextlib.nullcontext(reader))
            times[step] = time.perf_counter() - started
    except BaseException as exc:
        pipeline.abort(conn, run_id, f"{type(exc).__name__}: {exc}")
        raise
    return stats, times


def _serve(kind: str, n: int, pipe) -> None:
    """In a process of its own: build the kind's catalogue, serve it, send its URL, wait for "stop"."""
    server, url = SERVERS[kind](n)
    with server:
        pipe.send(url())
        pipe.recv()


@contextlib.contextmanager
def served(kind: str, n: int):
    """The kind's local server in a child process, so that the harvester's process (whose time is
    measured) does not also carry the server's 20,000 records: the stand-ins hold them as Python
    objects (CSW: ElementTree elements, millions of them), and the cyclic garbage collector, walking
    them, made the harvester's own parsing several times slower when both shared a process."""
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(kind, n, theirs), daemon=True, name=f"{kind}-portal")
    proc.start()
    try:
        if not mine.poll(600):
            raise RuntimeError(f"the local {kind} server did not start within 600 s")
        yield mine.recv()
    finally:
        with contextlib.suppress(OSError):
            mine.send("stop")
        proc.join(30)
        if proc.is_alive():
            proc.terminate()
            proc.join(10)


def bench_kind(kind: str, n: int, url: str, provider) -> dict:
    from harvester.config.portals import Portal
    from harvester.pipeline import steps as pipeline
    from harvester.store import db

    out = {"kind": kind}
    started = time.perf_counter()
    with served(kind, n) as portal_url:
        out["serve_setup"] = time.perf_counter() - started
        portal = Portal(name=f"bench-{kind}", url=portal_url, type=kind, politeness_delay=0)
        with db.prepare(db.connect_url(url)) as conn, db.prepare(db.connect_url(url)) as reader:
            for label, full in (("first", True), ("incremental", False)):
                started = time.perf_counter()
                stats, times = timed_harvest(pipeline, conn, reader, portal, provider, full_sync=full)
                out[label] = dict(stats, took=time.perf_counter() - started, times=times)
            out["stored"] = conn.execute(
                "SELECT count(*) FROM datasets WHERE portal_url = %s AND removed_at IS NULL",
                (portal.url,)).fetchone()[0]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=None,
                        help="synthetic datasets per kind (default 20,000; iso-waf: 5,000 files)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated kinds to run (default: all: {','.join(KINDS)})")
    parser.add_argument("--dimension", type=int, default=768, help="vector dimension of the local Gemini stand-in")
    parser.add_argument("--verbose", action="store_true", help="the harvester's log lines too")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in SERVERS]
    if unknown:
        parser.error(f"unknown kind(s) {', '.join(unknown)}; valid kinds: {', '.join(KINDS)}")
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    import psycopg

    from harvester.embeddings.gemini import GeminiProvider
    from harvester.store.embedded.server import EmbeddedServer
    from harvester.testing.gemini import FakeGemini

    home = Path(tempfile.mkdtemp(prefix="harvester-sources-bench-"))
    server = EmbeddedServer(home)
    url = server.start()
    template = psycopg.conninfo.conninfo_to_dict(url)["dbname"]  # empty; each kind gets a copy of it
    os.environ["HARVESTER_EMBED_RETRY_DELAY_SECS"] = "0"
    results = []
    try:
        with FakeGemini(valid_keys={"AIza-bench"}) as fake:
            provider = GeminiProvider(api_key="AIza-bench", base_url=fake.base_url, dimension=args.dimension)
            for kind in kinds:
                n = args.datasets or DEFAULT_DATASETS.get(kind, 20000)
                print(f"{kind}: serving {n} synthetic datasets ...", flush=True)
                began = time.perf_counter()
                try:
                    # each kind in a database of its own: a first sync into an empty table, as a new
                    # deployment's (the vector index built in bulk), not on top of the kinds before it
                    name = "bench_" + kind.replace("-", "_")
                    with psycopg.connect(server.url("postgres"), autocommit=True) as admin:
                        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
                    r = bench_kind(kind, n, server.url(name), provider)
                except Exception as exc:  # noqa: BLE001 - a bench reports a kind that fails and goes on
                    traceback.print_exc()
                    print(f"{kind}: FAILED (above); the other kinds go on", flush=True)
                    results.append({"kind": kind, "error": f"{type(exc).__name__}: {exc}",
                                    "took": time.perf_counter() - began})
                    continue
                first, inc = r["first"], r["incremental"]
                print(f"{kind}: first sync {first['took']:.1f}s, {first['portal_requests']} requests, "
                      f"{first['portal_bytes']:,} bytes, stored {r['stored']}; incremental {inc['took']:.1f}s, "
                      f"{inc['portal_requests']} requests, {inc['portal_bytes']:,} bytes "
                      f"(catalogue built in {r['serve_setup']:.1f}s)", flush=True)
                steps = ", ".join(f"{k} {v:.1f}s" for k, v in first["times"].items())
                print(f"{kind}: first sync by step: {steps}", flush=True)
                results.append(r)
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)  # the database: gigabytes at scale

    print()
    print(f"{args.datasets or 20000:,} synthetic datasets per kind"
          f"{'' if args.datasets else ' (iso-waf: 5,000 files)'}, local servers over HTTP, embedded PostgreSQL, "
          f"local Gemini stand-in (zero latency)")
    head = ("kind", "stored", "first sync", "requests", "bytes", "datasets/s",
            "no-change run", "requests", "bytes")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in results:
        if "error" in r:
            print(f"| {r['kind']} | FAILED after {r['took']:.1f} s: {r['error']} |" + " |" * (len(head) - 2))
            continue
        first, inc = r["first"], r["incremental"]
        print(f"| {r['kind']} | {r['stored']:,} | {first['took']:.1f} s | {first['portal_requests']} | "
              f"{first['portal_bytes'] / 1e6:.1f} MB | {r['stored'] / first['took']:,.0f} | {inc['took']:.2f} s | "
              f"{inc['portal_requests']} | {inc['portal_bytes'] / 1e3:.1f} KB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
