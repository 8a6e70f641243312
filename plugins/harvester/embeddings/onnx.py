"""Local models through ONNX Runtime: the export cache, and the encoder that runs an export.

The local provider (embeddings/local.py) runs its model here unless HARVESTER_LOCAL_RUNTIME=torch.
The first use of a model on a machine exports it (embeddings/onnx_export.py, in a child process with
a time limit: PyTorch is loaded there, never in the task) into

    $HARVESTER_MODEL_CACHE/<model>/<key>/   (default: $HARVESTER_HOME/models, see store/embedded)

where ``key`` is a hash of what the export depends on: the export format, the kind of model, the
SHA-256 of every file of the model that the export reads, and the onnxruntime version. A changed
model, a new onnxruntime or a new export recipe therefore lands in a new directory. Earlier ones
are left in place (workers sharing a cache during a rolling upgrade each keep theirs; an export
is 70 MB for MiniLM, 140 MB for multilingual-e5-small). Every load checks the directory's
manifest: the SHA-256 of model.onnx and tokenizer.json must be those the export wrote. A directory
that fails the check (a partial copy, a truncated file, a file edited by hand), or whose model
ONNX Runtime refuses, is never used: it is removed with a warning that says why, and exported again.
Two processes needing the same export at once take turns on a file lock (bounded by the export's
time limit); the second finds the first one's export.

Threads: HARVESTER_LOCAL_THREADS texts run at once, each on one thread (OnnxEncoder says why), by
default as many as the CPUs this process may run on: its CPU affinity, lowered to the CPU quota of
its cgroup (a Kubernetes CPU limit, a Celery worker's container), so a pod limited to 2 CPUs on a
64-core node runs 2 threads, not 64.

Texts are tokenized together (truncated at the model's token limit), run one per call (no padding;
OnnxEncoder.encode says why), mean- (or CLS-) pooled and L2-normalized as sentence-transformers does:
the vectors are equivalent to the PyTorch path's (tests/embeddings/test_onnx_runtime.py compares them
on the demo's records).
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from harvester.config.settings import env_value
log = logging.getLogger(__name__)

FORMAT = 3  # of an export directory (embeddings/onnx_export.py); a change re-exports every cached model
FILES = ("model.onnx", "tokenizer.json")  # what an export's manifest vouches for

_LOCK_POLL = 0.5


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class ExportFailed(RuntimeError):
    """The model could not be exported for ONNX Runtime (the message says why)."""


# -- threads -------------------------------------------------------------------------------------
def cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPUs the cgroup's quota allows (cgroup v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us``),
    None when it sets none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def cpu_budget() -> int:
    """The threads worth running: HARVESTER_LOCAL_THREADS, else the CPUs of this process's affinity,
    at most its cgroup's quota (rounded up)."""
    configured = env_value("HARVESTER_LOCAL_THREADS")
    if configured:
        return configured
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = cpu_quota()
    if quota:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


# -- the cache -----------------------------------------------------------------------------------
def cache_root() -> Path:
    configured = env_value("HARVESTER_MODEL_CACHE")
    if configured:
        return configured.resolve()
    from harvester.store.embedded.server import default_home

    return default_home() / "models"


def _slug(identity: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", identity).strip("-") or "model"


def source_files(kind: str, path: str) -> list[Path]:
    """The files of the model that an export reads (their hashes are part of the cache key)."""
    source = Path(path)
    if source.is_file():
        return [source]
    files = [f for f in sorted(source.iterdir()) if f.is_file() and not f.name.startswith(".")
             and f.suffix.lower() != ".md"]
    modules = source / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text(encoding="utf-8")):
            sub = source / module.get("path", "")
            if module.get("path") and sub.is_dir():
                files += sorted(f for f in sub.rglob("*") if f.is_file() and not f.name.startswith("."))
    return files


def cache_key(kind: str, path: str) -> str:
    import onnxruntime

    source = Path(path)
    digests = {str(f.relative_to(source) if f != source else f.name): sha256(f) for f in source_files(kind, path)}
    described = json.dumps({"format": FORMAT, "kind": kind, "files": digests,
                            "onnxruntime": onnxruntime.__version__}, sort_keys=True)
    return hashlib.sha256(described.encode()).hexdigest()[:20]


