"""Portals we harvest: the portals.yaml schema, validated when loaded.

Every problem names the entry it is in and says what would be valid; a bad value never falls
back silently to a default.

Credentials: a user:password in the url (literal or from ``${VAR}``) is taken out of it:
``Portal.url`` (the DAG's description, every ``portal_url`` column, logs) never has it, and
``Portal.credentials`` (left out of ``repr``) only reaches the portal's HTTP client, as HTTP Basic
auth. A url with a query or fragment parameter named like a secret (``api_key=``, ``token=``...:
config/secrets.py ``secret_parameters``), literal or from ``${VAR}``, is refused: a portal's url is
shown and stored everywhere. Such a secret belongs in the Airflow connection ``conn_id`` names
(credentials.py looks it up), sent in the header ``Portal.auth_header`` says: each platform's
documented one (``AUTH_HEADERS``), or the ``auth_header:`` of the entry (DCAT catalogues, CSW).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from harvester.config.notify import parse_notify
from harvester.config.secrets import ENV_REFERENCE, conn_env, expand_env, redact_url, secret_parameters
from harvester.config.settings import env_value
from harvester.domain.changes import DEFAULT as DEFAULT_SIGNIFICANCE
from harvester.domain.changes import SignificanceConfig
from harvester.domain.run import DEFAULT_STALE_AFTER

DEFAULT_PORTALS_FILE = Path(__file__).resolve().parents[3] / "dags" / "portals.yaml"
# The kinds of portal (``type:``), each read by its module in sources/: ckan: the CKAN Action API;
# dcat-json: a DCAT-US / DCAT-AR data.json catalogue; dcat-rdf: a DCAT-AP catalogue in RDF; and the native
# APIs of Socrata, OpenDataSoft, ArcGIS Hub and OGC CSW catalogues; ISO 19139 files in a Web Accessible
# Folder; udata's REST API; DCAT over SPARQL; STAC; SDMX REST structure queries; OAI-PMH.
CKAN, DCAT_JSON, DCAT_RDF = "ckan", "dcat-json", "dcat-rdf"
ARCGIS_HUB = "arcgis-hub"  # an ArcGIS Hub site's OGC API Records search
SOCRATA = "socrata"  # a Socrata portal's Discovery API (api/catalog/v1)
CSW = "csw"  # an OGC CSW 2.0.2 catalogue (GetRecords, ISO 19139 / Dublin Core)
OPENDATASOFT = "opendatasoft"  # an OpenDataSoft portal's Explore API v2.1 catalogue
ISO_WAF = "iso-waf"  # a Web Accessible Folder of ISO 19139 / 19115-2 files (data.gov's "waf")
UDATA = "udata"  # a udata portal's REST API v1 (data.gouv.fr, data.public.lu)
DCAT_SPARQL = "dcat-sparql"  # DCAT datasets read from a SPARQL endpoint (data.europa.eu, piveau)
STAC = "stac"  # a STAC API's /collections, or a static STAC catalog
SDMX = "sdmx"  # an SDMX REST service's dataflows (structure queries)
OAI_PMH = "oai-pmh"  # an OAI-PMH 2.0 repository (ListRecords)
PORTAL_TYPES = (CKAN, DCAT_JSON, DCAT_RDF, ARCGIS_HUB, SOCRATA, CSW, OPENDATASOFT, ISO_WAF, UDATA, DCAT_SPARQL, STAC,
                SDMX, OAI_PMH)
# The kinds `harvester validate` (and the validation API) reads: a document or a URL of each.
VALIDATE_TYPES = (DCAT_JSON, DCAT_RDF, CKAN, ISO_WAF, UDATA, DCAT_SPARQL, STAC, SDMX, OAI_PMH)
# The kinds that list identifiers apart and can be reconciled (their Capabilities say ``reconcile``;
# sources/__init__.py checks that the two agree): only they take ``reconcile_every``.
RECONCILE_TYPES = (CKAN, ARCGIS_HUB, SOCRATA, CSW, OPENDATASOFT, ISO_WAF, UDATA, DCAT_SPARQL, OAI_PMH)
SCHEDULE_PRESETS = ("@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")
_KEYS = {"name", "url", "conn_id", "auth_header", "type", "schedule", "enabled", "lookback", "page_size",
         "politeness_delay", "max_retries", "timeout", "max_removal_share", "significance", "description",
         "reconcile_every", "full_sync_every", "stale_after", "notify", "language", "dcat_us_profile", "graph",
         "oai_metadata_prefix", "oai_set"}
# The DCAT-US 1.1 dataset schemas a data.json may be held to (its conformsTo names 1.1): federal
# catalogues must also give bureauCode and programCode.
DCAT_US_PROFILES = ("non-federal", "federal")
# The lookback must outlast the portal's indexing lag: in the real data.gc.ca snapshots changes
# appeared up to 85 minutes behind, so one hour misses some and two hours catches all.
DEFAULT_LOOKBACK = timedelta(hours=2)
DEFAULT_RECONCILE_EVERY = timedelta(hours=24)
MIN_STALE_AFTER = timedelta(minutes=10)
# A portal's `language:`: a PostgreSQL text-search configuration shipped with every server (full
# text search stems with it), or a two-letter code for one; "simple" (no stemming) by default.
TEXT_SEARCH_CONFIGS = ("simple", "arabic", "armenian", "basque", "catalan", "danish", "dutch", "english",
                       "finnish", "french", "german", "greek", "hindi", "hungarian", "indonesian", "irish",
                       "italian", "lithuanian", "nepali", "norwegian", "portuguese", "romanian", "russian",
                       "serbian", "spanish", "swedish", "tamil", "turkish", "yiddish")
LANGUAGE_CODES = {"ar": "arabic", "hy": "armenian", "eu": "basque", "ca": "catalan", "da": "danish", "nl": "dutch",
                  "en": "english", "fi": "finnish", "fr": "french", "de": "german", "el": "greek", "hi": "hindi",
                  "hu": "hungarian", "id": "indonesian", "ga": "irish", "it": "italian", "lt": "lithuanian",
                  "ne": "nepali", "no": "norwegian", "nb": "norwegian", "pt": "portuguese", "ro": "romanian",
                  "ru": "russian", "sr": "serbian", "es": "spanish", "sv": "swedish", "ta": "tamil", "tr": "turkish",
                  "yi": "yiddish"}
_OFF = ("off", "never", "none")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]*$")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_CONN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,250}$")  # what Airflow accepts as a connection id
# How a portal's token (the password of its conn_id's connection) is sent: (header name, value with
# {token} where the token goes), each platform's documented header. CKAN: an API token as the
# Authorization header, as it is; Socrata: an app token (dev.socrata.com/docs/app-tokens);
# OpenDataSoft: an API key (Explore API v2.1); ArcGIS: an access token, X-Esri-Authorization
# (developers.arcgis.com, "HTTP authorization headers"). DCAT catalogues and CSW services have no
# standard one: their entry says it (auth_header).
AUTH_HEADERS = {
    CKAN: ("Authorization", "{token}"),
    SOCRATA: ("X-App-Token", "{token}"),
    OPENDATASOFT: ("Authorization", "Apikey {token}"),
    ARCGIS_HUB: ("X-Esri-Authorization", "Bearer {token}"),
    UDATA: ("X-API-KEY", "{token}"),  # udata's API key (doc.data.gouv.fr, "Authentification")
}
# What each platform calls the secret a connection holds for it (messages).
TOKEN_NAMES = {CKAN: "CKAN API token", SOCRATA: "Socrata app token", OPENDATASOFT: "OpenDataSoft API key",
               ARCGIS_HUB: "ArcGIS access token", UDATA: "udata API key"}
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # a field name is a token (RFC 9110 5.1, 5.6.2)
_HEADER_VALUE = re.compile(r"^[\x20-\x7e]*$")  # visible ASCII and spaces: no line break, no control character
# dcat-sparql's `graph:`: an absolute IRI as SPARQL's IRIREF takes it (a scheme, then no space, control
# character or any of <>"{}|^`\), so that it goes into the query as <...> and can end nothing early.
_GRAPH_IRI = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*:[^\x00-\x20<>"{}|^`\\\x7f]+$')


class PortalConfigError(ValueError):
    """portals.yaml is not valid; the message names every bad entry. Terminal (domain/errors.py)."""

    transient = False


@dataclass(frozen=True)
class Portal:
    name: str
    url: str
    type: str = CKAN
    schedule: str | None = "@daily"
    enabled: bool = True
    lookback: timedelta = DEFAULT_LOOKBACK
    page_size: int = 1000
    politeness_delay: float = 0.2
    max_retries: int = 5
    timeout: float = 60.0
    max_removal_share: float = 0.2
    significance: SignificanceConfig = DEFAULT_SIGNIFICANCE
    description: str = ""
    # A run reconciles (lists every identifier and compares) when the last one that listed the
    # whole portal is older than this; zero: every run; None: only when asked or when counts disagree.
    reconcile_every: timedelta | None = DEFAULT_RECONCILE_EVERY
    # A run is a full sync when the last full sync is older than this; None (default): never by age.
    full_sync_every: timedelta | None = None
    # A run of this portal with no progress for this long is abandoned by the next run (its worker
    # died); longer than any task's timeout.
    stale_after: timedelta = DEFAULT_STALE_AFTER
    # The Airflow connection whose password (or extra api_key) is the portal's token (credentials.py).
    conn_id: str | None = None
    # With conn_id: (header name, value template with {token}) the token is sent in (AUTH_HEADERS,
    # or the entry's auth_header); None without conn_id.
    auth_header: tuple[str, str] | None = None
    # (user, password) taken out of the url: only for the CKAN client, never shown or stored.
    credentials: tuple[str, str] | None = field(default=None, repr=False)
    # Where failed, degraded and needs-review runs are announced (harvester.config.notify.NotifyTarget).
    notify: tuple = ()
    # The text-search configuration its datasets are indexed with (`language:`; search.py).
    language: str = "simple"
    # dcat-json only: which DCAT-US 1.1 dataset schema its records are validated against.
    dcat_us_profile: str = "non-federal"
    # dcat-sparql only: the named graph (an IRI) its datasets are read from; None: the endpoint's
    # default graph (on Virtuoso, the union of every graph).
    graph: str | None = None
    # oai-pmh only: the metadataPrefix records are asked in (OAI_METADATA_PREFIXES) and the set
    # (a setSpec) the harvest is limited to; None: the whole repository.
    oai_metadata_prefix: str = "oai_dc"
    oai_set: str | None = None

    @property
    def language_code(self) -> str | None:
        """The two-letter code of ``language`` (``de`` for german); None for ``simple``."""
        return next((code for code, name in LANGUAGE_CODES.items() if name == self.language), None)

    @property
    def dag_id(self) -> str:
        return f"harvest_{self.name}"


def portals_file() -> Path:
    return env_value("HARVESTER_PORTALS_FILE") or DEFAULT_PORTALS_FILE


def parse_duration(value: Any) -> timedelta:
    """A lookback: whole seconds, or a number with s, m, h or d ("90m", "1h", "2d")."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int):
        seconds = value
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration; use seconds or a number with s, m, h or d, e.g. '1h'")
        seconds = int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    if seconds < 0:
        raise ValueError(f"{value!r} is negative")
    return timedelta(seconds=seconds)


