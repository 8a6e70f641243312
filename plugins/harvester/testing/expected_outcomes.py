"""What the samples' records must come to, worked out apart from the sources (test-only): the
oracles the source tests and the DAG tests compare Harvester's verdicts with.

DCAT-US: the vendored JSON Schemas (sources/schemas) run with jsonschema directly, the
catalogue's entries found by walking the document json.load gives, and the DCAT-US source's own
rules (identifier, title, field types, licence, duplicates) restated from its documentation.
DCAT-AP: the rules restated as plain rdflib triple lookups on the parsed graph. Nothing here calls
the source modules' functions (only the documented cap on schema problems per record is theirs):
an oracle that asked the code under test would agree with it whatever it did.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime
from pathlib import Path

from jsonschema import Draft202012Validator, FormatChecker
from rdflib import BNode, Graph, Literal, URIRef
from rdflib.namespace import DCAT, DCTERMS, FOAF
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from harvester.sources.dcat_json import MAX_SCHEMA_PROBLEMS

SCHEMAS = Path(__file__).resolve().parents[1] / "sources" / "schemas"  # the vendored files
POD_1_1 = "https://project-open-data.cio.gov/v1.1/schema"


# -- DCAT-US: the schemas, straight from the vendored files ----------------------------------------
FORMATS = FormatChecker(formats=("date",))  # the formats jsonschema checks without optional packages


def validator_1_1(profile: str = "non-federal") -> Draft202012Validator:
    name = "federal_dataset.json" if profile == "federal" else "non-federal_dataset.json"
    return Draft202012Validator(json.loads((SCHEMAS / "dcat_us_1_1" / name).read_text()), format_checker=FORMATS)


def validator_3_0() -> Draft202012Validator:
    registry = Registry()
    for path in (SCHEMAS / "dcat_us_3_0").glob("*.json"):
        schema = json.loads(path.read_text())
        registry = registry.with_resource(schema["$id"], DRAFT202012.create_resource(schema))
    return Draft202012Validator({"$ref": "https://resources.data.gov/dcat-us/3.0.0/definitions/dataset"},
                                registry=registry, format_checker=FORMATS)


def expected_validator(document, profile: str = "non-federal") -> Draft202012Validator | None:
    """The schema a sample's catalogue names (the samples use exactly these two forms)."""
    conforms = document.get("conformsTo") if isinstance(document, dict) else None
    if conforms == POD_1_1:
        return validator_1_1(profile)
    if isinstance(conforms, dict) and conforms.get("title") == "DCAT-US 3.0":
        return validator_3_0()
    return None


def schema_fields(validator: Draft202012Validator, entry) -> set[tuple]:
    """The failing fields of an entry: each missing required property, and the place of every
    other error (an anyOf's place being as deep as its errors agree: the deepest error of its
    branches when only one branch gets that deep)."""
    out = set()
    for error in validator.iter_errors(entry):
        if error.validator == "required":
            out |= {tuple(error.absolute_path) + (name,) for name in error.validator_value
                    if name not in error.instance}
        else:
            out.add(tuple(error.absolute_path))
    return out


# -- DCAT-US: the source's rules, restated ---------------------------------------------------------
HTML = re.compile(r"<[a-zA-Z/!][^>]*>")


def identifier_of(entry) -> str | None:
    value = entry.get("identifier") if isinstance(entry, dict) else None
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, dict) and isinstance(value.get("@id"), str) and value["@id"].strip():
        return value["@id"].strip()
    return None


