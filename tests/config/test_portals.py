"""portals.yaml: the shipped files validate; bad entries are named with what would be valid."""
from datetime import timedelta
from pathlib import Path

import pytest

from harvester.config.portals import PortalConfigError, load_portals, parse_portals

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_portals_file_has_real_portals_disabled():
    portals = load_portals(ROOT / "dags" / "portals.yaml")
    assert len(portals) >= 5
    assert all(p.url.startswith("https://") and not p.enabled for p in portals)


def test_demo_config_expands_the_portal_url(monkeypatch):
    monkeypatch.setenv("HARVESTER_DEMO_PORTAL_URL", "http://127.0.0.1:9999")
    (demo,) = load_portals(ROOT / "dags" / "portals.demo.yaml")
    assert demo.url == "http://127.0.0.1:9999" and demo.enabled and demo.dag_id == "harvest_demo"
    monkeypatch.delenv("HARVESTER_DEMO_PORTAL_URL")
    assert load_portals(ROOT / "dags" / "portals.demo.yaml")[0].url == "http://127.0.0.1:8765"


def test_defaults():
    (p,) = parse_portals({"portals": [{"name": "x", "url": "https://x.org/"}]})
    assert p.url == "https://x.org" and p.lookback == timedelta(hours=2) and p.page_size == 1000
    assert p.reconcile_every == timedelta(hours=24) and p.full_sync_every is None
    assert p.schedule == "@daily" and p.enabled and p.politeness_delay == 0.2
    assert p.max_removal_share == 0.2 and p.significance.title == 0.3 and p.significance.review_threshold == 0.7


def test_dcat_types_and_their_defaults():
    json_portal, rdf_portal = parse_portals({"portals": [
        {"name": "ar", "url": "https://datos.gob.ar/data.json", "type": "dcat-json", "language": "es"},
        {"name": "ch", "url": "https://ckan.opendata.swiss/catalog.xml", "type": "dcat-rdf", "language": "fr"}]})
    assert (json_portal.type, json_portal.reconcile_every, json_portal.language_code) == ("dcat-json", None, "es")
    assert (rdf_portal.type, rdf_portal.language, rdf_portal.language_code) == ("dcat-rdf", "french", "fr")
    (ckan,) = parse_portals({"portals": [{"name": "x", "url": "https://x.org"}]})
    assert ckan.type == "ckan" and ckan.language_code is None


def test_a_data_json_may_be_held_to_the_federal_dcat_us_profile():
    from harvester.sources import source_for

    default, federal = parse_portals({"portals": [
        {"name": "a", "url": "https://a.gov/data.json", "type": "dcat-json"},
        {"name": "b", "url": "https://b.gov/data.json", "type": "dcat-json", "dcat_us_profile": "federal"}]})
    assert (default.dcat_us_profile, federal.dcat_us_profile) == ("non-federal", "federal")
    assert source_for(federal).schema_profile == "federal"
    with pytest.raises(PortalConfigError, match="dcat_us_profile 'state' must be one of non-federal, federal"):
        parse_portals({"portals": [{"name": "c", "url": "https://c.gov/data.json", "type": "dcat-json",
                                    "dcat_us_profile": "state"}]})
    with pytest.raises(PortalConfigError, match="dcat_us_profile applies to type dcat-json only"):
        parse_portals({"portals": [{"name": "d", "url": "https://d.gov", "dcat_us_profile": "federal"}]})


def test_a_sparql_endpoint_may_name_the_graph_its_datasets_are_read_from():
    default, named = parse_portals({"portals": [
        {"name": "a", "url": "https://data.europa.eu/sparql", "type": "dcat-sparql"},
        # (one endpoint, two portals: their urls differ, datasets being kept by portal url)
        {"name": "b", "url": "https://data.europa.eu/sparql#govdata", "type": "dcat-sparql",
         "graph": " https://data.europa.eu/88u/catalogue/govdata "}]})
    assert (default.graph, named.graph) == (None, "https://data.europa.eu/88u/catalogue/govdata")
    from harvester.sources import source_for

    src = source_for(named)
    assert (src.graph, src.url) == (named.graph, "https://data.europa.eu/sparql")  # the #name is never sent
    for bad in ("not an iri", "govdata", "https://x.org/g> } ?s ?p ?o {", 'https://x.org/"g', "https://x.org/\ng", 42):
        with pytest.raises(PortalConfigError, match=r"portals\[0\] \(c\): graph .* must be an absolute IRI without spaces"):
            parse_portals({"portals": [{"name": "c", "url": "https://c.org/sparql", "type": "dcat-sparql",
                                        "graph": bad}]})
    with pytest.raises(PortalConfigError, match="graph applies to type dcat-sparql only"):
        parse_portals({"portals": [{"name": "d", "url": "https://d.org/catalog.ttl", "type": "dcat-rdf",
                                    "graph": "https://d.org/g"}]})


