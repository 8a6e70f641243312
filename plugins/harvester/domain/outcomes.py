"""What became of the records a run could not take as they are: the closed list of reason codes,
one problem of one record, and the grouped report operators read (the run's page, ``harvester
report``, ``harvester validate``, the notification).

A record has problems (``DatasetRecord.problems``). A problem of severity ``error`` keeps the
record out (it is Failed; the run commits the others); one of severity ``warning`` is said and the
record is stored all the same. Each code belongs to one stage of a run:

- ``parse``: the record could not be read at all (not an object, a node without identity, too
  deep or too large, an identifier that cannot be stored), or only with a value neutralised (a
  NaN, a lone surrogate, a NUL: see domain/screening.py);
- ``validate``: the record breaks the catalogue's schema or what Harvester needs, or (warnings)
  its content falls short of what a catalogue should say;
- ``embed``: the record was stored but its text has no vector yet (not embedded yet, or its vector
  came back unusable);
- ``remove``: the record is gone from the portal, but the removal was withheld.

Codes are a closed list (``CODES``): ``problem`` refuses any other, so the documented list is the
whole list. Pure: no IO here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

ERROR, WARNING = "error", "warning"
SEVERITIES = (ERROR, WARNING)
PARSE, VALIDATE, EMBED, REMOVE = "parse", "validate", "embed", "remove"
STAGES = (PARSE, VALIDATE, EMBED, REMOVE)
# Longest value kept with a problem (the rest is cut, with an ellipsis): a report names the bad
# value, it does not store a page of HTML pasted into a field.
MAX_VALUE_CHARS = 200
MAX_MESSAGE_CHARS = 1000


@dataclass(frozen=True)
class Code:
    severity: str
    stage: str
    summary: str


CODES: dict[str, Code] = {
    # -- errors: the record is not stored ------------------------------------------------------
    "not-an-object": Code(ERROR, PARSE, "the record is not a JSON object (or RDF node) that can be read as a dataset"),
    "record-too-deep": Code(ERROR, PARSE, "the record nests objects and arrays more than 64 levels deep (real records "
                                          "have fewer than 10)"),
    "record-too-large": Code(ERROR, PARSE, "the record is more than 10 MB of JSON (real records have at most a few "
                                           "hundred KB)"),
    "unstorable-identifier": Code(ERROR, PARSE, "the identifier holds a lone UTF-16 surrogate (an escape such as "
                                                "\\ud800 without its pair) or U+0000 (NUL), which PostgreSQL cannot "
                                                "store (or, in an XML answer, a character XML 1.0 forbids); unlike "
                                                "other texts it is not neutralised (altered, it could be "
                                                "another dataset's identifier): the record is not stored, and the "
                                                "message shows the identifier with that character escaped"),
    "not-iso-metadata": Code(ERROR, PARSE, "the file of a Web Accessible Folder is not an ISO 19139 / 19115-2 record: "
                                           "not well-formed XML (an HTML page, a cut file) or another root element"),
    "unsafe-xml": Code(ERROR, PARSE, "the XML file declares a DTD or entities (how an XML bomb expands), or has more "
                                     "elements or deeper nesting than a metadata record has: refused unread"),
    "file-too-large": Code(ERROR, PARSE, "the file is larger than a metadata record can be (or never ends: it was "
                                         "still arriving at its deadline): refused"),
    "no-identifier": Code(ERROR, VALIDATE, "the record has no identifier (nor a landing page to derive one from)"),
    "duplicate-identifier": Code(ERROR, VALIDATE, "the identifier was already used by an earlier record of the listing"),
    "no-title": Code(ERROR, VALIDATE, "the record has no title"),
    "wrong-type": Code(ERROR, VALIDATE, "a field holds a value of the wrong kind (a number or an object for a text, ...)"),
    "bad-license": Code(ERROR, VALIDATE, "the licence is a page of text or HTML, not a licence name or URI"),
    "bad-date": Code(ERROR, VALIDATE, "a date Harvester needs (the modification date) cannot be read as a date"),
    "schema-violation": Code(ERROR, VALIDATE, "the record breaks the JSON Schema its catalogue conforms to "
                                              "(DCAT-US 1.1 or 3.0): the message names the field and the rule"),
    "bad-range": Code(ERROR, VALIDATE, "a property's value is outside its range in the profile (DCAT-AP): a literal "
                                       "where a resource is required, a date that is not a date, ..."),
    "invalid-record": Code(ERROR, VALIDATE, "the portal's record cannot be used (the message says why); the kinds of "
                                            "portal without a schema of their own report this"),
    # -- warnings: the record is stored --------------------------------------------------------
    "non-finite-number": Code(WARNING, PARSE, "a number is NaN or ±Infinity (which JSON and PostgreSQL do not "
                                              "have): it is stored as null"),
    "lone-surrogate": Code(WARNING, PARSE, "a text (or a key) holds a lone UTF-16 surrogate (an escape such as "
                                           "\\ud800 without its pair), which is not a character: it is stored as "
                                           "U+FFFD (�)"),
    "nul-character": Code(WARNING, PARSE, "a text (or a key) holds U+0000 (NUL), which PostgreSQL cannot store: it "
                                          "is removed"),
    "invalid-xml-character": Code(WARNING, PARSE, "an XML answer holds a character XML 1.0 forbids (a control "
                                                  "character such as U+0001, raw or written &#x1;, U+0000, a lone "
                                                  "surrogate &#xD800;, U+FFFE), which no XML parser reads: it is "
                                                  "read as U+FFFD (\ufffd) and the answer's other records as usual"),
    "no-description": Code(WARNING, VALIDATE, "the dataset has no description"),
    "no-license": Code(WARNING, VALIDATE, "the dataset names no licence"),
    "no-distribution": Code(WARNING, VALIDATE, "the dataset has no distribution (no resource, no file, no link)"),
    "modified-in-future": Code(WARNING, VALIDATE, "the dataset's modification date is in the future"),
    "landing-page-not-http": Code(WARNING, VALIDATE, "the landing page is not an http(s) URL"),
    "title-from-identifier": Code(WARNING, VALIDATE, "the record has no title (optional in STAC; a stub SDMX "
                                                  "dataflow has no name): its identifier stands for it"),
    "bad-optional-date": Code(WARNING, VALIDATE, "a date besides the modification date (issued, a temporal bound) "
                                                 "cannot be read as a date"),
    "recommended-missing": Code(WARNING, VALIDATE, "a property the profile recommends (DCAT-AP) is missing"),
    "distribution-incomplete": Code(WARNING, VALIDATE, "a distribution lacks a property the profile makes mandatory "
                                                       "(DCAT-AP: dcat:accessURL); the dataset is stored"),
    "range-tolerated": Code(WARNING, VALIDATE, "a property's value is outside its range in the profile (DCAT-AP) in a "
                                               "way Harvester reads past: a landing page, theme or access URL written "
                                               "as a literal, a keyword that is not a literal, an empty date"),
    "embedding-deferred": Code(WARNING, EMBED, "the dataset was stored, but its text has no vector yet (the embedding "
                                               "provider was unavailable or the run's budget ran out); the next run "
                                               "embeds it"),
    "embedding-refused": Code(WARNING, EMBED, "the dataset was stored, but the embedding provider answered an unusable "
                                              "vector for its text (NaN or infinite values, another number of "
                                              "dimensions, empty, all zeros, or a batch answered with another count "
                                              "of vectors): the message says what was wrong, how many refusals in a "
                                              "row so far, and when a run sends it again, alone, or that it was "
                                              "given up (`harvester embeddings invalidate` resets it)"),
    "removal-withheld": Code(WARNING, REMOVE, "the portal no longer lists the dataset, but the removal guard withheld "
                                              "its removal (too large a share of the portal at once)"),
}


class UnknownCode(ValueError):
    """A problem was given a code that is not in ``CODES``."""


@dataclass(frozen=True)
class Problem:
    """One problem of one record: a ``code`` of ``CODES``, the ``field`` it is about (a JSON path,
    an RDF property; None when it is about the whole record), the bad ``value`` (cut to
    MAX_VALUE_CHARS) and a ``message`` that names both."""

    code: str
    message: str
    field: str | None = None
    value: str | None = None

    @property
    def severity(self) -> str:
        return CODES[self.code].severity

    @property
    def stage(self) -> str:
        return CODES[self.code].stage

    def as_dict(self) -> dict:
        return {"code": self.code, "severity": self.severity, "stage": self.stage, "field": self.field,
                "value": self.value, "message": self.message}


def shown(value) -> str | None:
    """A bad value as a report shows it: text, cut to MAX_VALUE_CHARS (None stays None)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 1] + "…"


