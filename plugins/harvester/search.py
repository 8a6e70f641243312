"""Semantic search over the datasets' vectors: `harvester search` and the Harvester page's search API.

The query is embedded with the active provider's model, unless that model does not cover the
datasets yet (a model switch in progress) and an earlier model covers more: then with that one,
so search keeps working while the new model fills in.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchResult:
    model: str
    # (score, portal_url, title, url, source_id), best first
    rows: list[tuple]
    # why another model than the active one was used; None when the active one was
    note: str | None = None


def choose_provider(conn, portal_url: str | None, provider):
    """The provider to embed the query with, and a note when it is not ``provider``."""
    from .embeddings import provider_for_model
    from .store import vectors

    cover = vectors.coverage(conn, portal_url)
    active = cover.get(provider.model, (0, 0))
    best = max(cover.items(), key=lambda item: item[1][0], default=None)
    if best and best[0] != provider.model and active[0] < active[1] and best[1][0] > active[0]:
        note = (f"{provider.model} covers {active[0]} of {active[1]} datasets so far; searching with "
                f"{best[0]} ({best[1][0]} of {best[1][1]})")
        return provider_for_model(best[0]), note
    return provider, None


def search(conn, query: str, *, portal_url: str | None = None, limit: int = 10, provider=None) -> SearchResult:
    """Live datasets nearest to ``query``. Raises EmbeddingError when the provider fails
    (TerminalEmbeddingError when the stored vectors do not fit the model)."""
    from .embeddings import TerminalEmbeddingError, get_provider
    from .store import vectors

    chosen, note = choose_provider(conn, portal_url, provider or get_provider())
    query_vector = chosen.embed_query(query)
    try:
        vectors.check_dimension(conn, chosen.model, chosen.dimension)
    except vectors.DimensionMismatch as exc:
        raise TerminalEmbeddingError(str(exc)) from None
    rows = vectors.search(conn, chosen.model, chosen.dimension, query_vector, portal_url=portal_url, limit=limit)
    return SearchResult(model=chosen.model, rows=rows, note=note)
