"""DCAT ``data.json`` catalogues (DCAT-US 1.1 and 3.0, DCAT-AR) as a source: ``type: dcat-json``.

A catalogue is one JSON document, often hundreds of MB. It is read as a stream (``ijson``): one
dataset entry is in memory at a time, never the document. Each entry becomes a CKAN-shaped package
(``to_package``), because everything downstream (hashes, history, search keys) reads CKAN's shape,
and then a ``DatasetRecord`` (``normalize``). Whatever the package's own fields do not hold goes to
its ``extras``, so that the metadata hash sees an edit anywhere in an entry except its ``modified``
date (which is ``metadata_modified``) and the order of its keywords and themes.

What Python's json reads but the stream's parser refuses or alters, a bare ``NaN``, ``Infinity``
or ``-Infinity`` (``"size": NaN``, as ``json.dumps`` writes it) and a lone surrogate escape
(``"\\ud800"``), goes through as a stand-in (sources/json_stream.py): the entry holds what
``json.loads`` would give, and only its own record bears it (domain/screening.py): such a number
is stored as null and such a text with U+FFFD, each with a warning, and an identifier holding a
lone surrogate fails its record. Before, one such token failed the whole document (and a lone high
half was read as ``?``).

Nesting of any depth is one entry's outcome too. The stream is read from the parser's basic
events (``ijson.parse`` gives each event its path as a new string, which grows with the depth: a
document 100,000 levels deep, 600 KB, took gigabytes), and an entry is built down to one level
past the cap of domain/screening.py (``json_stream.build``), what is deeper read through and left
out: the entry is screened as published before ``to_package`` maps it
(``screened_as_published``), and one more than 64 levels deep is its own ``record-too-deep``,
named where it passes the cap. Before, an entry of 65 to about 1,000 levels was stored (the
mapping wrote its deep value into ``extras`` as a text) and a deeper one failed the document
(RecursionError). Datasets are looked for in the document's first MAX_OUTER_LEVELS levels.

Where datasets are in the document:

- ``dataset[*]``, and ``dataset[*]`` of nested catalogues (DCAT-US 3.0 ``catalog[*]``, any depth);
- a bare top-level array of datasets (Project Open Data 1.0);
- datasets embedded in a DCAT-US 3.0 ``datasetSeries[*]`` (``seriesMember``, ``first``, ``last``)
  or a ``service[*].servesDataset``. Such an embedded copy of a dataset whose identifier the
  document already listed is the same dataset (JSON-LD embeds nodes): it is skipped, not failed.

Unusable entries become failed records (``DatasetRecord.error``) naming the dataset and every
problem found, each also a coded problem (``DatasetRecord.problems``, domain/outcomes.py): no
identifier and no landing page to derive one from (``no-identifier``), no title (``no-title``), a
field of the wrong type (``wrong-type``), a licence that is a page of HTML rather than a name or URI
(``bad-license``), an identifier listed twice (``duplicate-identifier``), an entry that is not an
object (``not-an-object``), and a DCAT-US schema rule broken (``schema-violation``, below). A failed
entry whose identifier is known keeps it as ``source_id``, so a dataset still listed but now broken
is not mistaken for one the portal removed.

Schema validation. The catalogue's top-level ``conformsTo`` says which schema its entries follow:
the Project Open Data 1.1 URI is DCAT-US 1.1 (the non-federal dataset schema unless the source is
given ``schema_profile="federal"``), a Standard titled "DCAT-US 3.0" or a resources.data.gov
dcat-us/3.0 URI is DCAT-US 3.0 (its Dataset definition, for listed and embedded datasets alike);
anything else (DCAT-AR, no ``conformsTo``) has no schema, and only the checks above apply. The
schemas are the vendored copies in ``schemas/`` (nothing is fetched); one validator per catalogue.
Each failing field is one ``schema-violation`` naming the field (a JSON path such as
``distribution[0].mediaType``), the value and what it should be, in words (schema_wording.py: "not an
ISO 8601 date", never the regular expression); a field the checks above already found wrong
is not reported twice. A document is streamed, so ``conformsTo`` is known only once the parser has
passed it: it normally precedes ``dataset``, but entries that come before it are not checked
against any schema (nothing is buffered, and an entry's own shape is not trusted to say which
schema its catalogue follows); a warning in the log then says how many were left unchecked.
The content-quality warnings (domain/quality.py) apply to every stored record; they never fail one.

``DcatJsonSource`` fetches the catalogue with one conditional GET (ETag / Last-Modified): an
unchanged catalogue answers 304 and costs nothing more.
"""
from __future__ import annotations

import gzip
import io
import json
import logging
import re
import time
import zlib
from collections import Counter
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping

import ijson
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError, relevance
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from urllib3.exceptions import HTTPError as Urllib3Error

from harvester.config.portals import DCAT_JSON, DCAT_US_PROFILES
from harvester.domain.dataset import (DatasetRecord, clean_text, failed, normalize_url, package_record,
                                      screened_as_published, sha256_hex, slug)
from harvester.domain.outcomes import Problem, problem
from harvester.domain.screening import non_finite_as_null
from harvester.sources.base import Capabilities, CountsTraffic, Listing, SourceError, SourceUnavailable
from harvester.sources.json_stream import StandIns, build, skip
from harvester.sources.schema_wording import format_text, pattern_text
from harvester.http import conditional_headers, scrub_url, streamed_bytes, validators_of
from harvester.http.guard import failure_text

