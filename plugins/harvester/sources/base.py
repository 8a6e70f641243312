"""What the pipeline asks of a source of datasets, whatever kind of portal it is.

A source turns a portal's records into ``dataset.DatasetRecord`` pages. The pipeline (staging,
hashes, history, embeddings, search) never sees the portal's own format: a DCAT dataset is a
dataset. What a kind of portal can do differs, and the source says so in its ``Capabilities``:

- ``incremental``: the portal filters by modification time itself (CKAN's ``fq``); without it
  every run lists the whole catalogue, which is then complete, so removals are found every run;
- ``conditional``: an unchanged catalogue answers ``304 Not Modified`` to the validators
  (ETag / Last-Modified) of the last committed run: one request, nothing to process;
- ``reconcile``: the portal lists identifiers cheaply and fetches chosen records (a cheap
  comparison of the whole portal between full listings): the source then implements ``list_ids``,
  ``fetch_by_ids`` and ``count``, and the pipeline reconciles through them alone, whatever the kind.

Failures are ``SourceError`` (terminal: a bad answer, a refused request) or ``SourceUnavailable``
(transient: what outlived the retries of harvester.http). One more is the pipeline's to handle:
``FilterRejected``, the portal refusing (or ignoring) the modified-since filter of an incremental
listing, after which the run falls back to a full listing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterator, Protocol

from harvester.domain.dataset import DatasetRecord
from harvester.domain.outcomes import Problem, problem


class SourceError(Exception):
    """Listing a portal failed. ``transient``: trying again later may help."""

    transient = False


class SourceUnavailable(SourceError):
    """Transient failures (5xx, 429, timeouts, connection errors) that outlived the retries."""

    transient = True


class FilterRejected(SourceError):
    """The portal refused (or ignored) the modified-since filter of a listing: terminal for that
    listing; the pipeline falls back to a full one (and no other error may make it do so)."""


class BadRecord(ValueError):
    """A record a source's mapping cannot use, with the coded problem saying why (domain/outcomes.py)."""

    def __init__(self, code: str, message: str, field: str | None = None, value=None):
        super().__init__(message)
        self.problem = problem(code, message, field, value)


def coded(exc: ValueError) -> list[Problem]:
    """The problems of a refused record: a BadRecord's own, or (any other ValueError a mapping
    raised) ``invalid-record`` with its message."""
    return [exc.problem if isinstance(exc, BadRecord) else problem("invalid-record", str(exc))]