def _optional_duration(entry: dict, key: str, default: timedelta | None, *, zero_ok: bool) -> timedelta | None:
    """A duration setting that may be switched off with null or 'off'."""
    if key not in entry:
        return default
    value = entry[key]
    if value is None or (isinstance(value, str) and value.strip().lower() in _OFF):
        return None
    try:
        duration = parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"{key} {exc}; or null / 'off' to switch it off") from None
    if not zero_ok and not duration:
        raise ValueError(f"{key} {value!r} must be longer than zero; leave it out or use null to switch it off")
    return duration


def split_url(raw: str) -> tuple[str, tuple[str, str] | None]:
    """A portals.yaml url, ``${VAR}`` expanded, as (the url without user:password, (user,
    password) or None). The userinfo is found before expanding, so a password from a variable
    may hold any character; literal ones are percent-decoded."""
    masked = ENV_REFERENCE.sub(lambda m: "\0" * len(m.group(0)), raw)  # same length: indexes match
    credentials = None
    start = masked.find("://") + 3
    if start >= 3:
        end = min([i for i in (masked.find(c, start) for c in "/?#") if i >= 0] or [len(masked)])
        at = masked.rfind("@", start, end)
        if at >= 0:
            colon = masked.find(":", start, at)
            user, password = (raw[start:colon], raw[colon + 1:at]) if colon >= 0 else (raw[start:at], "")
            # literal text percent-decoded, ${VAR} values as they are
            credentials = (expand_env(user, literal=unquote), expand_env(password, literal=unquote))
            raw = raw[:start] + raw[at + 1:]
    url = expand_env(raw)
    parts = urlsplit(url)
    if "@" in parts.netloc:  # the userinfo came from a variable (e.g. url: ${PORTAL_URL})
        if credentials is not None:
            raise ValueError(f"url {redact_url(url)!r} has a user:password twice")
        userinfo, _, host = parts.netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        credentials = (unquote(user), unquote(password))
        url = urlunsplit(parts._replace(netloc=host))
    return url, credentials if credentials and any(credentials) else None