log = logging.getLogger(__name__)

# Entry keys mapped to package fields; every other key goes to ``extras``. What a publisher or a
# distribution holds besides the mapped name, URL, format and title (a contact address, a file's
# own modified date, its column descriptions) goes to ``extras`` key by key (see ``_extras``): the
# metadata hash reads only the name of an organization and the url, format and name of a resource.
_MAPPED = frozenset({"identifier", "title", "description", "keyword", "theme", "license", "modified", "issued",
                     "temporal", "landingPage", "publisher", "distribution"})
# A licence is a name or a URI; a longer text is a page pasted in (and too long a search key:
# PostgreSQL refuses index entries over 2712 bytes, which would fail the whole batch).
MAX_LICENSE_CHARS = 500
_HTML = re.compile(r"<[a-zA-Z/!][^>]*>")

# Paths (ijson prefixes) of the datasets in a document: listed ones, and embedded copies.
_LISTED = re.compile(r"(?:catalog\.item\.)*dataset\.item")
_LISTS = re.compile(r"(?:catalog\.item\.)*dataset")
_EMBEDDED = re.compile(r"(?:catalog\.item\.)*(?:datasetSeries\.item\.(?:seriesMember(?:\.item)?|first|last)"
                       r"|service\.item\.servesDataset(?:\.item)?)")
_OPEN = frozenset({"start_map", "start_array"})
_CLOSE = frozenset({"end_map", "end_array"})
_SCALARS = frozenset({"string", "number", "boolean", "null"})
# Levels of the document, outside dataset entries, where datasets are looked for (30 catalogues one
# in another); anything deeper is read through and left out.
MAX_OUTER_LEVELS = 64
_BOM = b"\xef\xbb\xbf"
_GZIP_MAGIC = b"\x1f\x8b"


class InvalidCatalogue(SourceError, ValueError):
    """The document is not a DCAT catalogue: not JSON, cut short, or without a ``dataset`` array."""


class InvalidEntry(ValueError):
    """One entry cannot be used; the message names the dataset and every problem found, and
    ``problems`` holds them coded (domain/outcomes.py; their messages without the dataset's name,
    which is ``label``)."""

    def __init__(self, message: str, source_id: str | None = None, problems: tuple[Problem, ...] = (),
                 label: str = ""):
        super().__init__(message)
        self.source_id = source_id
        self.problems = problems
        self.label = label


class _Problem(ValueError):
    """One field's problem (collected into an ``InvalidEntry``): its message and its coded form."""

    def __init__(self, message: str, code: str = "wrong-type", field: str | None = None, value: Any = None):
        super().__init__(message)
        self.problem = problem(code, message, field, value)


def _wrong_type(field: str, value: Any, expected: str) -> _Problem:
    return _Problem(f"{field} is {_kind(value)}, not {expected}", "wrong-type", field, value)


# -- DCAT-US JSON Schemas -------------------------------------------------------------------------
# The DCAT-US 1.1 and 3.0 schemas, vendored unchanged from GSA/datagov-harvester (schemas/README.md
# says where from). Nothing is ever fetched: the 3.0 definitions refer to each other by their $id
# (``/dcat-us/3.0.0/definitions/...``), resolved in a registry built from the vendored files.
SCHEMAS_DIR = Path(__file__).resolve().parent / "schemas"
DCAT_US_1_1, DCAT_US_3_0 = "dcat-us-1.1", "dcat-us-3.0"
FEDERAL, NON_FEDERAL = "federal", "non-federal"
SCHEMA_PROFILES = DCAT_US_PROFILES  # a portal's `dcat_us_profile:` (config/portals.py)
_DCAT_US_3_0_DATASET = "https://resources.data.gov/dcat-us/3.0.0/definitions/dataset"
# Formats checked: only ``date``, which jsonschema checks with the standard library. ``uri``,
# ``iri`` and ``date-time`` are checked only when optional packages (rfc3987, rfc3339-validator)
# happen to be installed; naming the formats keeps a record's verdict the same wherever it runs.
_FORMATS = FormatChecker(formats=("date",))
# A record breaking many rules (an entry of another format altogether) is reported by its first few.
MAX_SCHEMA_PROBLEMS = 10
_SHOWN_CHARS = 60
_PLAIN_KEY = re.compile(r"^[A-Za-z_@$][\w@$:-]*$")


def conformance(conforms_to: Any) -> str | None:
    """The DCAT-US version a catalogue's top-level ``conformsTo`` names: ``DCAT_US_1_1`` for the
    Project Open Data 1.1 schema URI, ``DCAT_US_3_0`` for a Standard titled "DCAT-US 3.0" or a
    resources.data.gov/dcat-us/3.0 URI; None for anything else (DCAT-AR, none at all)."""
    if isinstance(conforms_to, Mapping):
        title = conforms_to.get("title")
        if isinstance(title, str) and " ".join(title.lower().split()) in ("dcat-us 3.0", "dcat-us 3.0.0", "dcat-us 3"):
            return DCAT_US_3_0
        conforms_to = conforms_to.get("@id")
    if not isinstance(conforms_to, str):
        return None
    uri = conforms_to.strip().lower().split("://", 1)[-1].rstrip("/#")
    if uri.startswith("www."):
        uri = uri[4:]
    if uri in ("project-open-data.cio.gov/v1.1/schema", "project-open-data.cio.gov/v1.1/schema/catalog.json"):
        return DCAT_US_1_1
    if uri.startswith("resources.data.gov/dcat-us/3.0"):
        return DCAT_US_3_0
    return None


