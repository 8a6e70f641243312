"""A CKAN package as we keep it: normalization, the embedded text recipe and the three hashes.

Pure functions over plain data: no database, HTTP or Airflow here.

- ``url_hash``: the normalized landing-page URL, "is this the same resource".
- ``content_hash``: exactly the text that is embedded (with the recipe's version tag). A dataset is
  re-embedded if and only if this changes.
- ``metadata_hash``: everything else we track (tags, organization, license, groups, resources,
  extras, custom fields, dates other than metadata_modified). Changing it needs no embedding.
"""
from __future__ import annotations

import functools
import hashlib
import html
import json
import re
import unicodedata
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from html.parser import HTMLParser
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit, urlunsplit

from harvester.domain.outcomes import ERROR, Problem, error_text, problem
from harvester.domain.quality import content_warnings
from harvester.domain.screening import (Unfit, escaped, fix_text, identifier_problem, published, screen,
                                        screen_problems, without_surrogates)

# Bump when the text recipe changes: every content_hash changes with it, so everything re-embeds.
TEXT_RECIPE = "harvester-text-v1"
# Deterministic cap on the embedded text, so the hash always describes exactly what is sent.
MAX_TEXT_CHARS = 8000
SLUG_CHARS = 100  # CKAN's limit on a name
_NOT_SLUG = re.compile(r"[^a-z0-9]+")

# Top-level CKAN fields that are not metadata we track: identity and content (hashed apart),
# server bookkeeping that changes without any edit, and counts derived from tracked lists.
_NOT_METADATA = frozenset({
    "id", "title", "notes", "metadata_modified", "revision_id", "revision_timestamp",
    "tracking_summary", "num_resources", "num_tags", "relationships_as_object",
    "relationships_as_subject", "isopen", "organization", "owner_org", "tags", "groups",
    "resources", "extras", "license_id", "license_title", "license_url", "creator_user_id",
})


@dataclass(frozen=True)
class DatasetRecord:
    """One fetched package, normalized. ``error`` is set when the record cannot be used."""

    source_id: str | None
    name: str | None = None
    url: str | None = None
    url_hash: str | None = None
    title: str = ""
    description: str = ""
    tags: list[str] = field(default_factory=list)
    organization: str | None = None
    metadata_modified: datetime | None = None
    content_hash: str | None = None
    metadata_hash: str | None = None
    raw: Any = None
    error: str | None = None
    # What the record fell short of (domain/outcomes.py): a Failed record's errors (``error`` is
    # their one-line summary) and a stored record's warnings. Not part of any hash.
    problems: tuple[Problem, ...] = ()
    # The language the record declares for its text (an ISO 639-1 code such as "fr", or a name
    # PostgreSQL's text search knows); None: the portal's ``language``. Not part of any hash.
    language: str | None = None
    # The portal says the record was deleted (an OAI-PMH header with status="deleted"): not a
    # dataset to store but the removal of the one held under ``source_id`` (``metadata_modified``:
    # when it was deleted), applied under the removal guard even by an incremental run. See
    # ``deletion``.
    deleted: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def reported(self) -> tuple[Problem, ...]:
        """Its problems as a report lists them: a Failed record that came without a coded problem
        (a kind of portal that only says why, in ``error``) has one, ``invalid-record``."""
        if self.error is not None and not any(p.severity == ERROR for p in self.problems):
            return (problem("invalid-record", self.error),) + self.problems
        return self.problems


def deletion(source_id: str, modified: datetime | None = None) -> DatasetRecord:
    """The portal's word that the record ``source_id`` was deleted (at ``modified``): the pipeline
    stages it apart (store/deletions.py) and the upsert removes the live dataset it names, if any."""
    return DatasetRecord(source_id=source_id, metadata_modified=modified, deleted=True)


def failed(source_id: str | None, raw: Any, problems: list[Problem] | tuple[Problem, ...],
           prefix: str = "") -> DatasetRecord:
    """A Failed record: ``problems`` (at least one error) and their summary as ``error``. What it
    holds is made storable (domain/screening.py): a ``raw`` too deep or too large is kept as its id
    alone, with that error added; an identifier that cannot be stored adds ``unstorable-identifier``
    (when not there already) and is kept escaped (``x\\ud800``: never altered into another
    dataset's identifier)."""
    label = source_id or "?"
    problems = tuple(problems)
    bad_identifier = identifier_problem(source_id)
    if bad_identifier is not None:
        if not any(p.code == bad_identifier.code for p in problems):
            problems = (bad_identifier,) + problems
        source_id = escaped(source_id)
    problems = screen_problems(problems)
    try:
        raw, found = screen(raw, label)
        problems += found.problems()
    except Unfit as exc:
        raw, problems = {"id": source_id}, problems + (exc.problem,)
    return DatasetRecord(source_id=source_id, raw=raw,
                         error=fix_text(prefix + (error_text(problems) or "invalid record")), problems=problems)


