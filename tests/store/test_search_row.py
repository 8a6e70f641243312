"""A dataset's search row (sql/036: the raw record read once a row, issue 40) is, field by field,
the row sql/025's definition gives: for every real record of the CKAN samples and for records of
every odd shape a portal could send (an array, a scalar, fields of the wrong kind), as the insert
trigger writes them and as the update trigger rewrites them."""
from __future__ import annotations

import json

from harvester.testing.definitions import earlier_definition
from harvester.testing.samples import sample_path

SAMPLES = ("catalog-data-gov.jsonl", "dados-gov-br.jsonl", "data-gov-uk.jsonl", "data-gc-ca-snapshot-2013-06-17T12-30.jsonl",
           "data-stadt-zuerich-ch.jsonl")
ODD = [
    [{"resources": [{"format": "CSV"}], "license_id": "cc-by"}],          # an array holding a record
    "a scalar", 42, None, True, {},
    {"resources": "not a list", "license_id": 7, "organization": "a name, not an object",
     "translations": ["not", "an", "object"]},
    {"resources": [{"format": ["csv"]}, {"format": None}, {"format": ".ZIP "}, "x"],
     "organization": {"name": "  Statistique Canada "}, "license_title": " CC-BY 4.0 ",
     "translations": {"title": {"fr": "Population par province", "en": "Population by province", "de": 3}}},
]


def _records() -> list:
    records = []
    for name in SAMPLES:
        with sample_path(name).open(encoding="utf-8") as handle:
            records += [json.loads(line) for line in handle if line.strip()]
    return records + ODD


def _differences(db) -> list:
    return db.execute(
        """(SELECT 'stored', s.* FROM dataset_search s
            EXCEPT ALL SELECT 'stored', r.* FROM datasets d CROSS JOIN LATERAL pg_temp.search_row_025(d) r)
           UNION ALL
           (SELECT 'before', r.* FROM datasets d CROSS JOIN LATERAL pg_temp.search_row_025(d) r
            EXCEPT ALL SELECT 'before', s.* FROM dataset_search s)
           LIMIT 5""").fetchall()


def test_every_search_row_is_the_one_the_definition_before_gave(db):
    # 025's fields, its text's hash as bytes as the row holds it since sql/043
    before = earlier_definition("025_", "harvester_search_row", "search_row_025")
    hashed = "SELECT d.id, d.portal_url, d.content_hash,"
    assert before.count(hashed) == 1
    db.execute(before.replace(hashed, "SELECT d.id, d.portal_url, decode(d.content_hash, 'hex'),"))
    records = _records()
    assert len(records) > 500
    # one statement for all, as a run's merge writes them: the insert trigger sees them together
    db.execute(
        """INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title, description,
               tags, organization, metadata_modified, first_seen_at, updated_at, raw, search_config)
           SELECT 'https://portal.example', 'r' || (i - 1), 'https://portal.example/' || (i - 1), 'u', md5('c' || (i - 1)),
                  'm', coalesce(raw ->> 'title', 'record ' || (i - 1)), coalesce(raw ->> 'notes', ''),
                  CASE WHEN jsonb_typeof(raw -> 'tags') = 'array' THEN raw -> 'tags' ELSE '[]' END,
                  raw -> 'organization' ->> 'title', now(), now(), now(), raw,
                  (CASE WHEN i %% 2 = 0 THEN 'english' ELSE 'simple' END)::regconfig
           FROM unnest(%s::jsonb[]) WITH ORDINALITY AS r(raw, i)""",
        ([json.dumps(r) for r in records],))
    stored = db.execute("SELECT count(*), count(*) FILTER (WHERE cardinality(formats) > 0),"
                        " count(*) FILTER (WHERE cardinality(licenses) > 0),"
                        " count(*) FILTER (WHERE cardinality(organizations) > 1) FROM dataset_search").fetchone()
    # every row was written, and the fields read from the record are there to compare
    assert stored[0] == len(records) and min(stored[1:]) > 0, stored
    assert _differences(db) == []

    # the update trigger rewrites a row with the same function: records swapped between datasets
    db.execute("UPDATE datasets d SET raw = o.raw, content_hash = md5(d.content_hash || '-2')"
               " FROM datasets o WHERE o.source_id = 'r' || ((substr(d.source_id, 2)::int + 7) %% %s)",
               (len(records),))
    assert db.execute("SELECT count(*) FROM dataset_search s JOIN datasets d ON d.id = s.dataset_id"
                      " WHERE s.content_hash = decode(d.content_hash, 'hex')"
                      " AND d.content_hash = md5(md5('c' || substr(d.source_id, 2)) || '-2')").fetchone()[0] == len(records)
    assert _differences(db) == []


def test_the_odd_records_read_as_nothing_but_what_they_hold(db):
    """What the fields of the odd records are, so that a definition that reads them otherwise, the
    one before as well as this one, is seen: nothing from a scalar or from fields of the wrong kind."""
    with db.cursor() as cur:
        cur.executemany(
            """INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,
                   first_seen_at, updated_at, raw)
               VALUES ('https://portal.example', %s, 'https://portal.example/x', 'u', md5('c'), 'm', 't',
                       now(), now(), %s)""", [(f"odd{i}", json.dumps(r)) for i, r in enumerate(ODD)])
    rows = db.execute("SELECT d.source_id, s.organizations, s.formats, s.licenses, s.document::text"
                      " FROM datasets d JOIN dataset_search s ON s.dataset_id = d.id ORDER BY d.id").fetchall()
    fields = {source_id: (orgs, formats, licenses, doc) for source_id, orgs, formats, licenses, doc in rows}
    # an array holding a record: its formats are found (a lax JSON path looks into arrays), not
    # its other fields (an array has no keys)
    assert fields["odd0"][:3] == ([], ["csv"], []), fields["odd0"]
    for i in range(1, len(ODD) - 2):
        assert fields[f"odd{i}"][:3] == ([], [], []), (ODD[i], fields[f"odd{i}"])
    # fields of the wrong kind: nothing, but a number where a licence's id is, read as its text
    assert fields[f"odd{len(ODD) - 2}"][:3] == ([], [], ["7"])
    orgs, formats, licenses, doc = fields[f"odd{len(ODD) - 1}"]
    assert orgs == ["statistique canada"] and formats == ["zip"] and licenses == ["cc-by 4.0"]
    assert "'population':" in doc and "'province':" in doc and "'par':" in doc