def problem(code: str, message: str, field: str | None = None, value=None) -> Problem:
    """A Problem; ``code`` must be one of CODES (UnknownCode otherwise)."""
    if code not in CODES:
        raise UnknownCode(f"{code!r} is not a reason code (the list: {', '.join(CODES)})")
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 1] + "…"
    return Problem(code, message, field, shown(value))


def errors(problems: Iterable[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == ERROR]


def error_text(problems: Iterable[Problem]) -> str | None:
    """The one-line reason of a Failed record (``DatasetRecord.error``): its errors' messages."""
    found = [p.message for p in problems if p.severity == ERROR]
    return "; ".join(found) if found else None


# -- the grouped report -------------------------------------------------------------------------
EXAMPLES = 3  # example record ids a group shows


@dataclass
class Group:
    """The rows of one reason code: how many, the first few records' ids (by their position in the
    listing), and the first row's message."""

    code: str
    severity: str
    stage: str
    count: int
    examples: list[str]
    message: str

    def as_dict(self) -> dict:
        return {"code": self.code, "severity": self.severity, "stage": self.stage, "count": self.count,
                "examples": list(self.examples), "message": self.message}


def record_label(source_id: str | None, position: int | None) -> str:
    """How a report names a record: its id, or its place in the listing when it has none."""
    if source_id:
        return source_id
    return f"#{position}" if position is not None else "?"


def group_order(group: Mapping | Group) -> tuple:
    """Errors first, then the most frequent, then by code: one order everywhere a report is shown."""
    get = group.get if isinstance(group, Mapping) else lambda k: getattr(group, k)
    return (SEVERITIES.index(get("severity")), -get("count"), get("code"))


class Grouping:
    """Groups counted as rows come, one ``add`` a row in listing order: what ``group`` makes of the
    same rows, kept as one Group a code whatever the number of rows (a validation keeps only the
    first rows of millions, its groups' counts stay exact)."""

    def __init__(self):
        self._by_code: dict[str, Group] = {}

    def add(self, row: Mapping) -> None:
        """One more row (``code``, ``severity``, ``stage``, ``source_id``, ``position``, ``message``)."""
        g = self._by_code.get(row["code"])
        if g is None:
            g = self._by_code[row["code"]] = Group(row["code"], row["severity"], row["stage"], 0, [], row["message"])
        g.count += 1
        label = record_label(row.get("source_id"), row.get("position"))
        if len(g.examples) < EXAMPLES and label not in g.examples:
            g.examples.append(label)

    def groups(self) -> list[Group]:
        """The groups so far, in ``group_order``."""
        return sorted(self._by_code.values(), key=group_order)


def group(rows: Iterable[Mapping]) -> list[Group]:
    """Rows (``code``, ``severity``, ``stage``, ``source_id``, ``position``, ``message``), in
    listing order, grouped by code as store.outcomes.groups groups them in SQL."""
    grouping = Grouping()
    for row in rows:
        grouping.add(row)
    return grouping.groups()


def counts_by_code(groups: Iterable[Group | Mapping]) -> dict[str, int]:
    out = {}
    for g in groups:
        get = g.get if isinstance(g, Mapping) else lambda k, g=g: getattr(g, k)
        out[get("code")] = get("count")
    return out


def reference_table() -> str:
    """The codes as a Markdown table (the docs' reference page)."""
    lines = ["| code | severity | stage | meaning |", "|---|---|---|---|"]
    for code, c in CODES.items():
        lines.append(f"| `{code}` | {c.severity} | {c.stage} | {c.summary} |")
    return "\n".join(lines)


# -- the CSV download ---------------------------------------------------------------------------
CSV_FIELDS = ("run_id", "portal_url", "position", "source_id", "stage", "severity", "code", "field", "value",
              "message")


def csv_chunks(rows: Iterable[Mapping], *, rows_per_chunk: int = 1000) -> Iterable[str]:
    """All ``rows`` as CSV text (a header, then one line per row, CSV_FIELDS), in chunks: the same
    bytes whether the CLI writes them to a file or the API streams them."""
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    n = 0
    for row in rows:
        writer.writerow(["" if row.get(k) is None else row.get(k) for k in CSV_FIELDS])
        n += 1
        if n % rows_per_chunk == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()