def test_significance_overrides():
    (p,) = parse_portals({"portals": [{"name": "x", "url": "https://x.org", "significance": {
        "title": 0.5, "review_threshold": 0.5}}]})
    assert (p.significance.title, p.significance.review_threshold, p.significance.content) == (0.5, 0.5, 0.4)


@pytest.mark.parametrize("entry, message", [
    ({"name": "bad name", "url": "https://x.org"}, "portals[0] (bad name): name 'bad name' must be letters"),
    ({"name": "x", "url": "ftp://x.org"}, "portals[0] (x): url 'ftp://x.org' must be an http(s) URL"),
    ({"name": "x", "url": "https://x.org", "type": "dcat"},
     "type 'dcat' is not supported; valid types are: ckan, dcat-json, dcat-rdf"),
    ({"name": "x", "url": "https://x.org/data.json", "type": "dcat-json", "reconcile_every": "1d"},
     "portals[0] (x): reconcile_every applies to types ckan, arcgis-hub, socrata, csw, opendatasoft, iso-waf, udata, "
     "dcat-sparql, oai-pmh only: a dcat-json catalogue is read whole on every run"),
    ({"name": "x", "url": "https://x.org/catalog.ttl", "type": "dcat-rdf", "conn_id": "x_token"},
     "portals[0] (x): conn_id 'x_token' needs auth_header on a dcat-rdf portal: a catalogue of this kind has no "
     "standard header for a token; name the one it takes, e.g. auth_header: 'X-Api-Key'"),
    ({"name": "x", "url": "https://x.org", "page_size": 5000}, "page_size 5000 must be a whole number from 1 to 1000"),
    ({"name": "x", "url": "https://x.org", "lookback": "soon"}, "lookback 'soon' is not a duration"),
    ({"name": "x", "url": "https://x.org", "schedule": "@sometimes"}, "schedule '@sometimes' is not a preset"),
    ({"name": "x", "url": "https://x.org", "schedule": "61 * * * *"}, "schedule '61 * * * *' is not a valid cron"),
    ({"name": "x", "url": "https://x.org", "enabled": "yes"}, "enabled 'yes' must be true or false"),
    ({"name": "x", "url": "https://x.org", "shedule": "@daily"}, "unknown key(s) shedule; valid keys are:"),
    ({"name": "x", "url": "${NOT_SET_ANYWHERE_42}"}, "environment variable NOT_SET_ANYWHERE_42 is not set"),
    ({"name": "x", "url": "https://x.org", "significance": {"titel": 0.5}},
     "portals[0] (x): significance: unknown key(s) titel; valid keys are: content, date,"),
    ({"name": "x", "url": "https://x.org", "significance": {"title": 1.5}}, "title 1.5 must be a number from 0 to 1"),
    ({"name": "x", "url": "https://x.org", "max_removal_share": 2}, "max_removal_share 2 must be a number from 0 to 1"),
    ({"name": "x", "url": "https://x.org", "reconcile_every": "daily"},
     "portals[0] (x): reconcile_every 'daily' is not a duration; use seconds or a number with s, m, h or d, e.g. '1h'; "
     "or null / 'off' to switch it off"),
    ({"name": "x", "url": "https://x.org", "full_sync_every": 0},
     "portals[0] (x): full_sync_every 0 must be longer than zero; leave it out or use null to switch it off"),
    ({"name": "x", "url": "https://x.org", "full_sync_every": "-3d"}, "full_sync_every '-3d' is not a duration"),
])
def test_bad_entries_are_named(entry, message):
    good = {"name": "good", "url": "https://good.org"}
    with pytest.raises(PortalConfigError) as err:
        parse_portals({"portals": [entry, good]})
    assert message in str(err.value)
    assert "good" not in str(err.value).split("\n", 1)[1]