def to_ms(dt: datetime) -> datetime:
    """Truncated to the millisecond, in UTC (naive means UTC): the precision at which a listing's
    timestamps are compared (Solr indexes dates in milliseconds; a full record has microseconds)."""
    dt = dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
    return dt.replace(microsecond=dt.microsecond // 1000 * 1000)


class CountsTraffic:
    """A source reading through one fetcher (``self.fetcher``, an ``http.HttpFetcher``): the
    requests it made and the bytes it received, as the Source protocol reports them."""

    fetcher: object

    @property
    def requests_made(self) -> int:
        return getattr(self.fetcher, "requests_made", 0)

    @property
    def bytes_received(self) -> int:
        return getattr(self.fetcher, "bytes_received", 0)


@dataclass(frozen=True)
class CountKind:
    """How far a kind's own count of its datasets (``Source.count``, a listing's ``total``) can be
    trusted: ``exact``; ``capped`` at ``cap`` (a count of ``cap`` or more means "at least ``cap``":
    Socrata's ``resultSetSize`` stops at 10,000); ``absent`` (the kind gives none). A count that is
    not exact never proves a listing complete and never, alone, says a dataset is gone."""

    kind: str = "absent"
    cap: int | None = None

    def __post_init__(self):
        if self.kind not in ("exact", "capped", "absent"):
            raise ValueError(f"count kind {self.kind!r} is not one of: exact, capped, absent")
        if (self.kind == "capped") != (self.cap is not None and self.cap > 0):
            raise ValueError(f"a {self.kind} count needs {'a positive cap' if self.kind == 'capped' else 'no cap'}, "
                             f"not cap={self.cap!r}")

    def is_exact(self, count: int | None) -> bool:
        """Whether ``count`` is the portal's exact number (a capped count only below its cap)."""
        if count is None or self.kind == "absent":
            return False
        return self.kind == "exact" or count < self.cap

    def describe(self) -> str:
        return f"capped at {self.cap}" if self.kind == "capped" else self.kind


EXACT_COUNT = CountKind("exact")
NO_COUNT = CountKind("absent")


def capped_count(cap: int) -> CountKind:
    return CountKind("capped", cap)


@dataclass(frozen=True)
class Capabilities:
    """``count``: how far the kind's count can be trusted (``CountKind``); the reconciliation's
    count check judges drift only from an exact count (domain/run.py ``count_drift``).
    ``resumable``: a retried fetch_modified of the same run keeps what the failed attempt staged
    and the source skips those records (``Listing.already_staged``) instead of fetching them
    again: for kinds fetched one record a request (a WAF of 30,000 files)."""

    incremental: bool = False
    conditional: bool = False
    reconcile: bool = False
    count: CountKind = NO_COUNT
    resumable: bool = False


@dataclass
class Listing:
    """What one listing found out besides its records. ``complete``: the records were the whole
    portal (removals may be applied); ``not_modified``: the portal answered that nothing changed
    since ``validators`` (no records); ``validators``: what to send next time, kept only when the
    run commits; ``reached_since``: a source without a modified filter stopped, by design, at the
    first record not modified since the run's ``since`` (its listing newest first): not complete,
    but not cut short either. ``already_staged``: (a resumable source's retried attempt) the
    source ids an earlier attempt of this listing staged; the source lists them as it would but
    does not fetch or yield them again (they count as listed for ``complete``)."""

    complete: bool = False
    not_modified: bool = False
    validators: dict = field(default_factory=dict)
    reached_since: bool = False
    already_staged: frozenset = frozenset()


@dataclass
class IdPage:
    """One page of an identifier listing (``Source.list_ids``).

    ``ids``: (source_id, modified) of every usable entry of the page, ``modified`` truncated with
    ``to_ms`` (None when the portal gives none); the same id and time the source's DatasetRecords
    carry (``source_id``, ``metadata_modified``), since they are compared with what we hold.
    ``unusable``: entries listed without a usable identifier (they cannot be harvested).
    ``records``: whole records the portal sent instead of the narrow answer (it ignored the
    narrowing named in ``ignored``, e.g. ``fl=id,metadata_modified``); their ids are in ``ids``
    too, and the pipeline stages them as fetched rather than fetch them again."""

    ids: list[tuple[str, datetime | None]]
    unusable: int = 0
    records: list[DatasetRecord] = field(default_factory=list)
    ignored: str = ""


class Source(Protocol):
    kind: str
    capabilities: Capabilities
    requests_made: int
    bytes_received: int
    total: int | None

    def iter_records(self, since: datetime | None, page_size: int, listing: Listing,
                     validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """Pages of records modified since ``since`` (all of them when None, or when the portal
        cannot filter), filling ``listing`` as it goes."""
        ...

    # Reconciliation: required only of a source whose capabilities say ``reconcile`` (the pipeline
    # calls these only then). A kind that lists its whole catalogue every run needs none of them.
    def list_ids(self, page_size: int) -> Iterator[IdPage]:
        """Every identifier the portal lists with its modification time, ``page_size`` a request
        (the whole portal; ``total`` may be set from the first answer, for progress). The
        reconciliation removes every live dataset this listing lacks, so a listing that did not
        reach the API's own end signal (an empty page, no next page, an exact count reached; never
        a short page or a capped count) must raise ``SourceError`` after its last page rather
        than end quietly."""
        ...

    def fetch_by_ids(self, ids: list[str], per_request: int = 100) -> Iterator[list[DatasetRecord]]:
        """The records of ``ids`` in full, normalized, a page per request of at most
        ``per_request`` ids. Ids the portal no longer shows (deleted or hidden since they were
        listed) are left out, not an error."""
        ...

    def count(self) -> int | None:
        """How many datasets the portal lists, asked cheaply (CKAN: one ``rows=0`` search); None
        when the portal cannot say (then only a reconciliation that is due or asked for runs)."""
        ...
