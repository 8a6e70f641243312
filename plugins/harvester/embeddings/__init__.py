"""Embedding providers, chosen by HARVESTER_EMBEDDING_PROVIDER (default: local)."""
from __future__ import annotations

import os

from .base import EmbeddingError, EmbeddingProvider, RateLimited, TerminalEmbeddingError

PROVIDERS = ("local", "gemini", "ollama")
ENV = "HARVESTER_EMBEDDING_PROVIDER"


def get_provider(name: str | None = None) -> EmbeddingProvider:
    name = (name or os.environ.get(ENV) or "local").strip().lower()
    if name == "local":
        from .local import LocalProvider

        return LocalProvider()
    if name == "gemini":
        from .gemini import GeminiProvider

        return GeminiProvider()
    if name == "ollama":
        from .ollama import OllamaProvider

        return OllamaProvider()
    raise TerminalEmbeddingError(f"{ENV}={name!r} is not a known provider; valid providers are: {', '.join(PROVIDERS)}")


def provider_for_model(model: str) -> EmbeddingProvider:
    """The provider that made vectors stored under ``model`` (to embed a query in the same space)."""
    from .local import MODEL_NAME

    if model == MODEL_NAME:
        from .local import LocalProvider

        return LocalProvider()
    if model.startswith("ollama/"):
        from .ollama import OllamaProvider

        return OllamaProvider(model=model[len("ollama/"):])
    name, _, dimension = model.rpartition("@")
    if name.startswith("gemini") and dimension.isdigit():
        from .gemini import GeminiProvider

        return GeminiProvider(model=name, dimension=int(dimension))
    raise TerminalEmbeddingError(f"no provider is known for vectors of model {model!r}")


__all__ = ["provider_for_model", "EmbeddingError", "EmbeddingProvider", "RateLimited", "TerminalEmbeddingError", "get_provider",
           "PROVIDERS"]