def _check_schedule(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"schedule {value!r} must be a cron expression, a preset like '@daily', or null")
    value = value.strip()
    if value.startswith("@"):
        if value not in SCHEDULE_PRESETS:
            raise ValueError(f"schedule {value!r} is not a preset; valid presets are: {', '.join(SCHEDULE_PRESETS)}")
        return value
    from croniter import croniter

    if not croniter.is_valid(value):
        raise ValueError(f"schedule {value!r} is not a valid cron expression")
    return value


def _portal(entry: Any) -> Portal:
    if not isinstance(entry, dict):
        raise ValueError(f"must be a mapping with name and url, got {type(entry).__name__}")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; valid keys are: {', '.join(sorted(_KEYS))}")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"name {name!r} must be letters, digits and underscores (it becomes the DAG id harvest_<name>)")
    url = entry.get("url")
    if not isinstance(url, str) or not url.strip():
        raise ValueError("url is missing")
    kind = entry.get("type", CKAN)
    _refuse_url_secret(url, kind, name)  # as written (${VAR} unexpanded): whatever the environment holds
    url, credentials = split_url(url.strip())
    _refuse_url_secret(url, kind, name)  # and as expanded (url: ${PORTAL_URL})
    url = url.rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  raises ValueError for a port that is not a number
    except ValueError:
        raise ValueError(f"url {redact_url(url)!r} is not a valid URL (bad host or port; a password with / ? # "
                         "or @ in it must be percent-encoded, or come from ${VAR})") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"url {redact_url(url)!r} must be an http(s) URL of the portal's root, "
                         "e.g. https://open.canada.ca/data")
    conn_id = entry.get("conn_id")
    if conn_id is not None and (not isinstance(conn_id, str) or not _CONN_ID.match(conn_id)):
        raise ValueError(f"conn_id {conn_id!r} must name an Airflow connection (letters, digits, _ . -)")
    if kind not in PORTAL_TYPES:
        raise ValueError(f"type {kind!r} is not supported; valid types are: {', '.join(PORTAL_TYPES)}")
    enabled = entry.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled {enabled!r} must be true or false")
    page_size = entry.get("page_size", 1000)
    if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= 1000:
        raise ValueError(f"page_size {page_size!r} must be a whole number from 1 to 1000 (CKAN's maximum rows)")
    delay = entry.get("politeness_delay", 0.2)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise ValueError(f"politeness_delay {delay!r} must be a number of seconds >= 0")
    retries = entry.get("max_retries", 5)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 20:
        raise ValueError(f"max_retries {retries!r} must be a whole number from 0 to 20")
    timeout = entry.get("timeout", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout {timeout!r} must be a number of seconds > 0")
    share = entry.get("max_removal_share", 0.2)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        raise ValueError(f"max_removal_share {share!r} must be a number from 0 to 1 (the share of a portal's "
                         "datasets one full sync may remove)")
    significance = SignificanceConfig.from_mapping(entry["significance"]) if "significance" in entry \
        else DEFAULT_SIGNIFICANCE
    try:
        lookback = parse_duration(entry["lookback"]) if "lookback" in entry else DEFAULT_LOOKBACK
    except ValueError as exc:
        raise ValueError(f"lookback {exc}") from None
    if kind not in RECONCILE_TYPES and entry.get("reconcile_every") is not None:
        # A DCAT catalogue is one document (or one paged listing): every run reads it whole.
        raise ValueError(f"reconcile_every applies to types {', '.join(RECONCILE_TYPES)} only: a {kind} catalogue "
                         f"is read whole on every run (removals are found every run)")
    auth_header = _auth_header(entry, kind, conn_id)
    profile = entry.get("dcat_us_profile")
    if profile is not None and kind != DCAT_JSON:
        raise ValueError(f"dcat_us_profile applies to type {DCAT_JSON} only (the DCAT-US schema of a data.json)")
    if profile is not None and profile not in DCAT_US_PROFILES:
        raise ValueError(f"dcat_us_profile {profile!r} must be one of {', '.join(DCAT_US_PROFILES)}")
    graph = _graph(entry, kind)
    oai_prefix, oai_set = _oai(entry, kind)
    reconcile_every = _optional_duration(entry, "reconcile_every",
                                         DEFAULT_RECONCILE_EVERY if kind in RECONCILE_TYPES else None, zero_ok=True)
    full_sync_every = _optional_duration(entry, "full_sync_every", None, zero_ok=False)
    try:
        stale_after = parse_duration(entry["stale_after"]) if "stale_after" in entry else DEFAULT_STALE_AFTER
    except ValueError as exc:
        raise ValueError(f"stale_after {exc}") from None
    if stale_after < MIN_STALE_AFTER:
        raise ValueError(f"stale_after {entry['stale_after']!r} must be at least {MIN_STALE_AFTER.seconds // 60}m "
                         "(longer than any task of the run takes between two signs of life)")
    return Portal(
        name=name, url=url, conn_id=conn_id, auth_header=auth_header, credentials=credentials, type=kind,
        schedule=_check_schedule(entry.get("schedule", "@daily")),
        enabled=enabled, lookback=lookback, page_size=page_size, politeness_delay=float(delay),
        max_retries=retries, timeout=float(timeout), max_removal_share=float(share), significance=significance,
        description=str(entry.get("description") or ""),
        reconcile_every=reconcile_every, full_sync_every=full_sync_every, stale_after=stale_after,
        notify=_notify(entry), language=_language(entry), dcat_us_profile=profile or "non-federal", graph=graph,
        oai_metadata_prefix=oai_prefix, oai_set=oai_set,
    )


def _graph(entry: dict, kind: str) -> str | None:
    """dcat-sparql's ``graph:``, the named graph whose datasets are read: an absolute IRI (None: the
    endpoint's default graph). It is written into every query as ``GRAPH <iri>``, so anything that
    could end the IRI early is refused, not escaped."""
    if "graph" not in entry or entry["graph"] is None:
        return None
    value = entry["graph"]
    if kind != DCAT_SPARQL:
        raise ValueError(f"graph applies to type {DCAT_SPARQL} only (the named graph a SPARQL endpoint's datasets are "
                         "read from)")
    if not isinstance(value, str) or not _GRAPH_IRI.match(value.strip()):
        raise ValueError(f"graph {str(value)[:200]!r} must be an absolute IRI without spaces or any of <>\"{{}}|^`\\, "
                         "e.g. graph: 'https://data.europa.eu/88u/catalogue/govdata'")
    return value.strip()


# The metadata formats an oai-pmh portal's records may be asked in (sources/oai_pmh.py maps each):
# Dublin Core (every repository must offer it) and DataCite's kernel, bare (Zenodo's ``datacite``)
# or wrapped (``oai_datacite``).
OAI_METADATA_PREFIXES = ("oai_dc", "datacite", "oai_datacite")
# OAI-PMH 2.0 section 4.2: a setSpec is colon-separated parts of URI unreserved characters.
_OAI_SET = re.compile(r"[A-Za-z0-9_.!~*'()-]+(:[A-Za-z0-9_.!~*'()-]+)*")


def _oai(entry: dict, kind: str) -> tuple[str, str | None]:
    """oai-pmh's ``oai_metadata_prefix:`` (default oai_dc) and ``oai_set:`` (a setSpec), refused for
    other kinds."""
    prefix, oai_set = entry.get("oai_metadata_prefix"), entry.get("oai_set")
    for key, value in (("oai_metadata_prefix", prefix), ("oai_set", oai_set)):
        if value is not None and kind != OAI_PMH:
            raise ValueError(f"{key} applies to type {OAI_PMH} only (the ListRecords argument of an OAI-PMH "
                             "repository)")
    if prefix is not None and prefix not in OAI_METADATA_PREFIXES:
        raise ValueError(f"oai_metadata_prefix {str(prefix)[:100]!r} must be one of "
                         f"{', '.join(OAI_METADATA_PREFIXES)}")
    if oai_set is not None and (not isinstance(oai_set, str) or not _OAI_SET.fullmatch(oai_set)):
        raise ValueError(f"oai_set {str(oai_set)[:100]!r} must be a setSpec: letters, digits and -_.!~*'() in parts "
                         "separated by colons, e.g. oai_set: 'user-biosyslit'")
    return prefix or "oai_dc", oai_set


def _token_header(kind: str) -> str:
    """Where a portal of ``kind`` sends its token, in words (messages)."""
    if kind in AUTH_HEADERS:
        name, template = AUTH_HEADERS[kind]
        return f"the {name} header" + (f" ({name}: {template.replace('{token}', '<token>')})"
                                         if template != "{token}" else "")
    return "the header its auth_header names (e.g. auth_header: 'X-Api-Key')"


def _refuse_url_secret(url: str, kind: str, name: str) -> None:
    """ValueError naming the first query or fragment parameter of ``url`` named like a secret
    (never its value) and saying where the secret goes instead."""
    found = secret_parameters(url)
    if not found:
        return
    token, conn_id = TOKEN_NAMES.get(kind, "token"), f"{name.lower()}_token"
    raise ValueError(
        f"url has a secret in it: its parameter {found[0]!r} (value not shown) is named like one, and a portal's "
        "url is shown and stored everywhere (the DAG's description, the database, the Harvester UI, exports, "
        f"logs). Take {found[0]}=... out of the url and put the {token} in an Airflow connection named by the "
        f"portal's conn_id, as its password (e.g. conn_id: {conn_id} and {conn_env(conn_id)}="
        "'{\"conn_type\": \"generic\", \"password\": \"<token>\"}'); Harvester sends it in "
        + _token_header(kind))


def _auth_header(entry: dict, kind: str, conn_id: str | None) -> tuple[str, str] | None:
    """(header name, value template with {token}) the token of ``conn_id`` is sent in: the entry's
    ``auth_header`` ("Name" for the token as it is, or "Name: template" with {token} in the
    template), else the platform's (AUTH_HEADERS); None without conn_id."""
    value = entry.get("auth_header")
    if value is None:
        if conn_id is None:
            return None
        if kind not in AUTH_HEADERS:
            raise ValueError(f"conn_id {conn_id!r} needs auth_header on a {kind} portal: a catalogue of this kind has "
                             "no standard header for a token; name the one it takes, e.g. auth_header: 'X-Api-Key' "
                             "(the token as it is) or auth_header: 'Authorization: Bearer {token}'")
        return AUTH_HEADERS[kind]
    if conn_id is None:
        raise ValueError("auth_header says how the token of conn_id is sent: add conn_id, the Airflow connection "
                         "holding the token (as its password)")
    if kind == CKAN:
        raise ValueError("auth_header does not apply to type ckan: CKAN takes its API token in the Authorization "
                         "header as it is; leave auth_header out")
    example = "e.g. 'X-Api-Key' or 'Authorization: Bearer {token}'"
    # Nothing of the value is repeated in a message: a secret written there by mistake stays out of it.
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"auth_header must be a header name, or 'Name: value' with {{token}} in the value, {example}")
    header, colon, template = value.partition(":")
    header, template = header.strip(), template.strip() if colon else "{token}"
    if not _HEADER_NAME.match(header):
        raise ValueError("auth_header does not start with a header name (letters, digits and !#$%&'*+-.^_`|~, no "
                         f"spaces: a token of RFC 9110), followed by ':' and the value if any, {example}")
    rest = template.replace("{token}", "", 1)
    if "{token}" not in template or "{" in rest or "}" in rest:
        raise ValueError(f"auth_header {header}: its value must hold {{token}} once, where the token of conn_id goes, "
                         f"and no other braces (the secret itself belongs in the connection), {example}")
    if not _HEADER_VALUE.match(template):
        raise ValueError(f"auth_header {header}: its value may hold visible ASCII characters and spaces only (no line "
                         "break, no control character)")
    return header, template


