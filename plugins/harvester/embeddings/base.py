"""The embedding provider interface: what the pipeline needs from any model, local or remote."""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable


class EmbeddingError(RuntimeError):
    """A provider failed. ``transient`` says whether trying again later may succeed."""

    transient = True


class TerminalEmbeddingError(EmbeddingError):
    """Retrying cannot help (bad key, bad configuration): fail the task with this message."""

    transient = False


class RateLimited(EmbeddingError):
    """The provider asked us to slow down (HTTP 429). ``retry_after``: its suggested wait in
    seconds, when it gave one (a Retry-After header or Google's RetryInfo)."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after

    def __reduce__(self):  # keep retry_after through pickling (e.g. between processes)
        return type(self), (str(self), self.retry_after)


class UnusableAnswer(EmbeddingError):
    """The provider answered, about the texts sent, with nothing that can be stored: not an outage
    (trying the same batch again gets the same answer) but unusable vectors it could not even
    send, such as Ollama's HTTP 500 "json: unsupported value: NaN" (a vector of the batch held a
    NaN, which its JSON encoder refuses: no vector of the batch comes back). ``reason``: a reason
    code of store/vectors.py's UNUSABLE; ``detail``: what was answered, as "<provider> model <model>
    answered <detail> for this text" reads. The embed step takes it as it takes a batch of unusable
    vectors: the breaker records a success and each text of the batch is refused (sent again later,
    alone, so the text at fault is found and the others get their vectors)."""

    def __init__(self, message: str, reason: str = "not-finite", detail: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.detail = detail or message

    def __reduce__(self):
        return type(self), (str(self), self.reason, self.detail)


@runtime_checkable
class EmbeddingProvider(Protocol):
    name: str          # provider name, as in HARVESTER_EMBEDDING_PROVIDER
    model: str         # the model's identity in the embeddings table (text + model -> one vector)
    dimension: int
    max_batch: int     # texts per request
    # Optional: ``dimension_needs_call`` (bool), true while reading ``dimension`` would call the
    # provider (Ollama's probe), so the caller makes that read through its circuit breaker.
    # Optional: ``max_concurrency`` (int), the most ``embed_documents`` calls worth having in flight
    # at once (HARVESTER_EMBED_CONCURRENCY is lowered to it). ``embed_documents`` may be called
    # from several threads at once.

    def embed_documents(self, texts: Sequence[str]) -> list[Sequence[float]]:
        """One L2-normalized vector per text, in order: a single request of at most max_batch texts.
        A remote provider returns what it answered, as it came (another count of vectors, a vector
        of another size, empty, NaN): the embed step screens each and refuses the texts of the bad
        ones (embeddings/batching.py), so one bad text never fails a batch."""
        ...

    def embed_query(self, text: str) -> Sequence[float]:
        ...
