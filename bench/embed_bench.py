"""Benchmark: the local embedding provider on the demo's real records, as a task meets it.

The texts are exactly what a run embeds for the demo's records (`make demo`: the nine sample
files of plugins/harvester/testing/demo.py, normalized, title + description as
domain.dataset.embedding_text builds it, each distinct text once). Each measurement runs in a fresh
process, as an Airflow task does: the model's load (import, weights, first batch), then every text
in batches of the provider's max_batch, timed; its peak RSS is the kernel's count (ru_maxrss from
wait4, in a small launcher that forks, as bench/first_sync_bench.py does). Prints, per path, load
time, texts/s and peak RSS beside issue 27's goals. Asserts nothing about time.

    .venv/bin/python bench/embed_bench.py                 # today's path (sentence-transformers on PyTorch)
    .venv/bin/python bench/embed_bench.py --repeats 3     # the fastest of three fresh processes counts
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "bench")]

from first_sync_bench import LAUNCHER  # noqa: E402  (fork + exec + wait4: the child's own peak)

# Issue 27's goals, on 2 cores.
GOAL_TEXTS_PER_S = 200.0
GOAL_RSS_MB = 400.0
GOAL_LOAD_S = 3.0

# What a fresh process does: load the model (the first batch included, as the first call of a
# task loads it), then embed every text in the provider's batches. Prints its figures as JSON.
CHILD = """
import json, sys, time
t0 = time.perf_counter()
from harvester.embeddings.local import LocalProvider
texts = json.load(open(sys.argv[1]))
provider = LocalProvider()
provider.embed_documents(texts[:1])
loaded = time.perf_counter() - t0
t1 = time.perf_counter()
for i in range(0, len(texts), provider.max_batch):
    provider.embed_documents(texts[i:i + provider.max_batch])
took = time.perf_counter() - t1
print(json.dumps({"model": provider.model, "load_s": loaded, "embed_s": took, "texts": len(texts)}))
"""


def demo_texts() -> list[str]:
    """The distinct texts the demo's first run embeds."""
    from harvester.domain import dataset as ds
    from harvester.testing.ckan_portal import load_jsonl
    from harvester.testing.demo import sample_files

    seen: dict[str, str] = {}
    for path in sample_files():
        for pkg in load_jsonl(path):
            rec = ds.normalize(pkg, "http://127.0.0.1/demo")
            if rec.ok:
                text = ds.embedding_text(rec.title, rec.description)
                seen.setdefault(ds.content_hash(text), text)
    return list(seen.values())


def measure(texts_file: Path, env: dict) -> dict:
    with tempfile.NamedTemporaryFile("r", suffix=".maxrss") as peak:
        done = subprocess.run([sys.executable, "-c", LAUNCHER, peak.name, sys.executable, "-c", CHILD,
                               str(texts_file)], capture_output=True, text=True, env=env, timeout=1800)
        if done.returncode:
            raise SystemExit(f"embed_bench: the embedding process failed:\n{done.stderr[-3000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        figures["peak_rss_mb"] = int(Path(peak.name).read_text()) / 1024
    figures["texts_per_s"] = figures["texts"] / figures["embed_s"]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per path (the fastest counts)")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args()
    texts = demo_texts()
    chars = sum(len(t) for t in texts)
    print(f"{len(texts)} distinct texts of the demo's records ({chars / len(texts):.0f} characters on average); "
          f"{os.cpu_count()} CPUs")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins"), "HF_HUB_OFFLINE": "1"}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(texts, f)
    try:
        runs = [measure(Path(f.name), env) for _ in range(max(1, args.repeats))]
    finally:
        os.unlink(f.name)
    best = max(runs, key=lambda r: r["texts_per_s"])
    results = {"torch": {**best, "runs": runs}}
    print("\n| path | model | load (s) | texts/s | peak RSS (MB) |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['model']} | {r['load_s']:.1f} | {r['texts_per_s']:,.1f} | {r['peak_rss_mb']:,.0f} |")
    print(f"\ngoals (issue 27): at least {GOAL_TEXTS_PER_S:.0f} texts/s, peak RSS at most {GOAL_RSS_MB:.0f} MB, "
          f"load at most {GOAL_LOAD_S:.0f} s")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