def test_duplicates_and_shape():
    with pytest.raises(PortalConfigError, match="name 'a' is used by another entry"):
        parse_portals({"portals": [{"name": "a", "url": "https://a.org"}, {"name": "a", "url": "https://b.org"}]})
    with pytest.raises(PortalConfigError, match="expected a top-level 'portals:' list"):
        parse_portals({"portal": []})


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(PortalConfigError, match="does not exist"):
        load_portals(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("portals: [\n")
    with pytest.raises(PortalConfigError, match="is not valid YAML"):
        load_portals(bad)


@pytest.mark.parametrize("value, expected", [
    ("6h", timedelta(hours=6)), (0, timedelta(0)), (None, None), ("off", None), ("never", None)])
def test_reconcile_every(value, expected):
    (p,) = parse_portals({"portals": [{"name": "x", "url": "https://x.org", "reconcile_every": value}]})
    assert p.reconcile_every == expected


@pytest.mark.parametrize("kind", ["ckan", "socrata", "opendatasoft", "arcgis-hub", "csw"])
def test_every_kind_that_reconciles_takes_reconcile_every(kind):
    default, set_, off = parse_portals({"portals": [
        {"name": "a", "url": "https://a.org", "type": kind},
        {"name": "b", "url": "https://b.org", "type": kind, "reconcile_every": "6h"},
        {"name": "c", "url": "https://c.org", "type": kind, "reconcile_every": "off"}]})
    assert (default.reconcile_every, set_.reconcile_every, off.reconcile_every) == (timedelta(hours=24),
                                                                                   timedelta(hours=6), None)
    with pytest.raises(PortalConfigError, match=r"portals\[0\] \(x\): reconcile_every 'daily' is not a duration"):
        parse_portals({"portals": [{"name": "x", "url": "https://x.org", "type": kind, "reconcile_every": "daily"}]})


@pytest.mark.parametrize("kind", ["dcat-json", "dcat-rdf"])
def test_a_kind_read_whole_every_run_refuses_reconcile_every(kind):
    (p,) = parse_portals({"portals": [{"name": "x", "url": "https://x.org/catalog", "type": kind}]})
    assert p.reconcile_every is None
    with pytest.raises(PortalConfigError, match=f"reconcile_every applies to types .* only: a {kind} catalogue"):
        parse_portals({"portals": [{"name": "x", "url": "https://x.org/catalog", "type": kind, "reconcile_every": "1d"}]})


def test_full_sync_every_and_shipped_lookback():
    (p,) = parse_portals({"portals": [{"name": "x", "url": "https://x.org", "full_sync_every": "30d"}]})
    assert p.full_sync_every == timedelta(days=30)
    shipped = (ROOT / "dags" / "portals.yaml").read_text()
    assert "lookback: 2h" in shipped and "lookback          overlap" in shipped
    assert all(p.lookback == timedelta(hours=2) for p in load_portals(ROOT / "dags" / "portals.yaml"))


# -- credentials -----------------------------------------------------------------------------------
@pytest.mark.parametrize("url, user, password", [
    ("https://harvest:s3cret-Pw@portal.example.org/data/", "harvest", "s3cret-Pw"),
    ("https://harvest:p%40ss%2Fw%3Ard@portal.example.org/data", "harvest", "p@ss/w:rd"),  # percent-encoded
    ("https://${T_CKAN_USER}:${T_CKAN_PASSWORD}@portal.example.org/data", "robot", "a/b@c:d?e#f%41"),  # verbatim
    ("https://robot:${T_CKAN_PASSWORD}@${T_CKAN_HOST}/data", "robot", "a/b@c:d?e#f%41"),
    ("${T_CKAN_WHOLE_URL}", "robot", "p@ss"),  # the whole url from a variable
])
def test_userinfo_is_taken_out_of_the_url(monkeypatch, url, user, password):
    monkeypatch.setenv("T_CKAN_USER", "robot")
    monkeypatch.setenv("T_CKAN_PASSWORD", "a/b@c:d?e#f%41")
    monkeypatch.setenv("T_CKAN_HOST", "portal.example.org")
    monkeypatch.setenv("T_CKAN_WHOLE_URL", "https://robot:p%40ss@portal.example.org/data")
    (p,) = parse_portals({"portals": [{"name": "x", "url": url}]})
    assert p.url == "https://portal.example.org/data"
    assert p.credentials == (user, password)
    assert password not in repr(p) and "credentials" not in repr(p)


def test_url_without_userinfo_has_no_credentials():
    (p,) = parse_portals({"portals": [{"name": "x", "url": "https://portal.example.org/data?x=a@b"}]})
    assert (p.url, p.credentials, p.conn_id) == ("https://portal.example.org/data?x=a@b", None, None)


@pytest.mark.parametrize("url", [
    "ftp://harvest:TopSecret9@x.org",           # a bad scheme, with a password
    "harvest:TopSecret9@x.org/data",            # no scheme at all
    "https://harvest:Top/Secret9@x.org/data",   # an unencoded / in the password: the host's port is bad
])
def test_url_errors_never_show_the_password(url):
    with pytest.raises(PortalConfigError) as err:
        parse_portals({"portals": [{"name": "x", "url": url}]})
    assert "portals[0] (x): url '" in str(err.value)
    assert "TopSecret9" not in str(err.value) and "Secret9" not in str(err.value)


def test_conn_id():
    (p,) = parse_portals({"portals": [{"name": "x", "url": "https://x.org", "conn_id": "ckan_x.org-token"}]})
    assert p.conn_id == "ckan_x.org-token"
    for bad in ("", "has space", 7):
        with pytest.raises(PortalConfigError, match=r"portals\[0\] \(x\): conn_id .* must name an Airflow connection"):
            parse_portals({"portals": [{"name": "x", "url": "https://x.org", "conn_id": bad}]})


def test_stale_after():
    def one(**extra):
        return parse_portals({"portals": [{"name": "x", "url": "https://p.org", **extra}]})[0]

    assert one().stale_after == timedelta(hours=2)
    assert one(stale_after="45m").stale_after == timedelta(minutes=45)
    with pytest.raises(PortalConfigError, match=r"portals\[0\] \(x\): stale_after '5m' must be at least 10m"):
        one(stale_after="5m")
    with pytest.raises(PortalConfigError, match=r"portals\[0\] \(x\): stale_after 'soon' is not a duration"):
        one(stale_after="soon")