def screened_as_published(source_id_of: Callable[[Any], str | None], *, nulls: bool = True):
    """A source's ``normalize(raw, ...)`` (a portal's record as it published it, to a DatasetRecord)
    given the record screened before its mapping reads it (``screening.published``), whatever the
    kind of portal: the one place where a record is checked before a source's own code walks it.

    - more than MAX_DEPTH levels, or more than MAX_RECORD_BYTES of JSON: a Failed record
      (``record-too-deep``, ``record-too-large``) holding only its identifier, and the mapping
      never runs. A mapping writes nested values as texts (``json.dumps``, which raises
      RecursionError some hundreds of levels down, and hides any depth inside a string) and
      ``str()`` of a deep value recurses too; each level it did read, the package's screening
      could no longer see;
    - a NaN or ±Infinity: null, before the mapping, with its ``non-finite-number`` warning at
      its place in the record as published (``metas.default.records_count``), added to the
      record's problems. A mapping writes a number it puts in ``extras`` as a text, NaN as
      ``"NaN"``, which the package's screening cannot tell from a word. ``nulls`` False: the
      source nulls them itself (data.json: its checks and schema judge the entry as it came).

    ``source_id_of(raw)``: the record's identifier as the source reads it (None when it has none);
    it must read only the top of the record (it meets records of any depth)."""
    def decorate(normalize: Callable[..., DatasetRecord]) -> Callable[..., DatasetRecord]:
        @functools.wraps(normalize)
        def screened(raw: Any, *args, **kwargs) -> DatasetRecord:
            ident = source_id_of(raw)
            try:
                nulled, found = published(raw, ident or "?", nulls=nulls)
            except Unfit as exc:
                return failed(ident, {"id": ident}, [exc.problem])
            if nulled is raw:
                return normalize(raw, *args, **kwargs)
            record = normalize(nulled, *args, **kwargs)
            return replace(record, problems=record.problems + screen_problems(found.problems()))
        return screened
    return decorate


class _TextExtractor(HTMLParser):
    _BREAKS = {"br", "p", "div", "li", "ul", "ol", "tr", "h1", "h2", "h3", "h4", "h5", "h6"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in self._BREAKS:
            self.parts.append(" ")

    def handle_endtag(self, tag):
        if tag in self._BREAKS:
            self.parts.append(" ")

    def handle_data(self, data):
        self.parts.append(data)


_TAG = re.compile(r"<[a-zA-Z/!][^>]*>")


def clean_text(value: Any) -> str:
    """Plain text: HTML stripped, entities decoded, whitespace collapsed. None -> ''."""
    if value is None:
        return ""
    text = str(value)
    if _TAG.search(text):
        parser = _TextExtractor()
        parser.feed(text)
        parser.close()
        text = "".join(parser.parts)
    elif "&" in text:
        text = html.unescape(text)
    # Whitespace runs collapsed to one space, ends trimmed: str.split() splits on exactly the
    # characters the regular expression \s matches (both are str.isspace()), in a fraction of its time.
    return " ".join(text.split())


def text_list(value: Any) -> list[str]:
    """A portal's list of short texts (tags, keywords, categories, roles) as distinct stripped
    strings in their order: a lone string is a list of one; numbers are text; anything else
    (objects, booleans, nulls, blanks) is left out."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    out: dict[str, None] = {}
    for item in value:
        if isinstance(item, (str, int, float)) and not isinstance(item, bool) and str(item).strip():
            out[str(item).strip()] = None
    return list(out)


def embedding_text(title: str, description: str) -> str:
    """Exactly the text we embed for a dataset (already cleaned title and description)."""
    text = f"{title}\n\n{description}" if description else title
    return text[:MAX_TEXT_CHARS]


def sha256_hex(text: str) -> str:
    """The hash of a text as it is stored: a lone surrogate (which UTF-8 cannot encode) as U+FFFD,
    as domain/screening.py stores it."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        data = without_surrogates(text).encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def content_hash(text: str) -> str:
    return sha256_hex(f"{TEXT_RECIPE}\n{text}")


def normalize_url(url: str) -> str:
    """Lower-cased scheme and host, no trailing slash: the form we compare landing pages in."""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, parts.query, ""))


def landing_page(portal_url: str, name_or_id: str) -> str:
    return f"{portal_url.rstrip('/')}/dataset/{name_or_id}"