def rule_problems(entry) -> list[tuple[str, str | None]]:
    """(code, field) of what the module itself finds wrong with an entry, one per field group."""
    if not isinstance(entry, dict):
        return [("not-an-object", None)]
    out = []
    ident = entry.get("identifier")
    if identifier_of(entry) is None:
        if ident is None or (isinstance(ident, str) and not ident.strip()):
            landing = entry.get("landingPage")
            if not (isinstance(landing, str) and landing.strip()):
                out.append(("no-identifier", "identifier"))
        else:
            out.append(("no-identifier" if isinstance(ident, dict) else "wrong-type", "identifier"))
    title = entry.get("title")
    if title is None or (isinstance(title, str) and not title.strip()):
        out.append(("no-title", "title"))
    elif not isinstance(title, str):
        out.append(("wrong-type", "title"))
    for key in ("description", "modified", "landingPage"):
        if entry.get(key) is not None and not isinstance(entry[key], str):
            out.append(("wrong-type", key))
    for key in ("keyword", "theme"):
        value = entry.get(key)
        if value is not None and not isinstance(value, (str, list)):
            out.append(("wrong-type", key))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict) and any(isinstance(item.get(k), str) for k in ("prefLabel", "title", "name",
                                                                                        "@id")):
                    continue
                if not isinstance(item, (str, int, float)) or isinstance(item, bool):
                    out.append(("wrong-type", f"{key}[{i}]"))
                    break
    publisher = entry.get("publisher")
    if isinstance(publisher, dict):
        if publisher.get("name") is not None and not isinstance(publisher["name"], str):
            out.append(("wrong-type", "publisher.name"))
    elif publisher is not None and not isinstance(publisher, str):
        out.append(("wrong-type", "publisher"))
    distributions = entry.get("distribution")
    if distributions is not None and not isinstance(distributions, list):
        out.append(("wrong-type", "distribution"))
    elif distributions:
        for i, dist in enumerate(distributions):
            if not isinstance(dist, dict):
                out.append(("wrong-type", f"distribution[{i}]"))
                break
            bad = [k for k in ("downloadURL", "accessURL", "format", "mediaType", "title")
                   if dist.get(k) is not None and not isinstance(dist[k], str)]
            if bad:
                out.append(("wrong-type", f"distribution[{i}].{bad[0]}"))
                break
    licence = entry.get("license")
    if isinstance(licence, dict):
        licence = licence.get("@id") if isinstance(licence.get("@id"), str) else licence.get("title")
    if licence is not None and not isinstance(licence, str):
        out.append(("wrong-type", "license"))
    elif isinstance(licence, str) and (HTML.search(licence) or len(licence.strip()) > 500):
        out.append(("bad-license", "license"))
    return out


def path_text(parts: tuple) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def expected_codes(entry, validator) -> Counter:
    """The codes of an entry's problems (empty when it is stored): the module's rules, and one
    schema-violation per failing field they did not already report, at most MAX_SCHEMA_PROBLEMS."""
    rules = rule_problems(entry)
    codes = Counter(code for code, _ in rules)
    if validator is not None and isinstance(entry, dict):
        covered = {field for _, field in rules if field}
        fields = {path_text(p) for p in schema_fields(validator, entry)}
        fields = {f for f in fields if not any(f == c or f.startswith((c + ".", c + "[")) for c in covered)}
        if fields:
            codes["schema-violation"] = min(len(fields), MAX_SCHEMA_PROBLEMS)
    return codes


def listed_entries(document) -> list[tuple[object, bool]]:
    """(entry, embedded) in document order: a bare list's items; a catalogue's ``dataset`` items,
    its nested ``catalog`` items' (any depth), and the datasets embedded in its series
    (``seriesMember``, ``first``, ``last``) and services (``servesDataset``)."""
    if isinstance(document, list):
        return [(e, False) for e in document]
    out = []
    for key, value in document.items():
        if key == "dataset" and isinstance(value, list):
            out += [(e, False) for e in value]
        elif key == "catalog" and isinstance(value, list):
            for nested in value:
                if isinstance(nested, dict):
                    out += listed_entries(nested)
        elif key in ("datasetSeries", "service") and isinstance(value, list):
            for item in value:
                for inner, embedded in (item.items() if isinstance(item, dict) else ()):
                    if (key, inner) in (("datasetSeries", "seriesMember"), ("datasetSeries", "first"),
                                        ("datasetSeries", "last"), ("service", "servesDataset")):
                        out += [(e, True) for e in (embedded if isinstance(embedded, list) else [embedded])
                                if isinstance(e, dict)]
    return out


def expected_outcomes(document, profile: str = "non-federal") -> list[Counter]:
    """Each record the catalogue gives, as the Counter of its error codes (empty: stored)."""
    validator = expected_validator(document, profile)
    seen: dict[str, bool] = {}  # identifier -> came embedded
    out = []
    for entry, embedded in listed_entries(document):
        ident = identifier_of(entry)
        if ident is None and isinstance(entry, dict) and isinstance(entry.get("identifier") or "", str):
            landing = entry.get("landingPage")  # no identifier: the landing page stands in
            ident = "landing " + landing.strip() if isinstance(landing, str) and landing.strip() else None
        if ident is not None and ident in seen:
            if embedded or seen[ident]:
                continue  # another copy of a dataset already listed: skipped
            out.append(Counter({"duplicate-identifier": 1}))
            continue
        if ident is not None:
            seen[ident] = embedded
        out.append(expected_codes(entry, validator))
    return out