def check(directory: Path) -> tuple[dict | None, str]:
    """The export's manifest when the directory holds a whole, unaltered export, else (None, why)."""
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        return None, "it has no manifest.json (an export that did not finish)"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        expected = manifest["sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"its manifest.json is unreadable ({type(exc).__name__})"
    if manifest.get("format") != FORMAT:
        return None, f"it is of export format {manifest.get('format')!r}, not {FORMAT}"
    for name in FILES:
        file = directory / name
        if not file.is_file():
            return None, f"{name} is missing"
        if sha256(file) != expected.get(name):
            return None, f"{name} is not the file the export wrote (its SHA-256 differs from the manifest's)"
    return manifest, ""


class _FileLock:
    """An exclusive flock on ``path``, waited for at most ``timeout`` seconds."""

    def __init__(self, path: Path, timeout: float, what: str):
        self.path, self.timeout, self.what = path, timeout, what
        self.fh = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "a+")
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() > deadline:
                self.fh.close()
                raise ExportFailed(f"waited {self.timeout:.0f} s for another process's export of {self.what} "
                                   f"(lock {self.path}); HARVESTER_LOCAL_EXPORT_TIMEOUT_SECS bounds it")
            time.sleep(_LOCK_POLL)

    def __exit__(self, *exc):
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def _run_export(kind: str, path: str, target: Path, identity: str, timeout: float) -> dict:
    work = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    package_parent = str(Path(__file__).resolve().parents[2])  # the directory holding harvester/
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")  # the model is on disk: never a hub (see embeddings/local.py)
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    started = time.perf_counter()
    returncode, tail = _export_child(kind, path, work, identity, env, timeout)
    if returncode is None:
        shutil.rmtree(work, ignore_errors=True)
        raise ExportFailed(f"exporting {identity} for ONNX Runtime took more than {timeout:.0f} s "
                           "(HARVESTER_LOCAL_EXPORT_TIMEOUT_SECS)") from None
    if returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        tail = " | ".join(tail[-3:])
        raise ExportFailed(f"exporting {identity} for ONNX Runtime failed (exit status {returncode}): "
                           f"{tail[-600:]}")
    manifest, why = check(work)
    if manifest is None:
        shutil.rmtree(work, ignore_errors=True)
        raise ExportFailed(f"the export of {identity} did not check out: {why}")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(work, target)
    log.info("exported local model %s for ONNX Runtime in %.1f s (%s, vectors within cosine %.4f of PyTorch's "
             "on the probe texts) into %s", identity, time.perf_counter() - started, manifest["precision"],
             manifest["probe_min_cosine"], target)
    return manifest


def _export_child(kind: str, path: str, work: Path, identity: str, env: dict,
                  timeout: float) -> tuple[int | None, list[str]]:
    """Run the export (onnx_export.py) in a child process, logging each of its steps as it starts,
    with the time spent and an ETA (its progress lines on stderr); kill it after ``timeout``
    seconds. Returns its exit status (None: killed at the time limit) and the last lines of its
    stderr that are not progress lines (the error of a failed export)."""
    import collections

    from harvester.domain import tasklog

    proc = subprocess.Popen([sys.executable, "-m", "harvester.embeddings.onnx_export", kind, path, str(work)],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, errors="replace")
    tail: collections.deque = collections.deque(maxlen=20)
    what = f"exporting {identity} for ONNX Runtime"
    log.info("%s: its first use on this machine; a child process loads PyTorch (10 to 30 s, at most %.0f s)",
             what, timeout)

    def read_stderr():
        for line in proc.stderr:
            if line.startswith(_PROGRESS_PREFIX):
                try:
                    step = json.loads(line[len(_PROGRESS_PREFIX):])
                    log.info("%s", tasklog.step_line(what, int(step["step"]), int(step["of"]), str(step["what"]),
                                                     float(step["elapsed"]), float(step["share"])))
                    continue
                except (ValueError, KeyError, TypeError):
                    pass
            if line.strip():
                tail.append(line.rstrip("\n"))

    reader = threading.Thread(target=read_stderr, name="harvester-export-progress", daemon=True)
    reader.start()
    try:
        returncode = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        returncode = None
    reader.join(timeout=10)  # its pipe closed with the process
    return returncode, list(tail)


_PROGRESS_PREFIX = "harvester-export-progress "  # onnx_export.PROGRESS_PREFIX (that module imports PyTorch's helpers)


def prepare(kind: str, path: str, identity: str) -> tuple[Path, dict]:
    """The checked export of the model (exported first when the cache holds none, or a bad one)."""
    timeout = env_value("HARVESTER_LOCAL_EXPORT_TIMEOUT_SECS")
    target = cache_root() / _slug(identity) / cache_key(kind, path)
    manifest, why = check(target)
    if manifest is not None:
        return target, manifest
    with _FileLock(target.parent / ".lock", timeout, identity):
        manifest, why = check(target)  # another process may have exported it meanwhile
        if manifest is not None:
            return target, manifest
        if target.exists():
            log.warning("the cached ONNX export of local model %s at %s is not used: %s; exporting it again",
                        identity, target, why)
        return target, _run_export(kind, path, target, identity, timeout)