def _load(path: Path) -> dict:
    with path.open("rb") as handle:
        return json.load(handle)


@lru_cache(maxsize=None)
def _dcat_us_3_0_registry() -> Registry:
    """The vendored DCAT-US 3.0 definitions, each under its ``$id`` (read once per process)."""
    registry: Registry = Registry()
    for path in sorted((SCHEMAS_DIR / "dcat_us_3_0").glob("*.json")):
        schema = _load(path)
        registry = registry.with_resource(schema["$id"], DRAFT202012.create_resource(schema))
    return registry.crawl()


@lru_cache(maxsize=None)
def _dcat_us_1_1_schema(profile: str) -> tuple[dict, Registry]:
    """A DCAT-US 1.1 dataset schema, and a registry holding it crawled: without one, jsonschema
    crawls the schema again for every ``#/$defs/...`` it resolves, which tripled the cost of an
    entry."""
    schema = _load(SCHEMAS_DIR / "dcat_us_1_1" / ("federal_dataset.json" if profile == FEDERAL
                                                  else "non-federal_dataset.json"))
    registry: Registry = Registry().with_resource(schema["$id"].rstrip("#"), DRAFT202012.create_resource(schema))
    return schema, registry.crawl()


def dataset_validator(version: str | None, profile: str = NON_FEDERAL) -> Draft202012Validator | None:
    """The validator of one dataset entry of a ``version`` catalogue (None: no schema applies).
    DCAT-US 1.1 has a federal schema (bureauCode and programCode required) and a non-federal one
    (the default); 3.0 has one. Built once per catalogue, not per entry."""
    if profile not in SCHEMA_PROFILES:
        raise ValueError(f"schema profile {profile!r} is not one of {', '.join(SCHEMA_PROFILES)}")
    if version == DCAT_US_1_1:
        schema, registry = _dcat_us_1_1_schema(profile)
        return Draft202012Validator(schema, registry=registry, format_checker=_FORMATS)
    if version == DCAT_US_3_0:
        return Draft202012Validator({"$ref": _DCAT_US_3_0_DATASET}, registry=_dcat_us_3_0_registry(),
                                    format_checker=_FORMATS)
    return None


def json_path(parts) -> str:
    """A JSON path as messages write it: ``distribution[0].mediaType`` (empty for the record)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return out


def _short(value: Any) -> str:
    """A value as a message quotes it, cut to _SHOWN_CHARS."""
    if isinstance(value, str):
        return repr(value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "...")
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str) if value is not None else "null"
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _rule(error: ValidationError) -> str:
    """What ``error`` says, with the value cut short: '<value> is not <what it should be>'. A pattern or
    a format is said in words (sources/schema_wording.py: ``'desconocido' is not an ISO 8601 date
    (e.g. 2024-05-31 or 2024-05-31T12:00:00Z)``), never as its regular expression."""
    rule, wanted, value = error.validator, error.validator_value, _short(error.instance)
    if rule == "type":
        return f"{value} is not of type {' or '.join(map(repr, wanted)) if isinstance(wanted, list) else repr(wanted)}"
    if rule == "pattern":
        return f"{value} {pattern_text(str(wanted))}"
    if rule == "maxLength":
        return f"{value} is longer than {wanted} characters ({len(error.instance)})"
    if rule == "minLength":
        return f"{value} is shorter than {wanted} character{'s' if wanted != 1 else ''}"
    if rule == "enum":
        return f"{value} is not one of {_short(wanted)}"
    if rule == "const":
        return f"{value} is not {_short(wanted)}"
    if rule == "format":
        return f"{value} {format_text(str(wanted))}"
    if rule in ("minItems", "maxItems"):
        return f"{value} has {'fewer' if rule == 'minItems' else 'more'} than {wanted} item{'s' if wanted != 1 else ''}"
    if rule in ("anyOf", "oneOf") and error.context:
        return f"{value} is not valid under any of the allowed forms"
    message = error.message
    return message if len(message) <= 300 else message[:300] + "..."


def _key(parts) -> tuple:
    """A sort key for JSON paths that mix keys and positions."""
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in parts)


def _redacted(error: ValidationError) -> bool:
    """An error of the ``[[REDACTED...]]`` alternative DCAT-US 1.1 offers for most fields: true of
    nearly every value, and no help in saying what is wrong with it."""
    return error.validator == "pattern" and "REDACTED" in str(error.validator_value)


def _closest(error: ValidationError) -> ValidationError:
    """The most specific error under an anyOf / oneOf, as jsonschema's ``best_match`` finds it
    (the deepest; then by its relevance), except that the ``[[REDACTED]]`` alternative and a
    mere type mismatch come after any other rule: a string is said not to match its own pattern
    or to be too short, not the redaction marker."""
    while error.context:
        error = min(error.context, key=lambda e: (-len(e.path), _redacted(e), e.validator == "type", relevance(e)))
    return error


def _violation(error: ValidationError) -> tuple[tuple, str, Any]:
    """(path, what is wrong there, the bad value) of one top-level error. An anyOf or oneOf is
    described by its closest branch (``_closest``: the deepest, most specific error, such as
    ``distribution[0].mediaType``, rather than "distribution matches none of its forms"), not by
    one line per branch."""
    best = _closest(error)
    path = tuple(best.absolute_path)
    if best.validator == "required" and isinstance(best.instance, Mapping):
        name = next((n for n in best.validator_value if n not in best.instance), None)
        if name is not None:
            return path + (name,), "required property is missing", None
    text = _rule(best)
    if best is not error and path == tuple(error.absolute_path):
        text += " (nor any other form it may take)"
    return path, text, best.instance


def schema_problems(validator: Draft202012Validator, entry: Any) -> list[Problem]:
    """The ``schema-violation`` problems of one entry, in path order: one per failing field, a
    missing required property as its own field, an anyOf by its closest branch (``_violation``).
    At most MAX_SCHEMA_PROBLEMS, the last saying how many more there were."""
    found: dict[tuple, tuple[str, Any]] = {}
    for error in validator.iter_errors(entry):
        if error.validator == "required" and isinstance(error.instance, Mapping):
            path = tuple(error.absolute_path)
            for name in error.validator_value:
                if name not in error.instance:
                    found.setdefault(path + (name,), ("required property is missing", None))
            continue
        path, text, value = _violation(error)
        previous = found.get(path)
        if previous is None or text < previous[0]:  # one per field, the same one whatever the order
            found[path] = (text, value)
    problems = []
    for path in sorted(found, key=_key):
        text, value = found[path]
        field = json_path(path)
        problems.append(problem("schema-violation", f"{field or 'the record'}: {text}", field or None, value))
    if len(problems) > MAX_SCHEMA_PROBLEMS:
        rest = len(problems) - (MAX_SCHEMA_PROBLEMS - 1)
        problems = problems[:MAX_SCHEMA_PROBLEMS - 1] + [
            problem("schema-violation", f"and {rest} more schema violations")]
    return problems


def _covered(field: str | None, fields: set[str]) -> bool:
    """Whether a schema problem at ``field`` is about a field the module's own checks already
    reported (``title`` for a title that is a number; ``distribution[0]`` covers its keys)."""
    if field is None:
        return False
    return any(field == f or field.startswith(f + ".") or field.startswith(f + "[") for f in fields)


# -- mapping: a DCAT dataset entry as a CKAN-shaped package ---------------------------------------
def _kind(value: Any) -> str:
    """A JSON value's kind, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _identifier(entry: Mapping) -> tuple[str | None, str | None]:
    """(the entry's identifier, None) or (None, why it has none usable). A string, a number, or a
    DCAT-US 3.0 Identifier object with an ``@id`` (its ``notation`` alone is not unique enough)."""
    value = entry.get("identifier")
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, "no identifier"
    if isinstance(value, str):
        return value.strip(), None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value), None
    if isinstance(value, Mapping):
        at_id = value.get("@id")
        if isinstance(at_id, str) and at_id.strip():
            return at_id.strip(), None
        return None, "identifier is an object with no usable '@id'"
    return None, f"identifier is {_kind(value)}, not a string"