def parse_timestamp(value: Any) -> datetime | None:
    """A record's timestamp as an aware UTC datetime; None when missing or unparseable. The one
    parser of every source's dates: CKAN writes UTC without a zone (``2013-06-17T15:32:05.305546``),
    DKAN a space for the T (``2019-09-30 22:00:00``), DCAT a date alone (``2020-01-01``) or a zoned
    value (``...Z``, ``...+02:00``: converted to UTC). A datetime is taken as it is (naive: UTC).
    One whose UTC instant no calendar holds (year 1 or 9999 with an offset that crosses it) is
    unparseable too: it raised OverflowError, which no record's outcome caught."""
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str) and value.strip():
        try:
            parsed = datetime.fromisoformat(value.strip())  # (3.11: also a space for the T, and Z)
        except ValueError:
            return None
    else:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=timezone.utc)
    try:
        return parsed.astimezone(timezone.utc)
    except OverflowError:  # a zoned date whose UTC instant is past the calendar (9999-12-31T23:00-02:00)
        return None


def slug(text: str) -> str:
    """The CKAN-style name of an organization, the same whichever source names it: lower-case
    ASCII letters, digits and dashes (accents folded, every other run of characters one dash), at
    most 100 characters. A text with nothing that folds to an ASCII letter or digit ("東京都", "—")
    is named ``org-`` and 12 hex digits of its hash, its whitespace collapsed first, so that the
    padding of a value does not make another organization."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    name = _NOT_SLUG.sub("-", folded.lower()).strip("-")[:SLUG_CHARS].strip("-")
    return name or "org-" + sha256_hex(" ".join(text.split()))[:12]


def _is_mapping(value: Any) -> bool:
    """isinstance(value, Mapping), with the common case (a dict) decided without the ABC check."""
    return type(value) is dict or isinstance(value, Mapping)


def _names(items: Any, key: str = "name") -> list[str]:
    if not isinstance(items, list):
        return []
    out = []
    for item in items:
        if _is_mapping(item):
            value = item.get(key) or item.get("display_name") or item.get("title")
        else:
            value = item
        if value not in (None, ""):
            out.append(str(value))
    return sorted(set(out))


def _organization(pkg: Mapping) -> str | None:
    org = pkg.get("organization")
    if _is_mapping(org):
        return org.get("title") or org.get("name")
    if isinstance(org, str) and org:
        return org
    return None


def _resources(pkg: Mapping) -> list[dict]:
    resources = pkg.get("resources")
    if not isinstance(resources, list):
        return []
    tracked = [
        {"url": r.get("url") or "", "format": (r.get("format") or "").strip(), "name": r.get("name") or ""}
        for r in resources if _is_mapping(r)
    ]
    return sorted(tracked, key=lambda r: (r["url"], r["format"], r["name"]))


def _extras(pkg: Mapping) -> dict[str, Any]:
    extras = pkg.get("extras")
    if isinstance(extras, list):
        return {str(e.get("key")): e.get("value") for e in extras if _is_mapping(e) and "key" in e}
    if _is_mapping(extras):
        return dict(extras)
    return {}


def tracked_metadata(pkg: Mapping) -> dict[str, Any]:
    """The canonical form of everything we track besides the embedded text."""
    org = pkg.get("organization")
    custom = {k: v for k, v in pkg.items() if k not in _NOT_METADATA}
    return {
        "tags": _names(pkg.get("tags")),
        "organization": _organization(pkg),
        "organization_name": org.get("name") if _is_mapping(org) else None,
        "license": pkg.get("license_id") or pkg.get("license_title"),
        "groups": _names(pkg.get("groups")),
        "resources": _resources(pkg),
        "extras": _extras(pkg),
        "fields": custom,
    }


# json.dumps(..., sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str), built once.
_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def metadata_hash(pkg: Mapping, *, notes_text: str | None = None) -> str:
    """Everything tracked besides the embedded text, plus the part of a long description beyond
    the embedded text's cap: an edit there is still a change of the dataset (with no embedding).
    ``notes_text``: ``clean_text(pkg.get("notes"))`` when the caller has it already."""
    description = clean_text(pkg.get("notes")) if notes_text is None else notes_text
    tracked = {**tracked_metadata(pkg), "description_beyond_text_cap": description[MAX_TEXT_CHARS:]}
    return sha256_hex(_CANONICAL.encode(tracked))


def _package_id(pkg: Any) -> str | None:
    """A CKAN package's ``id`` as ``normalize`` takes it (None when it has none)."""
    source_id = pkg.get("id") if _is_mapping(pkg) else None
    return source_id.strip() if isinstance(source_id, str) and source_id.strip() else None