# -- DCAT-AP: the rules, as triple lookups ---------------------------------------------------------
# The codes the DCAT-AP rules give (the content warnings of domain/quality.py aside).
RULE_CODES = {"no-identifier", "no-title", "bad-range", "range-tolerated", "recommended-missing",
              "distribution-incomplete", "bad-optional-date"}
DATE = re.compile(r"^\d{4}(-(0[1-9]|1[0-2]))?$")  # a year, a year and month


def is_date(text: str) -> bool:
    text = text.strip()
    if DATE.match(text):
        return True
    try:
        datetime.fromisoformat(text)
        return True
    except ValueError:
        return False


def label(node) -> str:
    return "_" if isinstance(node, BNode) else str(node)


def expected_dataset(graph: Graph, d) -> tuple[str | None, bool, Counter]:
    """(the record's id, whether it is stored, Counter of (code, field, value)) for one dataset node;
    field "*" for bad-optional-date (the content warnings report the package's issued date, the
    rules any other: each bad value once, whichever says it); blank-node distributions as "_"."""
    ids = [str(o).strip() for o in graph.objects(d, DCTERMS.identifier) if str(o).strip()]
    landing = [o for o in graph.objects(d, DCAT.landingPage)]
    ident = str(d) if isinstance(d, URIRef) else ids[0] if ids else "landing" if landing else None
    titles = [o for o in graph.objects(d, DCTERMS.title) if isinstance(o, Literal) and str(o).strip()]
    if ident is None:
        return None, False, Counter({("no-identifier", "dct:identifier", None): 1})
    if not titles:
        given = sorted(str(o) for o in graph.objects(d, DCTERMS.title))
        return None, False, Counter({("no-title", "dct:title", given[0] if given else None): 1})
    errors, warnings = Counter(), Counter()
    modified = [("dct:modified", o) for o in graph.objects(d, DCTERMS.modified)]
    if not modified:
        modified = [("dcat:CatalogRecord.dct:modified", o) for r in graph.subjects(FOAF.primaryTopic, d)
                    for o in graph.objects(r, DCTERMS.modified)]
    for field, o in modified:
        if isinstance(o, Literal) and str(o).strip() == "":
            warnings[("range-tolerated", field, str(o))] += 1
        elif not isinstance(o, Literal) or not is_date(str(o)):
            errors[("bad-range", field, str(o))] += 1
    for o in graph.objects(d, DCTERMS.issued):
        if isinstance(o, Literal) and str(o).strip() == "":
            warnings[("range-tolerated", "dct:issued", str(o))] += 1
        elif not isinstance(o, Literal) or not is_date(str(o)):
            warnings[("bad-optional-date", "*", str(o))] += 1
    for p, field in ((DCAT.distribution, "dcat:distribution"), (DCTERMS.publisher, "dct:publisher"),
                     (DCAT.contactPoint, "dcat:contactPoint")):
        values = list(graph.objects(d, p))
        errors.update(("bad-range", field, str(o)) for o in values if isinstance(o, Literal))
        if not values and p != DCAT.distribution:
            warnings[("recommended-missing", field, None)] += 1
    warnings.update(("range-tolerated", "dcat:landingPage", str(o)) for o in landing if not isinstance(o, URIRef))
    warnings.update(("range-tolerated", "dcat:theme", str(o)) for o in graph.objects(d, DCAT.theme)
                    if isinstance(o, Literal))
    warnings.update(("range-tolerated", "dcat:keyword", str(o)) for o in graph.objects(d, DCAT.keyword)
                    if not isinstance(o, Literal))
    for dist in graph.objects(d, DCAT.distribution):
        if isinstance(dist, Literal):
            continue
        field = f"dcat:distribution[{label(dist)}].dcat:accessURL"
        urls = list(graph.objects(dist, DCAT.accessURL))
        if not urls:
            warnings[("distribution-incomplete", field, None)] += 1
        warnings.update(("range-tolerated", field, str(u)) for u in urls if not isinstance(u, URIRef))
    return ident, not errors, errors if errors else warnings
