"""The duplicate keys (sql/037: one match a link, parallel workers, each record read once per field,
issue 40) are, row for row, the keys sql/018's definition gives: for every real record of the CKAN
samples, for records of every odd shape a portal could send, and for link-like values of every odd
form."""
from __future__ import annotations

import json

from harvester.testing.definitions import earlier_definition
from harvester.testing.samples import samples_dir

ODD_RECORDS = [
    [{"url": "https://example.org/in-an-array"}],                       # an array holding a record
    "a scalar", 42, None, True, {},
    {"url": 7, "extras": "not a list", "resources": {"url": "https://example.org/not-a-list"}},
    {"url": " HTTPS://WWW.Example.org:443/Data/Set/ ",
     "extras": [{"key": "guid", "value": "https://example.org/Data/Set"},
                {"key": "dct:identifier", "value": ["10.5281/ZENODO.1", {"nested": "urn:X:1"}, 3, None]},
                {"key": "identifier", "value": "8FDA2162-DCD6-4FB3-9835-C85C046FF229"},
                {"key": "uri", "value": "http://example.org"},
                {"key": "harvest_source_title", "value": "https://not.an.identity.example/x"},
                {"value": "https://no.key.example/x"}, "not an object", {"key": 5, "value": "urn:a:b"}],
     "resources": [{"url": "https://files.example/b.csv"}, {"url": "HTTP://files.example:80/a.csv"},
                   {"url": "https://files.example/b.csv/"}, {"url": "ftp://files.example/c"},
                   {"url": ["https://files.example/in-a-list"]}, {"url": None}, {}, "x",
                   {"url": "https://files.example/with space\there"}]},
    {"url": "https://other.example/x", "resources": [{"url": "https://files.example/"}, {"url": "not a url"}]},
]
ODD_VALUES = [
    "https://www.Example.ORG/dataset/abc/", "http://example.org:80/dataset/abc", "HtTpS://WWW.x.org:443/A?b#c",
    "  https://example.org/a  ", "\thttps://example.org/tab", "https://example.org/a b", "https://example.org/a\tb",
    "https://example.org/", "https://example.org", "https://example.org///", "http://www.", "http://www./path",
    "https://:80/x", "https://ex.org:8080/x", "https://www.www.ex.org/x", "https://ex.org:443:443/x",
    "https://Ünïcødé.example/Pfad/ä", "https://ex.org/\u00a0nbsp", "https://ex.org/\u2003em", "https://ex\u2003.org/x",
    "https:/one-slash.org/x", "https//no-colon.org/x", "http://", "https://?q", "https://#f", "https://ex.org?q=1",
    "8FDA2162-DCD6-4FB3-9835-C85C046FF229", " 8fda2162-dcd6-4fb3-9835-c85c046ff229 ", "24af6104-b326-40a5-88e3-e0ce7477a9",
    "urn:ISBN:123", "URN:x", "urn: x", "doi:10.1/X", "10.5281/zenodo.123", "10.123/x", "10.5281/", "population-2020",
    "", " ", None, "ftp://example.org/x", "mailto:a@b.example", "ſtp://x", "httpſ://x.org/y",
]


def _old(name: str) -> str:
    """sql/018's definition of ``name``, renamed into pg_temp (calling 018's link key)."""
    return earlier_definition("018_", name, f"{name}_018",
                              calls={"harvester_link_key": "pg_temp.harvester_link_key_018"})


def _records() -> list:
    records = []
    for path in sorted(samples_dir().glob("*.jsonl")):
        with path.open(encoding="utf-8") as handle:
            records += [json.loads(line) for line in handle if line.strip()]
    return records


def test_every_link_key_is_the_one_the_definition_before_gave(db):
    db.execute(_old("harvester_link_key"))
    values = list(ODD_VALUES)
    for record in _records():
        values += [record.get("url"), record.get("id")]
        values += [r.get("url") for r in record.get("resources") or [] if isinstance(r, dict)]
    values = [v if v is None or isinstance(v, str) else json.dumps(v) for v in values]
    rows = db.execute("SELECT v, harvester_link_key(v), pg_temp.harvester_link_key_018(v) FROM unnest(%s::text[]) v",
                      (values,)).fetchall()
    assert len(rows) > 5000
    assert sum(1 for _, new, _ in rows if new is not None) > 4000  # most are link-like: the keys are there to compare
    assert [(v, new, old) for v, new, old in rows if new != old] == []


def test_every_dataset_has_the_keys_the_definition_before_gave(db):
    db.execute(_old("harvester_link_key"))
    db.execute(_old("harvester_keys_of"))
    records = _records() + ODD_RECORDS
    assert len(records) > 3000
    # one statement for all, as a run's merge writes them; every other source id is link-like, every
    # third dataset's url is on another host than its portal, organizations blank or missing at times
    db.execute(
        """INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,
               organization, first_seen_at, updated_at, raw)
           SELECT CASE WHEN i %% 2 = 0 THEN 'https://portal.example/' ELSE 'http://www.Portal.example:80' END,
                  CASE WHEN i %% 2 = 0 THEN coalesce(raw ->> 'id', 'r' || i) || '-' || i
                       ELSE 'https://portal.example/id/' || i END,
                  CASE WHEN i %% 3 = 0 THEN 'https://elsewhere.example/' || i
                       WHEN i %% 3 = 1 THEN 'https://portal.example/dataset/' || i ELSE 'page ' || i END,
                  'u', md5('c' || (i %% 50)), 'm', 't',
                  CASE WHEN i %% 7 = 0 THEN NULL WHEN i %% 7 = 1 THEN '  ' ELSE raw -> 'organization' ->> 'title' END,
                  now(), now(), raw
           FROM unnest(%s::jsonb[]) WITH ORDINALITY AS r(raw, i)""",
        ([json.dumps(r) for r in records],))
    ids = "ARRAY(SELECT id FROM datasets)"
    counts = db.execute(f"SELECT count(*), count(DISTINCT dataset_id), count(*) FILTER (WHERE claimed),"
                        f" array_agg(DISTINCT evidence ORDER BY evidence) FROM harvester_keys_of({ids})").fetchone()
    # every kind of evidence is there to compare, claimed or not
    assert counts[0] > 10_000 and counts[1] > 3000 and counts[2] > 1000, counts
    assert counts[3] == ["content", "distributions", "identifier", "landing_page"], counts
    differences = db.execute(
        f"""(SELECT 'now', * FROM harvester_keys_of({ids}) EXCEPT ALL SELECT 'now', * FROM pg_temp.harvester_keys_of_018({ids}))
            UNION ALL
            (SELECT 'before', * FROM pg_temp.harvester_keys_of_018({ids}) EXCEPT ALL SELECT 'before', * FROM harvester_keys_of({ids}))
            LIMIT 5""").fetchall()
    assert differences == []
    # and a run's scope of a few datasets (an index scan, no workers) gives the same rows as all of them
    few = "ARRAY(SELECT id FROM datasets ORDER BY id DESC LIMIT 12)"
    assert (sorted(map(str, db.execute(f"SELECT * FROM harvester_keys_of({few})").fetchall()))
            == sorted(map(str, db.execute(f"SELECT * FROM pg_temp.harvester_keys_of_018({few})").fetchall())))