def _language(entry: dict) -> str:
    value = entry.get("language", "simple")
    if value is None:
        return "simple"
    name = str(value).strip().lower()
    name = LANGUAGE_CODES.get(name, name)
    if name not in TEXT_SEARCH_CONFIGS:
        raise ValueError(f"language {value!r} is not a text-search configuration; valid: {', '.join(TEXT_SEARCH_CONFIGS)}"
                         " (or a two-letter code of one, e.g. pt, de)")
    return name


def _notify(entry: dict) -> tuple:
    return parse_notify(entry["notify"]) if "notify" in entry else ()


def parse_portals(document: Any, source: str = "portals.yaml") -> list[Portal]:
    if not isinstance(document, dict) or not isinstance(document.get("portals"), list):
        raise PortalConfigError(f"{source}: expected a top-level 'portals:' list")
    portals: list[Portal] = []
    problems: list[str] = []
    for index, entry in enumerate(document["portals"]):
        label = f"portals[{index}]"
        if isinstance(entry, dict) and entry.get("name"):
            label += f" ({entry['name']})"
        try:
            portals.append(_portal(entry))
        except ValueError as exc:
            problems.append(f"{label}: {exc}")
    for attr in ("name", "url"):
        seen: dict[str, int] = {}
        for portal in portals:
            value = getattr(portal, attr)
            if value in seen:
                problems.append(f"portal {portal.name}: {attr} {value!r} is used by another entry too")
            seen[value] = 1
    if problems:
        raise PortalConfigError(f"{source} is not valid:\n  " + "\n  ".join(problems))
    return portals


def load_portals(path: Path | str | None = None) -> list[Portal]:
    """All portals in the file (enabled or not)."""
    import yaml

    path = Path(path) if path else portals_file()
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PortalConfigError(f"portals file {path} does not exist (set HARVESTER_PORTALS_FILE)") from None
    except yaml.YAMLError as exc:
        raise PortalConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse_portals(document, str(path))


def get_portal(name: str, path: Path | str | None = None) -> Portal:
    portals = load_portals(path)
    for portal in portals:
        if portal.name == name:
            return portal
    known = ", ".join(p.name for p in portals) or "none"
    raise PortalConfigError(f"no portal named {name!r} in {path or portals_file()}; known portals: {known}")
