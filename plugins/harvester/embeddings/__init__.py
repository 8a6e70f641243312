"""Embedding providers, chosen by HARVESTER_EMBEDDING_PROVIDER (default: local)."""
from __future__ import annotations

from harvester.config.settings import SettingError, env_value, setting
from harvester.embeddings.base import EmbeddingError, EmbeddingProvider, RateLimited, TerminalEmbeddingError

ENV = "HARVESTER_EMBEDDING_PROVIDER"
PROVIDERS = setting(ENV).choices  # local, gemini, ollama


def get_provider(name: str | None = None) -> EmbeddingProvider:
    if not name:
        try:
            name = env_value(ENV)  # one of PROVIDERS, lowercased; "local" when unset
        except SettingError as exc:
            raise TerminalEmbeddingError(str(exc)) from None
    name = name.strip().lower()
    if name == "local":
        from harvester.embeddings.local import LocalProvider

        return LocalProvider()
    if name == "gemini":
        from harvester.embeddings.gemini import GeminiProvider

        return GeminiProvider()
    if name == "ollama":
        from harvester.embeddings.ollama import OllamaProvider

        return OllamaProvider()
    raise TerminalEmbeddingError(f"{ENV}={name!r} is not a known provider; valid providers are: {', '.join(PROVIDERS)}")


def provider_for_model(model: str) -> EmbeddingProvider:
    """The provider that made vectors stored under ``model`` (to embed a query in the same space)."""
    if model.startswith("ollama/"):
        from harvester.embeddings.ollama import OllamaProvider

        return OllamaProvider(model=model[len("ollama/"):])
    name, _, dimension = model.rpartition("@")
    if name.startswith("gemini") and dimension.isdigit():
        from harvester.embeddings.gemini import GeminiProvider

        return GeminiProvider(model=name, dimension=int(dimension))
    return _local_provider_for(model)


def _local_provider_for(model: str) -> EmbeddingProvider:
    """A local model: the configured one (HARVESTER_LOCAL_MODEL) if it is that model, the bundled
    all-MiniLM-L6-v2 (reading 128 or 256 tokens), multilingual-e5-small, or a model name in the
    Hugging Face cache."""
    from harvester.embeddings import local

    try:
        configured = local.LocalProvider()
    except TerminalEmbeddingError:  # no local model configured or installed
        configured = None
    if configured is not None and configured.model == model:
        return configured
    if model == local.MODEL_NAME:  # the bundled all-MiniLM-L6-v2 reading 128 tokens (the default)
        return local.LocalProvider(local.DEFAULT_CHOICE)
    if model == local.FULL_NAME:  # the same model reading 256 (the default before issue 40)
        return local.LocalProvider(local.FULL_CHOICE)
    if model == local.E5_NAME:  # multilingual-e5-small, wherever HARVESTER_LOCAL_MODEL points
        return local.LocalProvider(local.E5_CHOICE)
    if model.startswith(local.LOCAL_PREFIX):
        loads = f"loads {configured.model!r}" if configured is not None else "is not set"
        raise TerminalEmbeddingError(
            f"vectors of model {model!r} were made by a local model directory named "
            f"{model[len(local.LOCAL_PREFIX):]!r}, but {local.ENV} {loads}: set {local.ENV} to that directory "
            "to embed queries in the same space")
    owner, slash, repo = model.partition("/")
    if slash and owner and repo and not any(c.isspace() for c in model):
        return local.LocalProvider(model)  # a model name: loaded from the Hugging Face cache
    raise TerminalEmbeddingError(f"no provider is known for vectors of model {model!r}")


__all__ = ["provider_for_model", "EmbeddingError", "EmbeddingProvider", "RateLimited", "TerminalEmbeddingError", "get_provider",
           "PROVIDERS"]
