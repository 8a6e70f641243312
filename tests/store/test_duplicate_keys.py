"""The evidence keys of sql/018_duplicates.sql on a real PostgreSQL: which values are link-like, how
they are normalized, and which keys a dataset row carries."""
import json

import pytest

CASES = [
    # (value, key or None)
    ("https://www.Example.ORG/dataset/abc/", "example.org/dataset/abc"),
    ("http://example.org:80/dataset/abc", "example.org/dataset/abc"),
    ("HTTPS://WWW.Example.org:443/Dataset/ABC", "example.org/Dataset/ABC"),  # paths keep their case
    ("https://example.org/dataset/abc?x=1", "example.org/dataset/abc?x=1"),
    ("https://example.org/catalog.ttl#ds-1", "example.org/catalog.ttl#ds-1"),
    ("  https://example.org/a  ", "example.org/a"),
    ("https://example.org/", None),             # a site's home page names no dataset
    ("https://example.org", None),
    ("8FDA2162-DCD6-4FB3-9835-C85C046FF229", "8fda2162-dcd6-4fb3-9835-c85c046ff229"),
    ("24af6104-b326-40a5-88e3-e0ce7477a9", None),  # a truncated UUID is a bare identifier
    ("urn:ISBN:123", "urn:isbn:123"),
    ("10.5281/zenodo.123", "doi:10.5281/zenodo.123"),
    ("population-2020", None),
    ("", None),
    ("ftp://example.org/x", None),
]


@pytest.mark.parametrize("value,expected", CASES)
def test_link_keys(db, value, expected):
    assert db.execute("SELECT harvester_link_key(%s)", (value,)).fetchone()[0] == expected


def _keys(db, raw: dict, *, portal="https://national.example", source_id=None, url=None, organization=None,
          content_hash="c1") -> tuple[set, set]:
    db.execute(
        """INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,
                                 organization, first_seen_at, updated_at, raw)
           VALUES (%s, %s, %s, 'u', %s, 'm', 't', %s, now(), now(), %s)""",
        (portal, source_id or raw["id"], url or f"{portal}/dataset/{raw.get('name') or raw['id']}", content_hash,
         organization, json.dumps(raw)))
    rows = db.execute(
        """SELECT k.key, k.evidence, k.claimed FROM datasets d CROSS JOIN LATERAL harvester_keys_of(ARRAY[d.id]) k
           WHERE d.source_id = %s""", (source_id or raw["id"],)).fetchall()
    assert len({r[0] for r in rows}) == len(rows)  # one row per key
    return {(r[1], r[2]) for r in rows}, {r[0] for r in rows}


def _md5(db, text: str):
    return db.execute("SELECT md5(%s)::uuid", (text,)).fetchone()[0]


def test_a_ckan_record_carries_its_identity_and_what_it_claims(db):
    raw = {"id": "8fda2162-dcd6-4fb3-9835-c85c046ff229", "name": "levy", "url": "https://origin.example/levy",
           "extras": [{"key": "guid", "value": "https://origin.example/id/levy"},
                      {"key": "harvest_source_title", "value": "https://not.an.identity.example/x"}],
           "resources": [{"url": "https://files.example/levy.csv"}, {"url": "https://files.example/levy.json"},
                         {"url": "not a url"}]}
    kinds, keys = _keys(db, raw, organization="HM Revenue & Customs")
    assert kinds == {("identifier", False), ("landing_page", False), ("landing_page", True), ("identifier", True),
                     ("distributions", False), ("content", False)}
    assert _md5(db, "link:8fda2162-dcd6-4fb3-9835-c85c046ff229") in keys
    assert _md5(db, "link:national.example/dataset/levy") in keys
    assert _md5(db, "link:national.example/dataset/8fda2162-dcd6-4fb3-9835-c85c046ff229") in keys
    assert _md5(db, "link:origin.example/levy") in keys
    assert _md5(db, "link:origin.example/id/levy") in keys
    assert _md5(db, "link:not.an.identity.example/x") not in keys  # not an identity extra
    assert _md5(db, "distributions:files.example/levy.csv files.example/levy.json") in keys


def test_a_dcat_record_pointing_elsewhere_claims_its_landing_page(db):
    raw = {"id": "https://aggregator.example/set/data/1", "url": "https://national.example/dataset/levy",
           "extras": [{"key": "dct:identifier", "value": ["8fda2162-dcd6-4fb3-9835-c85c046ff229", "LEVY-1"]},
                      {"key": "adms:identifier", "value": {"skos:notation": "https://registry.example/levy"}}]}
    kinds, keys = _keys(db, raw, portal="https://aggregator.example", url=raw["url"])
    assert ("landing_page", True) in kinds and ("identifier", False) in kinds and ("identifier", True) in kinds
    assert "content" not in {k for k, _ in kinds}  # no publisher: no content key
    assert _md5(db, "link:8fda2162-dcd6-4fb3-9835-c85c046ff229") in keys
    assert _md5(db, "link:registry.example/levy") in keys
    assert _md5(db, "link:aggregator.example/set/data/1") in keys