def _identifier_problem(entry: Mapping) -> Problem:
    """Why an entry has no usable identifier, coded: none at all (nor a landing page to derive one
    from), an object without ``@id``, or a value of the wrong kind."""
    value = entry.get("identifier")
    _, why = _identifier(entry)
    if why == "no identifier":
        return problem("no-identifier", why + " and no landing page", "identifier", value)
    if isinstance(value, Mapping):
        return problem("no-identifier", why, "identifier", value)
    return problem("wrong-type", why, "identifier", value)


def _landing_id(entry: Mapping) -> str | None:
    """A stable identifier derived from the landing page, for entries without one."""
    landing = entry.get("landingPage")
    if isinstance(landing, str) and landing.strip():
        return "landing:" + sha256_hex(normalize_url(landing))[:32]
    return None


def source_id(entry: Any) -> str | None:
    """The identifier the entry's record gets (None when it has no usable one)."""
    if not isinstance(entry, Mapping):
        return None
    found, _ = _identifier(entry)
    if found is not None:
        return found
    if entry.get("identifier") is None or isinstance(entry.get("identifier"), str):
        return _landing_id(entry)  # missing or empty: the landing page stands in
    return None


def _label(entry: Mapping) -> str:
    """The dataset as messages name it: by title, else by identifier."""
    title = entry.get("title")
    if isinstance(title, str) and title.strip():
        text = clean_text(title)
        shown = text if len(text) <= 80 else text[:80] + "..."
        return f"dataset {shown!r}"
    found, _ = _identifier(entry)
    return f"dataset with identifier {found!r}" if found else "untitled dataset without identifier"


def _optional_text(entry: Mapping, key: str) -> str | None:
    value = entry.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _wrong_type(key, value, "a string")


def _title(entry: Mapping) -> str:
    value = entry.get("title")
    if value is None:
        raise _Problem("no title", "no-title", "title")
    if not isinstance(value, str):
        raise _wrong_type("title", value, "a string")
    if not clean_text(value):
        raise _Problem("title is empty", "no-title", "title", value)
    return value.strip()


def _labels(entry: Mapping, key: str) -> list[str]:
    """Keywords or themes: a list of strings (numbers kept as text, DCAT-US 3.0 concepts by their
    label), or one string of comma-separated values. Unique, in order."""
    value = entry.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        items: list = value.split(",")
    elif isinstance(value, list):
        items = value
    else:
        raise _wrong_type(key, value, "a list of strings")
    out: dict[str, None] = {}
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            item = next((item[k] for k in ("prefLabel", "title", "name", "@id") if isinstance(item.get(k), str)), item)
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            item = str(item)
        if not isinstance(item, str):
            raise _wrong_type(f"{key}[{i}]", item, "a string")
        if item.strip():
            out[item.strip()] = None
    return list(out)


