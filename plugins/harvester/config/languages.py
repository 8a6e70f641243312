"""A record's declared language as the text-search configuration its text is indexed with.

A portal's ``language:`` (config/portals.py) is the configuration of its datasets by default; a
record that declares a language PostgreSQL stems (``DatasetRecord.language``: an SDMX name's
``xml:lang``, a DCAT ``dct:language``, an ISO ``gmd:language``, a DataCite ``language``) is indexed
with that language's instead. Pure: no IO.
"""
from __future__ import annotations

import re
from functools import lru_cache

from harvester.config.portals import LANGUAGE_CODES, TEXT_SEARCH_CONFIGS

# ISO 639-2 codes (bibliographic and terminology forms) of the languages of TEXT_SEARCH_CONFIGS, as
# their ISO 639-1 code: what ISO 19139 (gmd:LanguageCode "fre"), MARC, DataCite and the EU's
# language authority (.../authority/language/FRA) declare.
ISO_639_2 = {"ara": "ar", "hye": "hy", "arm": "hy", "eus": "eu", "baq": "eu", "cat": "ca", "dan": "da",
             "nld": "nl", "dut": "nl", "eng": "en", "fin": "fi", "fra": "fr", "fre": "fr", "deu": "de", "ger": "de",
             "ell": "el", "gre": "el", "hin": "hi", "hun": "hu", "ind": "id", "gle": "ga", "ita": "it", "lit": "lt",
             "nep": "ne", "nor": "no", "nob": "nb", "por": "pt", "ron": "ro", "rum": "ro", "rus": "ru", "srp": "sr",
             "spa": "es", "swe": "sv", "tam": "ta", "tur": "tr", "yid": "yi"}
# A language tag's primary subtag (BCP 47: "fr" of "fr-CA", "pt" of "pt_BR", "sr" of "sr-Latn").
_PRIMARY = re.compile(r"^([a-z]{2,})(?:[-_][a-z0-9]{1,8})*$")
_LONGEST = 100  # longer than any tag or IRI a record declares a language with: not one


def text_search_config(language) -> str | None:
    """The configuration of a declared language: an ISO 639-1 code ("fr"), with region or script
    subtags ("fr-CA", "pt_BR", "sr-Latn"), an ISO 639-2 code ("fra", "fre"; ISO 19139's "eng; USA":
    the language before the country), the last segment of a language IRI
    (".../authority/language/FRA", ".../iso639-2/fre") or a configuration's name ("french"), in any
    case. None when PostgreSQL ships no stemmer for it (Polish, Chinese...), for "simple" and for what
    names no language (None, "", "und", "mul", "zxx", a number, a list): such a record is indexed with
    its portal's language."""
    if not isinstance(language, str) or not language.strip() or len(language) > _LONGEST:
        return None
    return _config_of(language)


@lru_cache(maxsize=512)  # (called for every staged record; few distinct values)
def _config_of(language: str) -> str | None:
    tag = language.split(";")[0].strip().rstrip("/").rsplit("/", 1)[-1].rsplit("#", 1)[-1].lower()
    match = _PRIMARY.match(tag)
    if match is None:
        return None
    primary = match.group(1)
    if primary in TEXT_SEARCH_CONFIGS and primary != "simple":
        return primary
    return LANGUAGE_CODES.get(ISO_639_2.get(primary, primary))