@screened_as_published(_package_id)
def normalize(pkg: Any, portal_url: str) -> DatasetRecord:
    """A fetched package as a DatasetRecord; unusable records come back with ``error`` saying why
    (a package too deep or too large, or holding NaN: ``screened_as_published``)."""
    if not _is_mapping(pkg):
        return failed(None, pkg, [problem("not-an-object", f"record is a {type(pkg).__name__}, not a JSON object")])
    source_id = pkg.get("id")
    if not isinstance(source_id, str) or not source_id.strip():
        label = pkg.get("name") or pkg.get("title") or "?"
        return failed(None, pkg, [problem("no-identifier", f"record {label!r} has no 'id'", "id", pkg.get("id"))])
    source_id = source_id.strip()
    name = pkg.get("name") if isinstance(pkg.get("name"), str) and pkg.get("name") else None
    problems = []
    if name is None and not clean_text(pkg.get("title")):
        problems.append(problem("no-title", f"record {source_id!r} has neither a name nor a title", "title",
                                pkg.get("title")))
    modified = pkg.get("metadata_modified")
    if modified not in (None, "") and parse_timestamp(modified) is None:
        problems.append(problem("bad-date", f"record {source_id!r}: metadata_modified {str(modified)[:60]!r} is not a "
                                            "date", "metadata_modified", modified))
    if problems:
        return failed(source_id, pkg, problems)
    title = clean_text(pkg.get("title")) or (name or source_id)
    description = clean_text(pkg.get("notes"))
    url = landing_page(portal_url, name or source_id)
    return package_record(pkg, source_id=source_id, name=name, url=url, title=title, description=description,
                          tags=_names(pkg.get("tags")), organization=_organization(pkg), notes_text=description,
                          url_is_landing_page=False, published_fit=True)


def package_record(pkg: Mapping, *, source_id: str, url: str, title: str, description: str, tags: list[str],
                   organization: str | None, name: str | None = None, url_hash: str | None = None,
                   notes_text: str | None = None, warnings: tuple[Problem, ...] = (),
                   url_is_landing_page: bool = True, published_fit: bool = False,
                   language: str | None = None) -> DatasetRecord:
    """The record of a CKAN-shaped package, whatever kind of portal it came from (sources/ map
    theirs to this shape), with the three hashes computed one way for all. ``title`` and
    ``description`` are already cleaned; ``url_hash`` defaults to the hash of the normalized url;
    ``notes_text``: ``clean_text(pkg.get("notes"))``, when the caller has it (see metadata_hash).
    The record carries the content-quality warnings of domain/quality.py and the source's own
    ``warnings`` (its validation's); ``url_is_landing_page``: False for a CKAN package, whose
    ``url`` is a free-text source field; ``published_fit``: ``pkg`` is the record as published,
    screened by ``screened_as_published`` and unchanged since (a CKAN package): its depth and
    numbers are not read again.

    First the package is made storable (domain/screening.py): non-finite numbers as null, lone
    surrogates as U+FFFD, U+0000 removed, each with its warning; a package too deep or too large,
    or whose ``source_id`` holds a lone surrogate or U+0000 (``unstorable-identifier``: an
    identifier is never altered), is a Failed record. The hashes are of what is stored."""
    bad_identifier = identifier_problem(source_id)
    if bad_identifier is not None:
        return failed(source_id, pkg, [bad_identifier])
    try:
        pkg, found = screen(pkg, source_id, published_fit=published_fit)
    except Unfit as exc:
        return failed(source_id, {"id": source_id}, [exc.problem])
    source_id, url = found.derived(source_id, "id"), found.derived(url, "url")
    title, description = found.derived(title, "title"), found.derived(description, "description")
    name = None if name is None else found.derived(name, "name")
    organization = None if organization is None else found.derived(organization, "organization")
    tags = [found.derived(t, "tags") for t in tags]
    if found.found:  # (the caller's notes_text is of the package as it came)
        notes_text = None
    modified = parse_timestamp(pkg.get("metadata_modified"))
    return DatasetRecord(
        source_id=source_id,
        name=name,
        url=url,
        url_hash=url_hash or sha256_hex(normalize_url(url)),
        title=title,
        description=description,
        tags=tags,
        organization=organization,
        metadata_modified=modified,
        content_hash=content_hash(embedding_text(title, description)),
        metadata_hash=metadata_hash(pkg, notes_text=notes_text),
        raw=pkg,
        problems=content_warnings(pkg, description=description, modified=modified,
                                  parse_date=parse_timestamp, landing_page=url_is_landing_page)
        + screen_problems(tuple(warnings)) + found.problems(),
        language=language,
    )