def _organization(entry: Mapping) -> dict | None:
    """The publisher as a CKAN organization: ``title`` its name, ``name`` a slug of it. (Its other
    keys, such as mbox or a subOrganizationOf chain, go to the extras.)"""
    value = entry.get("publisher")
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = value.get("name")
        if value is not None and not isinstance(value, str):
            raise _wrong_type("publisher.name", value, "a string")
    elif not isinstance(value, str):
        raise _wrong_type("publisher", value, "an object")
    if not value or not value.strip():
        return None
    return {"title": value.strip(), "name": slug(value)}


def _distributions(entry: Mapping) -> list[tuple[dict, dict]]:
    """Each distribution as (a CKAN resource, the distribution's other keys). The resource:
    ``url`` the download URL (else the access URL), ``format`` the format (else the media type),
    ``name`` the title. The other keys go to the extras, where the metadata hash sees them (it reads
    only the url, format and name of a resource)."""
    value = entry.get("distribution")
    if value is None:
        return []
    if not isinstance(value, list):
        raise _wrong_type("distribution", value, "a list")
    out = []
    for i, dist in enumerate(value):
        if not isinstance(dist, Mapping):
            raise _wrong_type(f"distribution[{i}]", dist, "an object")
        for key in ("downloadURL", "accessURL", "format", "mediaType", "title"):
            if dist.get(key) is not None and not isinstance(dist[key], str):
                raise _wrong_type(f"distribution[{i}].{key}", dist[key], "a string")
        url_key = "downloadURL" if (dist.get("downloadURL") or "").strip() else "accessURL"
        format_key = "format" if (dist.get("format") or "").strip() else "mediaType"
        resource = {"url": (dist.get(url_key) or "").strip(), "format": (dist.get(format_key) or "").strip(),
                    "name": (dist.get("title") or "").strip()}
        out.append((resource, {k: v for k, v in dist.items() if k not in (url_key, format_key, "title")}))
    return out


def _license(entry: Mapping) -> str | None:
    value = entry.get("license")
    if isinstance(value, Mapping):  # DCAT-US 3.0 LicenseDocument
        value = value.get("@id") if isinstance(value.get("@id"), str) else value.get("title")
    if value is None:
        return None
    if not isinstance(value, str):
        raise _wrong_type("license", value, "a string")
    value = value.strip()
    if _HTML.search(value):
        raise _Problem(f"license is {len(value)} characters of HTML, not a licence name or URI", "bad-license",
                       "license", value)
    if len(value) > MAX_LICENSE_CHARS:
        raise _Problem(f"license is {len(value)} characters long, not a licence name or URI", "bad-license",
                       "license", value)
    return value or None


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False,
                                                           separators=(",", ":"))


def _distribution_labels(entry: Mapping) -> list[str | None]:
    """The identifier of each distribution where it is unique in the dataset, else None."""
    ids = [d.get("identifier").strip() if isinstance(d.get("identifier"), str) and d["identifier"].strip() else None
           for d in entry.get("distribution") or []]
    counts = Counter(ids)
    return [i if i is not None and counts[i] == 1 else None for i in ids]


def _extras(entry: Mapping, distributions: list[tuple[dict, dict]]) -> list[dict]:
    """Everything the package's own fields do not hold, as CKAN extras (non-string values as JSON),
    so that the metadata hash sees every change: unmapped keys as they are, the publisher's keys
    besides its name as ``publisher.<key>``, the distributions' keys besides those of the resource
    as ``distribution[<identifier, or position>].<key>``, and a non-string identifier (a DCAT-US 3.0
    object)."""
    out = []
    for key, value in entry.items():
        if key == "publisher":
            if isinstance(value, Mapping):
                out += [{"key": f"publisher.{k}", "value": _as_text(v)} for k, v in value.items() if k != "name"]
        elif key == "distribution":
            for n, (label, (_, rest)) in enumerate(zip(_distribution_labels(entry), distributions)):
                out += [{"key": f"distribution[{label or n}].{k}", "value": _as_text(v)} for k, v in rest.items()
                        if not (label and k == "identifier")]
        elif key == "identifier":
            if not isinstance(value, str):
                out.append({"key": key, "value": _as_text(value)})
        elif key not in _MAPPED:
            out.append({"key": key, "value": _as_text(value)})
    return out


