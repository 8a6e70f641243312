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


__all__ = ["EmbeddingError", "EmbeddingProvider", "RateLimited", "TerminalEmbeddingError", "get_provider",
           "PROVIDERS"]
