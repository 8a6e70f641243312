"""Benchmark: what writing per-record outcomes costs a run that meets many failed records.

A DCAT data.json catalogue (served over HTTP by the local catalogue server of the tests) lists
``--ok`` good entries (from the real datos.gob.ar snapshot, which names no schema) and ``--failed``
entries without an identifier or a landing page, which every version of Harvester refuses. The
same full sync runs on two checkouts, each in a process of its own with a fresh embedded
PostgreSQL: this one, and ``--base`` (a git revision, checked out in a temporary worktree: the
code before per-record outcomes). The catalogue is served by this process; each checkout's sync runs
in a child, whose peak RSS (the kernel's VmHWM) is then the harvest's. Prints each step's wall
time, the run's, the peak RSS and the difference; asserts nothing.

    .venv/bin/python bench/outcomes_bench.py --failed 100000 --ok 1000 --base 4df1f61
"""
from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DCAT = Path(os.environ.get("HARVESTER_DCAT_SAMPLES_DIR") or ROOT.parent / "shared" / "dcat-samples")
START = datetime(2024, 1, 1)
STEPS = ("begin", "fetch_modified", "hash_compare", "embed_changed", "upsert")


def catalogue(ok: int, failed: int) -> bytes:
    base = json.loads(gzip.decompress((DCAT / "datos-gob-ar" / "data.json-2018-07-10.json.gz").read_bytes()))
    entries = []
    for i in range(ok + failed):
        entry = copy.deepcopy(base["dataset"][i % len(base["dataset"])])
        entry["modified"] = (START + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S")
        entry["title"] = f"{entry.get('title')} #{i}"
        if i < ok:
            entry["identifier"] = f"bench-{i:07d}"
        else:
            entry.pop("identifier", None)
            entry.pop("landingPage", None)
        entries.append(entry)
    return json.dumps({"title": base.get("title"), "dataset": entries}).encode()


def child(catalogue_url: str) -> None:
    """One full sync of ``catalogue_url`` on the checkout whose plugins/ is first on sys.path;
    prints JSON timings and the process's peak RSS (the catalogue is served by the parent, so the
    peak is the harvest's alone)."""
    import logging

    logging.disable(logging.WARNING)  # the per-record warnings are the same on both sides; not the point
    from harvester.config.portals import Portal
    from harvester.embeddings.gemini import GeminiProvider
    from harvester.pipeline import steps as pipeline
    from harvester.store import db
    from harvester.store.embedded.server import EmbeddedServer
    from harvester.testing.gemini import FakeGemini

    home = Path(tempfile.mkdtemp(prefix="harvester-outcomes-bench-"))
    server = EmbeddedServer(home)
    url = server.start()
    os.environ["HARVESTER_EMBED_RETRY_DELAY_SECS"] = "0"
    times: dict[str, float] = {}
    try:
        with FakeGemini(valid_keys={"AIza-bench"}) as fake:
            portal = Portal(name="bench", url=catalogue_url, type="dcat-json", politeness_delay=0, page_size=1000)
            provider = GeminiProvider(api_key="AIza-bench", base_url=fake.base_url)
            with db.prepare(db.connect_url(url)) as conn, db.prepare(db.connect_url(url)) as reader:
                source = pipeline.source_for(portal)

                def timed(name, call):
                    started = time.perf_counter()
                    out = call()
                    times[name] = time.perf_counter() - started
                    return out

                run_id = timed("begin", lambda: pipeline.begin(conn, portal, full_sync=True))["run_id"]
                timed("fetch_modified", lambda: pipeline.fetch_modified(conn, portal, run_id, source))
                timed("hash_compare", lambda: pipeline.hash_compare(conn, reader, portal, run_id, provider.model))
                timed("embed_changed", lambda: pipeline.embed_changed(conn, reader, portal, run_id, provider))
                stats = timed("upsert", lambda: pipeline.upsert(conn, portal, run_id, provider.model))
                has_table = conn.execute("SELECT to_regclass('record_outcomes') IS NOT NULL").fetchone()[0]
                rows = conn.execute("SELECT count(*) FROM record_outcomes").fetchone()[0] if has_table else None
        # The kernel's high-water mark of this process's resident set (VmHWM: reset by exec, unlike
        # getrusage's maxrss, which a child inherits from the parent that forked it).
        status = Path("/proc/self/status").read_text()
        peak_mb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024
        print(json.dumps({"times": times, "failed": stats["failed"], "created": stats["created"], "rows": rows,
                          "peak_mb": peak_mb}))
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)  # the database: gigabytes at scale


def run_tree(plugins: Path, catalogue_url: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(plugins)}
    out = subprocess.run([sys.executable, __file__, "--child", catalogue_url],
                         env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"the run on {plugins} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ok", type=int, default=1000)
    parser.add_argument("--failed", type=int, default=100000)
    parser.add_argument("--base", default="4df1f61", help="the git revision to compare with")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    sys.path.insert(0, str(ROOT / "plugins"))
    from harvester.testing.dcat_portal import DcatServer

    portal_server = DcatServer().start()
    portal_server.set_document("/data.json", catalogue(args.ok, args.failed))
    work = Path(tempfile.mkdtemp(prefix="harvester-base-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(work / "tree"), args.base],
                   check=True, capture_output=True, timeout=120)
    try:
        results = {}
        for label, plugins in ((f"base {args.base}", work / "tree" / "plugins"), ("this checkout", ROOT / "plugins")):
            results[label] = run_tree(plugins, portal_server.url("/data.json"))
            r = results[label]
            print(f"{label:18s} " + "  ".join(f"{s}={r['times'][s]:6.2f}s" for s in STEPS)
                  + f"  total={sum(r['times'].values()):6.2f}s  failed={r['failed']} created={r['created']}"
                  + f" outcome rows={r['rows']} peak RSS={r['peak_mb']:.0f} MB")
        base, new = results.values()
        extra = sum(new["times"].values()) - sum(base["times"].values())
        print(f"extra cost of writing the outcomes of {args.failed} failed records: {extra:+.2f}s "
              f"(fetch_modified {new['times']['fetch_modified'] - base['times']['fetch_modified']:+.2f}s, "
              f"hash_compare {new['times']['hash_compare'] - base['times']['hash_compare']:+.2f}s)")
    finally:
        portal_server.stop()
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "tree")],
                       capture_output=True, timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