def to_package(entry: Any, catalog_url: str) -> dict:
    """A DCAT dataset entry as a CKAN-shaped package. Raises ``InvalidEntry`` naming the dataset and
    every problem found when the entry cannot be used. (``catalog_url`` is not needed by the mapping
    itself; ``normalize`` uses it for datasets without a landing page.)"""
    if not isinstance(entry, Mapping):
        message = f"entry is {_kind(entry)}, not a JSON object"
        raise InvalidEntry(message, problems=(problem("not-an-object", message, None, entry),))
    problems: list[Problem] = []
    ident = source_id(entry)
    if ident is None:
        problems.append(_identifier_problem(entry))
    parts: dict[str, Any] = {}
    fields = (("title", _title), ("notes", lambda e: _optional_text(e, "description")),
              ("tags", lambda e: _labels(e, "keyword")), ("organization", _organization),
              ("groups", lambda e: _labels(e, "theme")), ("distributions", _distributions), ("license_id", _license),
              ("metadata_modified", lambda e: _optional_text(e, "modified")),
              ("url", lambda e: _optional_text(e, "landingPage")))
    for key, extract in fields:
        try:
            parts[key] = extract(entry)
        except _Problem as exc:
            problems.append(exc.problem)
    if problems:
        label = _label(entry)
        raise InvalidEntry(f"{label}: {'; '.join(p.message for p in problems)}", source_id=ident,
                           problems=tuple(problems), label=label)
    return {
        "id": ident,
        "title": parts["title"],
        "notes": parts["notes"],
        "tags": [{"name": k} for k in parts["tags"]],
        "organization": parts["organization"],
        "groups": [{"name": t} for t in parts["groups"]],
        "resources": [resource for resource, _ in parts["distributions"]],
        "license_id": parts["license_id"],
        "metadata_modified": parts["metadata_modified"],
        "issued": entry.get("issued"),
        "temporal": entry.get("temporal"),
        "url": parts["url"],
        "extras": _extras(entry, parts["distributions"]),
    }


def _is_http(url: Any) -> bool:
    return isinstance(url, str) and url.strip().lower().startswith(("http://", "https://"))


@screened_as_published(source_id, nulls=False)
def normalize(entry: Any, catalog_url: str, validator: Draft202012Validator | None = None, *,
              non_finite: bool = False) -> DatasetRecord:
    """A DCAT dataset entry as a DatasetRecord; an unusable entry comes back failed, saying why
    (its ``error`` names the dataset, its ``problems`` are coded). ``validator``: the catalogue's
    DCAT-US schema (``dataset_validator``), whose violations fail the entry too; a field the
    mapping already found wrong is not reported again by the schema.

    An entry too deep or too large fails before it is mapped (``screened_as_published``, which
    leaves its NaN to ``non_finite``).

    ``non_finite``: the entry may hold a NaN or ±Infinity (the document had bare tokens:
    sources/json_stream.py). The mapping writes the numbers of ``extras`` as texts (NaN as
    ``"NaN"``, which no screening would see), so such an entry is mapped with them made null, each
    a ``non-finite-number`` warning naming its place in the entry (domain/screening.py); the
    checks and the schema see the entry as it came."""
    warnings: tuple[Problem, ...] = ()
    try:
        pkg = to_package(entry, catalog_url)
        if non_finite:
            nulled, found = non_finite_as_null(entry, pkg["id"])
            if nulled is not entry:
                pkg, warnings = to_package(nulled, catalog_url), found.problems()
        problems: tuple[Problem, ...] = ()
        ident, label = pkg["id"], None
    except InvalidEntry as exc:
        if not isinstance(entry, Mapping):
            return failed(exc.source_id, entry, exc.problems)
        pkg, problems, ident, label = None, exc.problems, exc.source_id, exc.label
    if validator is not None:
        fields = {p.field for p in problems if p.field}
        problems += tuple(p for p in schema_problems(validator, entry) if not _covered(p.field, fields))
    if problems:
        return failed(ident, entry, problems, prefix=f"{label or _label(entry)}: ")
    title, description = clean_text(pkg["title"]), clean_text(pkg["notes"])
    if _is_http(pkg["url"]):
        url = pkg["url"].strip()
        url_hash = sha256_hex(normalize_url(url))
    else:  # no landing page: the entry's place in the catalogue (kept apart by its identifier)
        url = f"{catalog_url}#{pkg['id']}"
        url_hash = sha256_hex(f"{normalize_url(catalog_url)}#{pkg['id']}")
    org = pkg["organization"]
    return package_record(pkg, source_id=pkg["id"], url=url, url_hash=url_hash, title=title, description=description,
                          tags=sorted({t["name"] for t in pkg["tags"]}), organization=org.get("title") if org else None,
                          warnings=warnings)


