"""A secret never rides in a portal's url (issue 35): portals.yaml refuses a url with a query or
fragment parameter named like a secret, written or from ${VAR}, naming the portal and the
parameter (never its value) and saying where the secret goes instead: an Airflow connection named
by conn_id, whose token every kind of portal sends in its platform's header (auth_header for DCAT
catalogues and CSW services). Each kind is checked against its local server over real HTTP: the
server receives the token in that header, and only there."""
from __future__ import annotations

import json

import pytest

from harvester.config.portals import AUTH_HEADERS, PortalConfigError, parse_portals
from harvester.sources import Listing

SECRET = "Tok3n-of-the-p0rtal-6b1f0e"


def connection(monkeypatch, conn_id: str, **fields) -> None:
    """An Airflow connection, defined the way Airflow reads them from the environment."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "generic", **fields}))


def one(**entry):
    (portal,) = parse_portals({"portals": [{"name": "city", "url": "https://data.city.example.org", **entry}]})
    return portal


def refused(**entry) -> str:
    with pytest.raises(PortalConfigError) as info:
        one(**entry)
    return str(info.value)


# -- the url -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("url, parameter", [
    (f"https://data.city.example.org/?api_key={SECRET}", "api_key"),
    (f"https://data.city.example.org/api?q=water&apiKey={SECRET}", "apiKey"),
    (f"https://data.city.example.org/api?format=json;access_token={SECRET}", "access_token"),
    (f"https://data.city.example.org/catalog#token={SECRET}", "token"),
    (f"https://data.city.example.org/csw?service=CSW&X-Amz-Signature={SECRET}", "X-Amz-Signature"),
    (f"https://data.city.example.org/?api%5Fkey={SECRET}", "api%5Fkey"),  # what the server reads as api_key
    ("https://data.city.example.org/?api_key=${T_PORTAL_SECRET}", "api_key"),  # refused before it is expanded
    ("${T_PORTAL_WHOLE_URL}", "app_token"),  # ...and after
])
def test_a_url_with_a_secret_parameter_is_refused_naming_the_portal_and_parameter(monkeypatch, url, parameter):
    monkeypatch.setenv("T_PORTAL_SECRET", SECRET)
    monkeypatch.setenv("T_PORTAL_WHOLE_URL", f"https://data.city.example.org/?app_token={SECRET}")
    message = refused(url=url, type="socrata")
    assert SECRET not in message
    assert message.startswith(f"portals.yaml is not valid:\n  portals[0] (city): url has a secret in it: its parameter "
                              f"{parameter!r} (value not shown) is named like one")
    assert (f"Take {parameter}=... out of the url and put the Socrata app token in an Airflow connection named by "
            "the portal's conn_id, as its password (e.g. conn_id: city_token and AIRFLOW_CONN_CITY_TOKEN="
            "'{\"conn_type\": \"generic\", \"password\": \"<token>\"}'); Harvester sends it in the X-App-Token "
            "header") in message


def test_the_fix_names_each_kinds_header():
    url = f"https://data.city.example.org/x?key={SECRET}"
    assert refused(url=url).endswith("put the CKAN API token in an Airflow connection named by the portal's conn_id, "
                                     "as its password (e.g. conn_id: city_token and AIRFLOW_CONN_CITY_TOKEN="
                                     "'{\"conn_type\": \"generic\", \"password\": \"<token>\"}'); Harvester sends it "
                                     "in the Authorization header")
    assert refused(url=url, type="opendatasoft").endswith(
        "Harvester sends it in the Authorization header (Authorization: Apikey <token>)")
    assert refused(url=url, type="arcgis-hub").endswith(
        "Harvester sends it in the X-Esri-Authorization header (X-Esri-Authorization: Bearer <token>)")
    for kind in ("dcat-json", "dcat-rdf", "csw"):
        assert refused(url=url, type=kind).endswith(
            "Harvester sends it in the header its auth_header names (e.g. auth_header: 'X-Api-Key')")


@pytest.mark.parametrize("url", [
    "https://data.city.example.org/catalog?format=rdf&page=1",
    "https://data.city.example.org/csw?service=CSW&version=2.0.2",
    "https://data.city.example.org/?token",  # a name without a value carries nothing
])
def test_a_url_with_other_parameters_is_kept_as_it_is(url):
    assert one(url=url).url == url


# -- auth_header -------------------------------------------------------------------------------------
def test_every_kind_takes_a_conn_id_and_sends_its_token_in_its_platforms_header():
    assert one(conn_id="c").auth_header == ("Authorization", "{token}")
    assert one(conn_id="c", type="socrata").auth_header == ("X-App-Token", "{token}")
    assert one(conn_id="c", type="opendatasoft").auth_header == ("Authorization", "Apikey {token}")
    assert one(conn_id="c", type="arcgis-hub").auth_header == ("X-Esri-Authorization", "Bearer {token}")
    assert one(conn_id="c", type="arcgis-hub", auth_header="Authorization: Bearer {token}").auth_header == \
        ("Authorization", "Bearer {token}")  # an ArcGIS Server without web-tier authentication
    assert one(conn_id="c", type="csw", auth_header="X-Api-Key").auth_header == ("X-Api-Key", "{token}")
    assert one(conn_id="c", type="dcat-json", auth_header=" Authorization :  Token {token} ").auth_header == \
        ("Authorization", "Token {token}")
    assert one().auth_header is None and one(type="socrata").auth_header is None


@pytest.mark.parametrize("entry, message", [
    ({"type": "csw", "conn_id": "c"},
     "portals[0] (city): conn_id 'c' needs auth_header on a csw portal: a catalogue of this kind has no standard "
     "header for a token; name the one it takes, e.g. auth_header: 'X-Api-Key' (the token as it is) or "
     "auth_header: 'Authorization: Bearer {token}'"),
    ({"type": "dcat-json", "auth_header": "X-Api-Key"},
     "portals[0] (city): auth_header says how the token of conn_id is sent: add conn_id, the Airflow connection "
     "holding the token (as its password)"),
    ({"conn_id": "c", "auth_header": "X-Api-Key"},
     "portals[0] (city): auth_header does not apply to type ckan: CKAN takes its API token in the Authorization "
     "header as it is; leave auth_header out"),
    ({"type": "csw", "conn_id": "c", "auth_header": ""},
     "portals[0] (city): auth_header must be a header name, or 'Name: value' with {token} in the value, e.g. "
     "'X-Api-Key' or 'Authorization: Bearer {token}'"),
    ({"type": "csw", "conn_id": "c", "auth_header": f"Authorization Bearer {SECRET}"},
     "portals[0] (city): auth_header does not start with a header name (letters, digits and !#$%&'*+-.^_`|~, "
     "no spaces: a token of RFC 9110), followed by ':' and the value if any"),
    ({"type": "csw", "conn_id": "c", "auth_header": f"Authorization: Bearer {SECRET}"},
     "portals[0] (city): auth_header Authorization: its value must hold {token} once, where the token of conn_id "
     "goes, and no other braces (the secret itself belongs in the connection)"),
    ({"type": "csw", "conn_id": "c", "auth_header": "X-Key: {token}{token}"}, "its value must hold {token} once"),
    ({"type": "csw", "conn_id": "c", "auth_header": "X-Key: {token} {user}"}, "and no other braces"),
    ({"type": "csw", "conn_id": "c", "auth_header": "X-Key: {token}\r\nX-Other: 1"},
     "portals[0] (city): auth_header X-Key: its value may hold visible ASCII characters and spaces only (no line "
     "break, no control character)"),
])
def test_a_bad_auth_header_is_named_without_repeating_its_value(entry, message):
    text = refused(**entry)
    assert message in text
    assert SECRET not in text


# -- the token -----------------------------------------------------------------------------------------
def test_the_header_carries_the_connections_token(monkeypatch):
    from harvester.config.credentials import auth_header

    connection(monkeypatch, "city_token", password=SECRET)
    assert auth_header(one(type="socrata")) is None
    assert auth_header(one(type="socrata", conn_id="city_token")) == ("X-App-Token", SECRET)
    assert auth_header(one(type="opendatasoft", conn_id="city_token")) == ("Authorization", f"Apikey {SECRET}")
    assert auth_header(one(type="arcgis-hub", conn_id="city_token")) == ("X-Esri-Authorization", f"Bearer {SECRET}")
    assert auth_header(one(type="csw", conn_id="city_token", auth_header="X-Api-Key")) == ("X-Api-Key", SECRET)
    assert auth_header(one(conn_id="city_token")) == ("Authorization", SECRET)


def test_a_missing_connection_names_what_each_platform_calls_its_secret(monkeypatch):
    from harvester.config.credentials import CredentialsError, auth_header

    with pytest.raises(CredentialsError) as info:
        auth_header(one(type="opendatasoft", conn_id="city_nowhere"))
    assert str(info.value).startswith("portal city: conn_id 'city_nowhere': there is no Airflow connection "
                                      "'city_nowhere'; create it with the portal's OpenDataSoft API key as its "
                                      "password (or as extra api_key), e.g. AIRFLOW_CONN_CITY_NOWHERE=")


def test_a_token_a_header_cannot_carry_is_refused_without_showing_it(monkeypatch):
    from harvester.config.credentials import CredentialsError, auth_header

    connection(monkeypatch, "city_broken", password=f"{SECRET}\r\nX-Injected: 1")
    with pytest.raises(CredentialsError) as info:
        auth_header(one(type="socrata", conn_id="city_broken"))
    assert str(info.value) == (
        "portal city: conn_id 'city_broken': the token in the Airflow connection holds a character an HTTP header "
        f"cannot carry (a line break, a control or non-ASCII character, at position {len(SECRET) + 1} of "
        f"{len(SECRET) + 15}); store the token alone, as the portal issued it")


# -- each kind's own server, over real HTTP ---------------------------------------------------------------
def recording(server_class):
    """``server_class`` (a local portal server) remembering the headers of every GET in ``seen``, and
    its path and query as ``:path``."""

    class Recording(server_class):
        def __init__(self, *args, **kwargs):
            self.seen: list[dict] = []
            super().__init__(*args, **kwargs)

        def _handler(self):
            base, server = super()._handler(), self

            class Handler(base):
                def do_GET(self):
                    server.seen.append({":path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
                    super().do_GET()

            return Handler

    return Recording


DATA_JSON = json.dumps({"conformsTo": "https://project-open-data.cio.gov/v1.1/schema", "dataset": [
    {"identifier": "water-1", "title": "Water quality", "description": "Samples.", "modified": "2024-05-01",
     "keyword": ["water"], "publisher": {"name": "City"}, "contactPoint": {"fn": "Data", "hasEmail": "mailto:d@x.org"},
     "accessLevel": "public", "bureauCode": ["000:00"], "programCode": ["000:000"]}]}).encode()
TURTLE = b"""@prefix dcat: <http://www.w3.org/ns/dcat#> . @prefix dct: <http://purl.org/dc/terms/> .
<https://data.city.example.org/catalog> a dcat:Catalog ; dcat:dataset <https://data.city.example.org/d/1> .
<https://data.city.example.org/d/1> a dcat:Dataset ; dct:identifier "d1" ; dct:title "Water quality"@en ;
  dct:description "Samples."@en ; dct:modified "2024-05-01" .
