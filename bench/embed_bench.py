"""Benchmark: the local embedding provider on the demo's real records, as a task meets it.

The texts are exactly what a run embeds for the demo's records (`make demo`: the nine sample
files of plugins/harvester/testing/demo.py, normalized, title + description as
domain.dataset.embedding_text builds it, each distinct text once: harvester.testing.demo.embedded_texts).
Each path runs in a fresh process, as an Airflow task does: the model's load (imports, the export's
check, the session, the first batch), then every text in batches of the provider's max_batch, timed;
its peak RSS is the kernel's count (ru_maxrss from wait4, in a small launcher that forks, as
bench/first_sync_bench.py does). Paths:

- ``torch``: all-MiniLM-L6-v2 on sentence-transformers / PyTorch (the path before issue 27);
- ``onnx``: all-MiniLM-L6-v2 through ONNX Runtime (the default);
- ``e5``: multilingual-e5-small through ONNX Runtime.

Before the ONNX paths are timed, their export is made once in a fresh cache (a temporary
HARVESTER_MODEL_CACHE) and timed: what a machine without the export pays once. Each path's vectors
are compared with the torch path's (cosine per text: min and mean; e5 is another model, so it is
compared with nothing). Prints load time, texts/s, peak RSS and the cosines side by side, beside
issue 27's goals; ``--profile`` also prints where the ONNX paths' time goes (tokenizing, ONNX
Runtime by operator, pooling). Asserts nothing about time.

    .venv/bin/python bench/embed_bench.py                      # all three paths
    .venv/bin/python bench/embed_bench.py --paths torch,onnx --repeats 3   # the fastest of three fresh processes
    .venv/bin/python bench/embed_bench.py --profile
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "bench")]

from first_sync_bench import LAUNCHER  # noqa: E402  (fork + exec + wait4: the child's own peak)
from harvester.testing.demo import embedded_texts  # noqa: E402

# Issue 27's goals, on 2 cores.
GOAL_TEXTS_PER_S = 200.0
GOAL_RSS_MB = 400.0
GOAL_LOAD_S = 3.0

# What a fresh process does: load the model (the first batch included, as the first call of a
# task loads it), then embed every text in the provider's batches. Prints its figures as JSON and
# saves the vectors (argv[2]).
CHILD = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from harvester.embeddings.local import LocalProvider
texts = json.load(open(sys.argv[1]))
provider = LocalProvider()
provider.embed_documents(texts[:1])
loaded = time.perf_counter() - t0
t1 = time.perf_counter()
vectors = []
for i in range(0, len(texts), provider.max_batch):
    vectors += provider.embed_documents(texts[i:i + provider.max_batch])
took = time.perf_counter() - t1
np.save(sys.argv[2], np.asarray(vectors, dtype=np.float32))
encoder = provider._encoder()
print(json.dumps({"model": provider.model, "load_s": loaded, "embed_s": took, "texts": len(texts),
                  "runtime": "onnx" if encoder is not None else "torch",
                  "precision": encoder.manifest["precision"] if encoder is not None else "fp32",
                  "threads": encoder.threads if encoder is not None else None}))
"""

# Where an ONNX path's time goes: tokenizing, the session by operator (ONNX Runtime's own profiler),
# pooling and normalizing (the rest).
PROFILE = """
import json, sys, time, collections
import numpy as np
import onnxruntime as ort
from harvester.embeddings import onnx
from harvester.embeddings.local import LocalProvider
texts = json.load(open(sys.argv[1]))
provider = LocalProvider()
encoder = provider._encoder()
t = time.perf_counter(); encodings = encoder.tokenizer.encode_batch(texts); tokenize = time.perf_counter() - t
tokens = sum(len(e.ids) for e in encodings)
options = ort.SessionOptions(); options.intra_op_num_threads = encoder.threads; options.inter_op_num_threads = 1
options.enable_profiling = True; options.profile_file_prefix = sys.argv[2]; options.enable_cpu_mem_arena = False
encoder.session = ort.InferenceSession(str(encoder.directory / "model.onnx"), options, providers=["CPUExecutionProvider"])
t = time.perf_counter(); encoder.encode(texts); total = time.perf_counter() - t
trace = json.load(open(encoder.session.end_profiling()))
by_op = collections.Counter(); run = 0.0
for event in trace:
    if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
        by_op[event["args"]["op_name"]] += event["dur"] / 1e6
    elif event.get("cat") == "Session" and event["name"] == "model_run":
        run += event["dur"] / 1e6
print(json.dumps({"model": provider.model, "texts": len(texts), "tokens": tokens, "tokenize_s": tokenize,
                  "encode_s": total, "session_s": run, "by_op": by_op.most_common(8)}))
"""