# -- streaming parse ------------------------------------------------------------------------------
class _Prefixed(io.RawIOBase):
    """A binary stream with some already-read bytes put back in front."""

    def __init__(self, head: bytes, rest: BinaryIO):
        self._head, self._rest = head, rest
        self.empty = False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._head:
            if size is None or size < 0:
                data, self._head = self._head + self._rest.read(), b""
                return data
            data, self._head = self._head[:size], self._head[size:]
            return data
        return self._rest.read() if size is None or size < 0 else self._rest.read(size)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _read_exactly(fp: BinaryIO, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = fp.read(n - len(data))
        if not more:
            break
        data += more
    return data


def _decoded(fp: BinaryIO) -> _Prefixed:
    """The JSON bytes of ``fp``: gunzipped if they are gzip (a ``data.json.gz`` served as a file),
    without a UTF-8 byte order mark."""
    head = _read_exactly(fp, 3)
    if head.startswith(_GZIP_MAGIC):
        return _decoded(gzip.GzipFile(fileobj=_Prefixed(head, fp), mode="rb"))
    at_end = len(head) < 3
    if head.startswith(_BOM):
        head = head[len(_BOM):]
    stream = _Prefixed(head, fp)
    stream.empty = at_end and not head.strip()
    return stream


def _located_entries(fp: BinaryIO, source: str, header: dict | None = None) -> Iterator[tuple[Any, bool, bool]]:
    """(entry, embedded, restored) for each dataset entry in document order; ``embedded``: a copy
    inside a series or service, not a catalogue's own listing; ``restored``: the entry held a bare
    NaN or ±Infinity or a lone surrogate escape, which the parser takes only as a stand-in
    (sources/json_stream.py), given back as ``json.loads`` reads it. ``header`` (when given) gets
    the top-level ``conformsTo`` as soon as the stream passes it.

    The parser's basic events are read (ijson's ``parse`` gives each event its path as a string,
    built anew for every event: quadratic in the depth, gigabytes for a document 30,000 levels
    deep), with the path kept here for what is outside entries, down to MAX_OUTER_LEVELS (deeper,
    nothing is looked for: it is read through and left out). An entry is built with at most
    ``json_stream.KEPT_LEVELS`` levels (``build``): one deeper is its own ``record-too-deep``,
    and no step after can recurse into more."""
    where = scrub_url(source)
    try:
        stream = _decoded(fp)
        if stream.empty:
            raise InvalidCatalogue(f"{where}: the document is empty, not a DCAT catalogue")
        stand_ins = StandIns(stream)
        events = ijson.basic_parse(stand_ins, use_float=True)
        first, _ = next(events)
        bare_list = first == "start_array"
        if not bare_list and first != "start_map":
            raise InvalidCatalogue(f"{where}: the document is a single JSON value, not a DCAT catalogue")
        found = bare_list
        path: list[str | None] = ["item" if bare_list else None]  # ijson's prefix, a part a level

        def given_back(value: Any) -> tuple[Any, bool]:
            if not stand_ins.pending:  # (the common case: nothing to give back, no walk)
                return value, False
            before = stand_ins.restored
            value = stand_ins.restore(value)
            return value, stand_ins.restored > before

        for event, value in events:
            if event == "map_key":
                path[-1] = value
                if stand_ins.pending:
                    stand_ins.restore(value)  # outside any dataset: counted, so that entries are not walked
                continue
            if event in _CLOSE:
                path.pop()
                continue
            prefix = ".".join(path)
            if prefix == "conformsTo" and header is not None and not bare_list:
                if event in _OPEN:
                    header["conformsTo"] = given_back(build(events, event, stand_ins=stand_ins))[0]
                    continue
                if event in _SCALARS:
                    header["conformsTo"] = given_back(value)[0]
                    continue
            if event in _OPEN:
                listed = prefix == "item" if bare_list else (prefix.endswith("dataset.item")
                                                             and _LISTED.fullmatch(prefix) is not None)
                if listed or (event == "start_map" and not bare_list and _EMBEDDED.fullmatch(prefix)):
                    found = True
                    entry, restored = given_back(build(events, event, stand_ins=stand_ins))
                    yield entry, not listed, restored
                    continue
                if event == "start_array" and not bare_list and _LISTS.fullmatch(prefix):
                    found = True
                if len(path) >= MAX_OUTER_LEVELS:
                    skip(events, stand_ins)  # (no dataset is looked for so deep)
                    continue
                path.append(None if event == "start_map" else "item")
            elif event in _SCALARS and (prefix == "item" if bare_list else
                                        prefix.endswith("dataset.item") and _LISTED.fullmatch(prefix)):
                entry, restored = given_back(value)
                yield entry, False, restored  # not an object: normalize says so
            elif stand_ins.pending and value is not None:
                stand_ins.restore(value)  # outside any dataset: counted, so that entries are not walked
        if not found:
            raise InvalidCatalogue(f"{where}: the JSON document has no 'dataset' array: not a DCAT catalogue")
    except ijson.JSONError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidCatalogue(f"{where}: not a valid JSON document ({reason[:200]})") from exc
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InvalidCatalogue(f"{where}: the gzip stream is cut short or corrupt ({exc})") from exc


def iter_entries(fp: BinaryIO, *, source: str = "catalogue") -> Iterator[Any]:
    """The dataset entries of a catalogue read from the binary stream ``fp`` (plain or gzip), one
    at a time. Raises ``InvalidCatalogue`` (naming ``source``) for a document that is not one."""
    for entry, _, _ in _located_entries(fp, source):
        yield entry


def iter_records(fp: BinaryIO, catalog_url: str, *, schema_profile: str = NON_FEDERAL) -> Iterator[DatasetRecord]:
    """The catalogue's entries as DatasetRecords, streamed. An identifier listed again is a failed
    record (``duplicate identifier X (first seen as entry N)``, N counting entries from 1 in
    document order); an embedded copy of a dataset listed elsewhere in the document is skipped.
    Only the identifiers seen (with their entry numbers) are kept. Entries of a DCAT-US catalogue
    are checked against its schema (``schema_profile``: which DCAT-US 1.1 dataset schema, federal
    or non-federal; see the module's docstring for a ``conformsTo`` after the datasets)."""
    if schema_profile not in SCHEMA_PROFILES:
        raise ValueError(f"schema profile {schema_profile!r} is not one of {', '.join(SCHEMA_PROFILES)}")
    where = scrub_url(catalog_url)
    seen: dict[str, int] = {}  # identifier -> entry number, negative for an embedded copy
    header: dict[str, Any] = {}
    known, validator, unchecked = False, None, 0
    for n, (entry, embedded, restored) in enumerate(_located_entries(fp, catalog_url, header), 1):
        if not known and "conformsTo" in header:
            known, version = True, conformance(header["conformsTo"])
            validator = dataset_validator(version, schema_profile)
            log.debug("%s: conforms to %s", where, version or "no DCAT-US schema")
        unchecked += not known
        ident = source_id(entry)
        if ident is not None and ident in seen:
            first = seen[ident]
            if embedded or first < 0:
                log.debug("%s: entry %d is another copy of %r (entry %d), skipped", catalog_url, n, ident, abs(first))
                continue
            yield failed(ident, entry, [problem("duplicate-identifier", f"duplicate identifier {ident!r} (first seen "
                                                                        f"as entry {first})", "identifier", ident)],
                         prefix=f"entry {n}: {_label(entry)}: ")
            continue
        if ident is not None:
            seen[ident] = -n if embedded else n
        record = normalize(entry, catalog_url, validator, non_finite=restored)
        yield record if record.ok else replace(record, error=f"entry {n}: {record.error}")
    if unchecked and conformance(header.get("conformsTo")) is not None:
        log.warning("%s: conformsTo comes after %d dataset entries in the document: those were not checked against "
                    "the %s schema", where, unchecked, conformance(header["conformsTo"]))


# -- over HTTP ------------------------------------------------------------------------------------


class DcatJsonSource(CountsTraffic):
    """A ``data.json`` catalogue at ``url``, fetched whole with one (conditional) GET through
    ``fetcher`` (harvester.http.HttpFetcher) and streamed into pages of records.

    After ``iter_pages``: ``not_modified`` (the portal answered 304), ``validators`` (the
    response's ETag / Last-Modified, to send next time) and ``listed`` (entries read).
    ``schema_profile``: the DCAT-US 1.1 dataset schema its entries are held to, ``non-federal``
    (the default) or ``federal`` (bureauCode and programCode required)."""

    kind = DCAT_JSON
    capabilities = Capabilities(conditional=True)

    def __init__(self, url: str, *, fetcher, page_size: int = 1000, schema_profile: str = NON_FEDERAL):
        if schema_profile not in SCHEMA_PROFILES:
            raise ValueError(f"schema profile {schema_profile!r} is not one of {', '.join(SCHEMA_PROFILES)}")
        self.url, self.fetcher, self.page_size = url, fetcher, page_size
        self.schema_profile = schema_profile
        self.not_modified = False
        self.validators: dict[str, str] = {}
        self.listed = 0
        self.failed = 0
        self._done = False

    def __repr__(self) -> str:
        return f"DcatJsonSource({scrub_url(self.url)!r})"


    @property
    def total(self) -> int | None:
        """Entries in the catalogue, once it has been read (a document says so only at its end)."""
        return self.listed if self._done else None

    def iter_pages(self, validators: dict | None = None, *, conditional: bool = True,
                   page_size: int | None = None) -> Iterator[list[DatasetRecord]]:
        """Pages of at most ``page_size`` records: the whole catalogue, or nothing when the portal
        answers 304 to ``validators`` (sent only when ``conditional``). Raises ``SourceError`` for
        a 4xx (or any answer that is neither 2xx nor 304), ``SourceUnavailable`` when the
        connection fails mid-body, ``InvalidCatalogue`` for a body that is not a catalogue."""
        self.not_modified, self.validators, self.listed, self.failed, self._done = False, {}, 0, 0, False
        size = page_size or self.page_size
        headers = conditional_headers(validators) if conditional else {}
        started = time.monotonic()
        resp = self.fetcher.get(self.url, headers=headers or None, stream=True)
        try:
            if resp.status_code == 304:
                self.not_modified, self._done = True, True
                self.validators = {**(validators or {}), **validators_of(resp.headers)}
                log.info("%s: not modified since the last run (304)", scrub_url(self.url))
                return
            if not 200 <= resp.status_code < 300:
                raise SourceError(f"{scrub_url(self.url)}: GET answered HTTP {resp.status_code} "
                                  f"{resp.reason or ''}".rstrip())
            yield from self._pages(resp, size)
            self.validators = validators_of(resp.headers)
            self._done = True
            log.info("%s: %d entries (%d failed), %d bytes in %.1fs", scrub_url(self.url), self.listed,
                     self.failed, self.bytes_received, time.monotonic() - started)
        finally:
            resp.close()

    def _pages(self, resp, size: int) -> Iterator[list[DatasetRecord]]:
        raw = resp.raw
        raw.decode_content = True  # Content-Encoding: gzip / deflate undone as the body streams
        page: list[DatasetRecord] = []
        try:
            for record in iter_records(raw, self.url, schema_profile=self.schema_profile):
                self.listed += 1
                self.failed += not record.ok
                page.append(record)
                if len(page) >= size:
                    yield page
                    page = []
            if page:
                yield page
        except (Urllib3Error, OSError) as exc:
            raise SourceUnavailable(f"{scrub_url(self.url)}: the catalogue's body broke off after "
                                    f"{self.listed} entries ({failure_text(exc)})") from exc
        finally:
            self.fetcher.add_bytes(streamed_bytes(raw))

    def iter_records(self, since, page_size: int, listing: Listing,
                     validators: dict | None = None) -> Iterator[list[DatasetRecord]]:
        """The Source protocol (sources/base.py): the whole catalogue every time (``since`` cannot
        be asked of a file), conditional on ``validators``. ``listing`` is filled once the
        catalogue has been read to its end."""
        yield from self.iter_pages(validators, conditional=bool(validators), page_size=page_size)
        listing.not_modified = self.not_modified
        listing.complete = not self.not_modified
        listing.validators = dict(self.validators)