"""


def _servers():
    from harvester.testing.arcgis_hub_portal import ArcGisHubServer
    from harvester.testing.csw_portal import CswServer
    from harvester.testing.dcat_portal import DcatServer
    from harvester.testing.opendatasoft_portal import OpenDataSoftPortal
    from harvester.testing.socrata_portal import SocrataServer
    from harvester.testing.udata_portal import UdataPortal

    return {"udata": recording(UdataPortal), "socrata": recording(SocrataServer), "opendatasoft": recording(OpenDataSoftPortal),
            "arcgis-hub": recording(ArcGisHubServer), "csw": recording(CswServer),
            "dcat-json": recording(DcatServer), "dcat-rdf": recording(DcatServer)}


@pytest.mark.parametrize("kind, auth_header, sent", [
    ("socrata", None, ("x-app-token", SECRET)),
    ("opendatasoft", None, ("authorization", f"Apikey {SECRET}")),
    ("arcgis-hub", None, ("x-esri-authorization", f"Bearer {SECRET}")),
    ("csw", "X-Api-Key", ("x-api-key", SECRET)),
    ("dcat-json", "Authorization: Bearer {token}", ("authorization", f"Bearer {SECRET}")),
    ("dcat-rdf", "X-Catalogue-Key", ("x-catalogue-key", SECRET)),
    ("udata", None, ("x-api-key", SECRET)),
])
def test_each_kinds_server_receives_the_token_in_its_header(monkeypatch, caplog, kind, auth_header, sent):
    from harvester.sources import source_for

    caplog.set_level("DEBUG")
    connection(monkeypatch, "city_token", password=SECRET)
    with _servers()[kind]() as server:
        url = server.base_url
        if kind == "dcat-json":
            server.set_document("/data.json", DATA_JSON)
            url = server.url("/data.json")
        elif kind == "dcat-rdf":
            server.set_document("/catalog.ttl", TURTLE, "text/turtle")
            url = server.url("/catalog.ttl")
        elif kind in ("csw", "arcgis-hub"):
            url = server.url
        entry = {"type": kind, "conn_id": "city_token", **({"auth_header": auth_header} if auth_header else {})}
        (portal,) = parse_portals({"portals": [{"name": "city", "url": url, "politeness_delay": 0, **entry}]})
        source = source_for(portal)
        if kind.startswith("dcat"):
            pages = list(source.iter_records(None, 100, Listing()))
            assert sum(len(page) for page in pages) == 1
        else:
            source.count()
        assert server.seen, "no request reached the server"
        name, value = sent
        assert [h.get(name) for h in server.seen] == [value] * len(server.seen)
        # only there: not in a path or query the server was asked, nor in a log line
        assert [v for h in server.seen for k, v in h.items() if k != name and SECRET in v] == []
    assert SECRET not in caplog.text
    assert set(AUTH_HEADERS) == {"ckan", "socrata", "opendatasoft", "arcgis-hub", "udata"}


def test_a_token_takes_the_place_of_a_user_and_password_for_every_kind(monkeypatch, caplog):
    from harvester.sources import source_for
    from harvester.testing.socrata_portal import SocrataServer

    connection(monkeypatch, "city_token", password=SECRET)
    with recording(SocrataServer)() as server:
        host = server.base_url.removeprefix("http://")
        (portal,) = parse_portals({"portals": [{"name": "city", "url": f"http://robot:Pw-0a9b@{host}",
                                                "type": "socrata", "conn_id": "city_token"}]})
        source_for(portal).count()
    assert [(h.get("x-app-token"), h.get("authorization")) for h in server.seen] == [(SECRET, None)] * len(server.seen)
    assert "city: a token is given (conn_id), so the user:password for the portal is not used" in caplog.text