def discard(directory: Path, identity: str, why: str) -> None:
    """Remove an export that failed to load, with a warning (the next prepare() exports it again)."""
    log.warning("the cached ONNX export of local model %s at %s is not used: %s; exporting it again",
                identity, directory, why)
    with _FileLock(directory.parent / ".lock", env_value("HARVESTER_LOCAL_EXPORT_TIMEOUT_SECS"), identity):
        shutil.rmtree(directory, ignore_errors=True)


# -- running an export ---------------------------------------------------------------------------
class OnnxEncoder:
    """A checked export, loaded: ``encode(texts, query=False)`` gives L2-normalized float32 vectors.

    ``max_tokens``: read at most that many tokens of a text (at most the export's own limit): a
    model version of its own (embeddings/local.py: all-MiniLM-L6-v2 read up to 128 tokens, its
    training length), from the same export.

    ``threads`` texts run at once, each on one thread (a session's intra-op pool of one): the
    operators of one text of a few hundred tokens are too small to split between cores without
    waiting at every one of its ~90 steps (and, on a busy machine, spinning threads waiting for
    each other): two texts side by side, each alone, do the same work with no waiting. A text's
    vector is the same either way (one text per call, one thread per call)."""

    def __init__(self, directory: Path, manifest: dict, threads: int | None = None, model: Path | None = None,
                 max_tokens: int | None = None):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.directory, self.manifest = directory, manifest
        self.dimension = int(manifest["dimension"])
        self.inputs = list(manifest["inputs"])
        self.max_tokens = min(int(manifest["max_tokens"]), int(max_tokens or manifest["max_tokens"]))
        self.threads = threads or cpu_budget()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        # Variable shapes: an arena would keep the largest batch's buffers for the process's life.
        options.enable_cpu_mem_arena = False
        # ``model``: another file than the export's model.onnx (the export checking its candidates)
        self.session = ort.InferenceSession(str(model or directory / "model.onnx"), options,
                                            providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_tokens)
        self._lock = threading.Lock()
        self._pool = None  # the threads that run texts side by side, started on the first batch

    def encode(self, texts: Sequence[str], query: bool = False):
        """One text per ONNX Runtime call: no padding, and a text's vector never depends on the texts
        it came with (each call quantizes its activations with one scale: batched, the demo's lowest
        cosine to PyTorch moved between 0.988 and 0.992 with the batches' make-up; alone it is 0.993,
        at the same speed for texts of a few hundred tokens, whose matrices already fill the CPU's
        vector units). ``threads`` calls run at once (the class's docstring says why)."""
        import numpy as np

        prefix = self.manifest["query_prefix" if query else "document_prefix"]
        texts = [prefix + text for text in texts] if prefix else list(texts)
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return out
        encodings = self.tokenizer.encode_batch(texts)
        with self._lock:  # one session per process, already using every thread it may
            if self.threads == 1 or len(encodings) == 1:
                for row, encoding in enumerate(encodings):
                    out[row] = self._run(encoding)
                return out
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="harvester-onnx")
            # longest first: the last text to start is a short one, so no thread idles long at the end
            order = sorted(range(len(encodings)), key=lambda i: -len(encodings[i].ids))
            for row, vector in zip(order, self._pool.map(self._run, [encodings[i] for i in order])):
                out[row] = vector
        return out

    def _run(self, encoding):
        import numpy as np

        ids = np.asarray([encoding.ids], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                "token_type_ids": np.asarray([encoding.type_ids], dtype=np.int64)}
        hidden = self.session.run(None, {name: feed[name] for name in self.inputs})[0][0]
        vector = hidden[0] if self.manifest["pooling"] == "cls" else hidden.mean(0)
        if self.manifest["normalize"]:
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
        return vector


def load(kind: str, path: str, identity: str, max_tokens: int | None = None) -> OnnxEncoder:
    """The model's encoder: its export checked (or made), then loaded; an export that ONNX Runtime
    refuses is discarded and made again, once. ``identity``: the model's own (the export's
    directory), whatever ``max_tokens`` the encoder reads."""
    directory, manifest = prepare(kind, path, identity)
    try:
        return OnnxEncoder(directory, manifest, max_tokens=max_tokens)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        discard(directory, identity, f"ONNX Runtime could not load it ({type(exc).__name__}: {str(exc)[:200]})")
    directory, manifest = prepare(kind, path, identity)
    return OnnxEncoder(directory, manifest, max_tokens=max_tokens)
