"""What a broken JSON Schema ``pattern`` or ``format`` asks for, in words (issue 38, finding 5).

A ``schema-violation`` (sources/dcat_json.py) says which field, its value and what it should be. A
regular expression is no answer to "what should it be": ``'desconocido' does not match
'^([\\+-]?\\d{4}(?!\\d{2}\\b))...'`` is the DCAT-US 1.1 way of saying "not an ISO 8601 date". Every
pattern the vendored schemas (sources/schemas/) carry is named here, by its exact text (they are
vendored unchanged, and tests/sources/test_schema_wording.py fails when a schema brings a pattern
with no name); an unknown pattern (a newer schema's) is "does not have the expected form", the
pattern quoted once, cut short. Pure: strings in, strings out.
"""
from __future__ import annotations

# ISO 8601 pieces of the DCAT-US 1.1 patterns, as they appear in them (the date's back-reference
# differs with the groups before it: \3, \4, \17, \18).
_DATE = (r"([\+-]?\d{4}(?!\d{2}\b))((-?)((0[1-9]|1[0-2])(\{ref}([12]\d|0[1-9]|3[01]))?|W([0-4]\d|5[0-2])(-?[1-7])?"
         r"|(00[1-9]|0[1-9]\d|[12]\d{2}|3([0-5]\d|6[1-6])))([T\s]((([01]\d|2[0-3])((:?)[0-5]\d)?|24\:?00)"
         r"([\.,]\d+(?!:))?)?(\{ref2}[0-5]\d([\.,]\d+)?)?([zZ]|([\+-])([01]\d|2[0-3]):?([0-5]\d)?)?)?)?")
_DURATION = (r"P(?:\d+(?:\.\d+)?Y)?(?:\d+(?:\.\d+)?M)?(?:\d+(?:\.\d+)?W)?(?:\d+(?:\.\d+)?D)?"
             r"(?:T(?:\d+(?:\.\d+)?H)?(?:\d+(?:\.\d+)?M)?(?:\d+(?:\.\d+)?S)?)?")


def _date(ref: int) -> str:
    return _DATE.replace("{ref}", str(ref)).replace("{ref2}", str(ref + 14))


DATE = "an ISO 8601 date (e.g. 2024-05-31 or 2024-05-31T12:00:00Z)"
REPEATING = "an ISO 8601 repeating duration (e.g. R/P1D daily, R/P1M monthly, R/P1Y yearly)"

# pattern -> what a value must be to match it ("not <this>").
PATTERNS: dict[str, str] = {
    # DCAT-US 1.1: issued, modified (its first form)
    "^" + _date(3) + "$": DATE,
    # modified's second form: a (repeating) duration
    r"^(R\d*\/)?" + _DURATION + "$": "an ISO 8601 duration (e.g. P1Y, or R/P1M repeating)",
    # modified's third form and temporal's second: a start date and a duration
    r"^(R\d*\/)?" + _date(4) + r"(\/)" + _DURATION + "$":
        "an ISO 8601 interval of a start date and a duration (e.g. 2024-01-01/P1M)",
    # temporal's first form: two dates
    "^" + _date(3) + r"(\/)" + _date(3) + "$":
        "an ISO 8601 interval of two dates (e.g. 2020-01-01/2024-12-31)",
    # temporal's third form: a duration and an end date
    r"^(R\d*\/)?" + _DURATION + r"\/" + _date(4) + "$":
        "an ISO 8601 interval of a duration and an end date (e.g. P1Y/2024-12-31)",
    # accrualPeriodicity (1.1 and 3.0)
    r"^R\/" + _DURATION + "$": REPEATING,
    r"^R/P.+$": REPEATING,
    # the redaction marker most 1.1 fields may hold instead of a value
    r"^(\[\[REDACTED).*?(\]\])$": "a redaction marker (e.g. [[REDACTED-EX B3]])",
    r"[0-9]{3}:[0-9]{2}": "a bureau code (3 digits, a colon and 2 digits, e.g. 015:11)",
    r"[0-9]{3}:[0-9]{3}": "a program code (3 digits, a colon and 3 digits, e.g. 015:001)",
    r"[0-9]{3}-[0-9]{9}": "an IT investment UII (3 digits, a hyphen and 9 digits, e.g. 023-000000001)",
    r"^[-\w]+/[-\w]+(\.[-\w]+)*([+][-\w]+)?$": "a media type (e.g. text/csv or application/json)",
    (r"^(((([A-Za-z]{2,3}(-([A-Za-z]{3}(-[A-Za-z]{3}){0,2}))?)|[A-Za-z]{4}|[A-Za-z]{5,8})(-([A-Za-z]{4}))?"
     r"(-([A-Za-z]{2}|[0-9]{3}))?(-([A-Za-z0-9]{5,8}|[0-9][A-Za-z0-9]{3}))*(-([0-9A-WY-Za-wy-z](-[A-Za-z0-9]{2,8})+))*"
     r"(-(x(-[A-Za-z0-9]{1,8})+))?)|(x(-[A-Za-z0-9]{1,8})+)|((en-GB-oed|i-ami|i-bnn|i-default|i-enochian|i-hak|"
     r"i-klingon|i-lux|i-mingo|i-navajo|i-pwn|i-tao|i-tay|i-tsu|sgn-BE-FR|sgn-BE-NL|sgn-CH-DE)|(art-lojban|"
     r"cel-gaulish|no-bok|no-nyn|zh-guoyu|zh-hakka|zh-min|zh-min-nan|zh-xiang)))$"):
        "a language tag (BCP 47, e.g. en or es-AR)",
    r"^mailto:[\w\_\~\!\$\&\'\(\)\*\+\,\;\=\:.-]+@[\w.-]+\.[\w.-]+?$":
        "a mailto: e-mail address (e.g. mailto:data@example.gov)",
    # DCAT-US 3.0: dates that are a year, or a year and a month
    r"^[0-9]{4}$": "a year (e.g. 2024)",
    r"^[0-9]{4}-[0-9]{2}$": "a year and month (e.g. 2024-05)",
}

# format -> what a value must be ("not <this>"); only ``date`` is checked today (dcat_json._FORMATS).
FORMATS: dict[str, str] = {
    "date": "an ISO 8601 date (e.g. 2024-05-31)",
    "date-time": "an ISO 8601 date and time (e.g. 2024-05-31T12:00:00Z)",
    "uri": "a URI (e.g. https://example.gov/data)",
    "iri": "an IRI (e.g. https://example.gov/data)",
    "email": "an e-mail address (e.g. data@example.gov)",
}

SHOWN_PATTERN = 40  # characters of an unknown pattern a message quotes


def pattern_text(pattern: str) -> str:
    """What a value that fails ``pattern`` is not, or does not have: ``is not an ISO 8601 date
    (e.g. ...)``; for a pattern not named here ``does not have the expected form (pattern '...')``."""
    named = PATTERNS.get(pattern)
    if named:
        return f"is not {named}"
    shown = pattern if len(pattern) <= SHOWN_PATTERN else pattern[:SHOWN_PATTERN] + "..."
    return f"does not have the expected form (pattern {shown!r})"


def format_text(fmt: str) -> str:
    """What a value that fails the ``format`` ``fmt`` is not: ``is not an ISO 8601 date (e.g. ...)``."""
    named = FORMATS.get(fmt)
    return f"is not {named}" if named else f"is not a valid {fmt}"