def measure(texts_file: Path, env: dict, vectors: Path) -> dict:
    with tempfile.NamedTemporaryFile("r", suffix=".maxrss") as peak:
        done = subprocess.run([sys.executable, "-c", LAUNCHER, peak.name, sys.executable, "-c", CHILD,
                               str(texts_file), str(vectors)], capture_output=True, text=True, env=env, timeout=1800)
        if done.returncode:
            raise SystemExit(f"embed_bench: the embedding process failed:\n{done.stderr[-3000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        figures["peak_rss_mb"] = int(Path(peak.name).read_text()) / 1024
    figures["texts_per_s"] = figures["texts"] / figures["embed_s"]
    return figures


PATHS = {
    "torch": {"HARVESTER_LOCAL_RUNTIME": "torch", "HARVESTER_LOCAL_MODEL": "all-MiniLM-L6-v2"},
    "onnx": {"HARVESTER_LOCAL_RUNTIME": "onnx", "HARVESTER_LOCAL_MODEL": "all-MiniLM-L6-v2"},
    "e5": {"HARVESTER_LOCAL_RUNTIME": "onnx", "HARVESTER_LOCAL_MODEL": "multilingual-e5-small"},
}
EXPORT = """
import sys, time
t = time.perf_counter()
from harvester.embeddings.local import LocalProvider
provider = LocalProvider()
assert provider._encoder() is not None, "the model runs on PyTorch: see the warning above"
print(time.perf_counter() - t)
"""


def main() -> int:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated, of: " + ", ".join(PATHS))
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per path (the fastest counts)")
    parser.add_argument("--profile", action="store_true", help="where the ONNX paths' time goes")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        parser.error(f"unknown path(s) {', '.join(unknown)}; known: {', '.join(PATHS)}")
    texts = embedded_texts()
    chars = sum(len(t) for t in texts)
    print(f"{len(texts)} distinct texts of the demo's records ({chars / len(texts):.0f} characters on average); "
          f"{os.cpu_count()} CPUs")
    work = Path(tempfile.mkdtemp(prefix="embed-bench-"))
    texts_file = work / "texts.json"
    texts_file.write_text(json.dumps(texts))
    base = {**os.environ, "PYTHONPATH": str(ROOT / "plugins"), "HF_HUB_OFFLINE": "1",
            "HARVESTER_MODEL_CACHE": str(work / "models")}
    results, exports, profiles = {}, {}, {}
    try:
        for name in paths:
            env = {**base, **PATHS[name]}
            if env["HARVESTER_LOCAL_RUNTIME"] == "onnx":  # the export, once, in a fresh cache
                done = subprocess.run([sys.executable, "-c", EXPORT], capture_output=True, text=True, env=env,
                                      timeout=1800)
                if done.returncode:
                    raise SystemExit(f"embed_bench: the export of {name} failed:\n{done.stderr[-3000:]}")
                exports[name] = float(done.stdout.strip().splitlines()[-1])
            runs = [measure(texts_file, env, work / f"{name}-{i}.npy") for i in range(max(1, args.repeats))]
            best = max(runs, key=lambda r: r["texts_per_s"])
            results[name] = {**best, "runs": runs, "vectors": work / f"{name}-{runs.index(best)}.npy"}
            if args.profile and env["HARVESTER_LOCAL_RUNTIME"] == "onnx":
                done = subprocess.run([sys.executable, "-c", PROFILE, str(texts_file), str(work / name)],
                                      capture_output=True, text=True, env=env, timeout=1800)
                if done.returncode:
                    raise SystemExit(f"embed_bench: the profile of {name} failed:\n{done.stderr[-3000:]}")
                profiles[name] = json.loads(done.stdout.strip().splitlines()[-1])
        reference = np.load(results["torch"]["vectors"]) if "torch" in results else None
        for name, r in results.items():
            r["cosine"] = None
            if reference is not None and name != "torch" and r["model"] == results["torch"]["model"]:
                cos = (np.load(r["vectors"]) * reference).sum(1)
                r["cosine"] = (float(cos.min()), float(cos.mean()), int((cos < 0.99).sum()))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print("\n| path | model | runtime | export, once (s) | load (s) | texts/s | peak RSS (MB) | cosine to torch: min / mean (texts below 0.99) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        cosine = "" if r["cosine"] is None else f"{r['cosine'][0]:.4f} / {r['cosine'][1]:.4f} ({r['cosine'][2]})"
        export = f"{exports[name]:.1f}" if name in exports else ""
        runtime = r["runtime"] + (f" {r['precision']}, {r['threads']} threads" if r["runtime"] == "onnx" else "")
        print(f"| {name} | {r['model']} | {runtime} | {export} | {r['load_s']:.1f} | {r['texts_per_s']:,.1f} | "
              f"{r['peak_rss_mb']:,.0f} | {cosine} |")
    print(f"\ngoals (issue 27): at least {GOAL_TEXTS_PER_S:.0f} texts/s, peak RSS at most {GOAL_RSS_MB:.0f} MB, "
          f"load at most {GOAL_LOAD_S:.0f} s; vectors of the same model within cosine 0.99 of torch's")
    for name, p in profiles.items():
        print(f"\nprofile of {name} ({p['model']}): {p['texts']} texts, {p['tokens']:,} tokens after truncation; "
              f"tokenizing {p['tokenize_s']:.2f} s, encode {p['encode_s']:.2f} s of which ONNX Runtime "
              f"{p['session_s']:.2f} s ({p['tokens'] / p['session_s']:,.0f} tokens/s); by operator:")
        for op, seconds in p["by_op"]:
            print(f"  {op:28s} {seconds:6.2f} s  {seconds / p['session_s']:5.1%}")
    if args.json:
        print(json.dumps({k: {**v, "vectors": None} for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
