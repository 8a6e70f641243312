"""The settings registry (config/settings.py): every environment variable the code reads is in it,
each numeric one refuses a non-number and an out-of-range value with a message naming it (through
the registry and through the code that reads it), the settings objects built from the environment
take the registry's defaults, and the docs' table lists every setting without Airflow or a database."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harvester.config.settings import (SETTINGS, TOPICS, Setting, SettingError, breaker_config, env_value,
                                       env_values, markdown_table, report_settings, task_settings)
from harvester.domain.breaker import BreakerConfig, BreakerConfigError
from harvester.domain.run import TaskSettings

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "plugins" / "harvester" / "config" / "settings.py"


# -- every read is registered: the scan ----------------------------------------------------------------
_ARG = r"""(?P<{}>"[^"\n]*"|'[^'\n]*'|[A-Za-z_][\w.]*(?:\([^()\n]*\))?)"""
# os.getenv(X), os.environ.get(X) / environ.get(X), os.environ[X] (not assigned to), X in os.environ,
# and the registry's own lookup env_value(X)
READS = re.compile("|".join([
    r"\bos\.getenv\(\s*" + _ARG.format("getenv"),
    r"\benviron\.get\(\s*" + _ARG.format("get"),
    r"\benviron\[\s*" + _ARG.format("item") + r"\s*\](?!\s*=[^=])",
    _ARG.format("member") + r"\s+(?:not\s+)?in\s+os\.environ\b",
    r"\benv_value\(\s*" + _ARG.format("lookup"),
]))
_CONSTANT = r"""^{}\s*=\s*(["'])([^"'\n]+)\1"""

# Reads by a name computed at run time, each a documented family (or not a setting at all):
# (file, the expression read) -> why
DYNAMIC = {
    ("plugins/harvester/config/secrets.py", "match.group(1)"): "${NAME} in portals.yaml (registered as ${NAME})",
    ("plugins/harvester/store/db.py", "conn_env(conn_id)"): "AIRFLOW_CONN_<CONN_ID> (registered)",
    ("plugins/harvester/testing/airflow_cluster.py", "k"): "the caller's HOME, LANG, ... handed to a test cluster",
    ("plugins/harvester/testing/compose_stack.py", "k"): "the caller's LANG, LC_ALL, TZ, TMPDIR handed to the compose stack's services",
    ("plugins/harvester/testing/upgrade.py", "v"): "the caller's environment but for Harvester's own settings, handed to the old code's process",
}


def scan(source: str) -> tuple[set[str], list[tuple[int, str]]]:
    """The environment variables ``source`` reads: (names, [(line, expression)] read by a name
    that is neither a literal nor a constant of the same file)."""
    names, dynamic = set(), []
    for found in READS.finditer(source):
        arg = next(value for value in found.groupdict().values() if value is not None)
        line = source.count("\n", 0, found.start()) + 1
        if arg[0] in "\"'":
            names.add(arg[1:-1])
            continue
        constant = re.search(_CONSTANT.format(re.escape(arg)), source, re.MULTILINE)
        if constant:
            names.add(constant.group(2))
        else:
            dynamic.append((line, arg))
    return names, dynamic


def source_files(root: Path) -> list[Path]:
    """plugins/harvester/**/*.py and dags/*.py, but the registry itself (which reads any name)."""
    files = sorted((root / "plugins" / "harvester").rglob("*.py")) + sorted((root / "dags").glob("*.py"))
    return [f for f in files if "__pycache__" not in f.parts and f.resolve() != REGISTRY.resolve()]


def unregistered_reads(root: Path) -> list[str]:
    """A line per variable read but not registered, and per read by a computed name not in DYNAMIC."""
    problems = []
    registered = {name for name, s in SETTINGS.items() if not s.pattern}
    for path in source_files(root):
        where = path.relative_to(root).as_posix()
        names, dynamic = scan(path.read_text(encoding="utf-8"))
        problems += [f"{where}: reads {name}, which is not in the settings registry "
                     f"(plugins/harvester/config/settings.py): register it" for name in sorted(names - registered)]
        problems += [f"{where}:{line}: reads the environment variable named by {expr!r}: read a registered setting "
                     f"by name, or list this read in DYNAMIC with why" for line, expr in dynamic
                     if (where, expr) not in DYNAMIC]
    return problems


def test_every_environment_variable_the_code_reads_is_registered():
    problems = unregistered_reads(ROOT)
    assert not problems, "\n".join(problems)


def test_the_scan_sees_the_code():
    """(So the test above cannot pass by reading nothing.)"""
    seen = set()
    for path in source_files(ROOT):
        seen |= scan(path.read_text(encoding="utf-8"))[0]
    assert {"HARVESTER_LOCK_TIMEOUT_SECS", "HARVESTER_EMBEDDED_DB", "GEMINI_TIMEOUT", "HARVESTER_DEMO_PORT",
            "HARVESTER_PORTALS_FILE", "MALLOC_ARENA_MAX", "HARVESTER_DATABASE_URL"} <= seen


SNIPPET = '''import os
from harvester.config.settings import env_value
NEWER = "HARVESTER_NEWER"
a = os.environ.get("HARVESTER_NEW")
b = os.getenv('HARVESTER_GETENV', "x")
c = os.environ["HARVESTER_ITEM"]
os.environ["HARVESTER_SET_ONLY"] = "1"
d = env_value(NEWER)
if "HARVESTER_MEMBER" not in os.environ:
    e = os.environ.get(compute(name))
f = os.environ.get("GEMINI_TIMEOUT")
'''


def test_the_scan_catches_a_new_read(tmp_path):
    names, dynamic = scan(SNIPPET)
    assert names == {"HARVESTER_NEW", "HARVESTER_GETENV", "HARVESTER_ITEM", "HARVESTER_NEWER", "HARVESTER_MEMBER",
                     "GEMINI_TIMEOUT"}
    assert dynamic == [(10, "compute(name)")]
    # in a checkout: every unregistered one is named, the registered one is not
    (tmp_path / "plugins" / "harvester" / "room").mkdir(parents=True)
    (tmp_path / "dags").mkdir()
    (tmp_path / "plugins" / "harvester" / "room" / "new.py").write_text(SNIPPET)
    (tmp_path / "dags" / "d.py").write_text('import os\nX = os.environ.get("HARVESTER_IN_A_DAG")\n')
    problems = unregistered_reads(tmp_path)
    assert [p.split(", which")[0] for p in problems if "not in the settings registry" in p] == [
        "plugins/harvester/room/new.py: reads HARVESTER_GETENV", "plugins/harvester/room/new.py: reads HARVESTER_ITEM",
        "plugins/harvester/room/new.py: reads HARVESTER_MEMBER", "plugins/harvester/room/new.py: reads HARVESTER_NEW",
        "plugins/harvester/room/new.py: reads HARVESTER_NEWER", "dags/d.py: reads HARVESTER_IN_A_DAG"]
    assert problems[-2].startswith("plugins/harvester/room/new.py:10: reads the environment variable named by "
                                   "'compute(name)'")


def test_an_unregistered_name_is_refused_saying_where_to_add_it():
    with pytest.raises(KeyError, match="HARVESTER_NOPE is not a registered setting: add it to "
                                       "plugins/harvester/config/settings.py"):
        env_value("HARVESTER_NOPE", {"HARVESTER_NOPE": "1"})


# -- numeric settings: the range and the message ----------------------------------------------------------
NUMERIC = [s for s in SETTINGS.values() if s.kind in ("int", "float")]


def out_of_range(s: Setting) -> str:
    if s.high is not None:
        return str(s.high + 1)
    return str(s.low if s.above else s.low - 1)


@pytest.mark.parametrize("s", NUMERIC, ids=[s.name for s in NUMERIC])
def test_each_numeric_setting_refuses_a_non_number_and_an_out_of_range_value_naming_itself(s):
    assert s.low is not None, f"{s.name} has no range: give it one"
    for raw in ("abc", "1.5x", out_of_range(s), "nan" if s.kind == "float" else "2.5"):
        with pytest.raises(SettingError) as caught:
            env_value(s.name, {s.name: raw})
        assert str(caught.value) == f"{s.name}={raw!r} must be {s.allowed}"
        assert caught.value.names == (s.name,)
    assert env_value(s.name, {}) == s.default == env_value(s.name, {s.name: "  "})
    if s.high is not None:
        assert env_value(s.name, {s.name: f" {s.high} "}) == s.high


def test_the_messages_read_as_the_project_writes_them():
    assert str(pytest.raises(SettingError, env_value, "HARVESTER_BUSY_POLL_SECS", {"HARVESTER_BUSY_POLL_SECS": "abc"})
               .value) == "HARVESTER_BUSY_POLL_SECS='abc' must be a whole number from 1 to 3600"
    assert str(pytest.raises(SettingError, env_value, "HARVESTER_LOCK_TIMEOUT_SECS",
                             {"HARVESTER_LOCK_TIMEOUT_SECS": "1e9"}).value) == (
        "HARVESTER_LOCK_TIMEOUT_SECS='1e9' must be a number from 0.1 to 86400")
    assert str(pytest.raises(SettingError, env_value, "GEMINI_TIMEOUT", {"GEMINI_TIMEOUT": "0"}).value) == (
        "GEMINI_TIMEOUT='0' must be a number > 0")
    assert str(pytest.raises(SettingError, env_value, "HARVESTER_EMBEDDED_DB", {"HARVESTER_EMBEDDED_DB": "of"})
               .value) == "HARVESTER_EMBEDDED_DB='of' is neither on nor off; use one of on, true, yes, 1 or one of off, false, no, 0"
    assert str(pytest.raises(SettingError, env_value, "HARVESTER_EMBEDDING_PROVIDER",
                             {"HARVESTER_EMBEDDING_PROVIDER": "openai"}).value) == (
        "HARVESTER_EMBEDDING_PROVIDER='openai' must be one of: local, gemini, ollama")
    assert str(pytest.raises(SettingError, env_value, "HARVESTER_INDEX_BUILD_MEMORY",
                             {"HARVESTER_INDEX_BUILD_MEMORY": "2gb"}).value) == (
        "HARVESTER_INDEX_BUILD_MEMORY='2gb' must be a size such as 256MB or 2GB (units kB, MB, GB, TB)")


def test_kinds_parse_as_documented():
    assert env_value("HARVESTER_EMBEDDED_DB", {"HARVESTER_EMBEDDED_DB": " OFF "}) is False
    assert env_value("HARVESTER_EMBEDDED_DB", {"HARVESTER_EMBEDDED_DB": "yes"}) is True
    assert env_value("HARVESTER_EMBEDDED_DB", {}) is True
    assert env_value("HARVESTER_EMBEDDING_PROVIDER", {"HARVESTER_EMBEDDING_PROVIDER": " Gemini"}) == "gemini"
    assert env_value("HARVESTER_INDEX_BUILD_MEMORY", {"HARVESTER_INDEX_BUILD_MEMORY": "2048 MB"}) == "2GB"
    assert env_value("HARVESTER_PORTALS_FILE", {"HARVESTER_PORTALS_FILE": "/x/portals.yaml"}) == Path("/x/portals.yaml")
    assert env_value("HARVESTER_PORTALS_FILE", {"HARVESTER_PORTALS_FILE": " "}) is None
    assert env_value("GEMINI_BASE_URL", {"GEMINI_BASE_URL": " http://h:1 "}) == "http://h:1"


def test_a_secret_value_is_never_in_a_message():
    s = Setting("T_SECRET_PORT", "int", 1, "a secret number", "testing", 1, 10, secret=True)
    with pytest.raises(SettingError) as caught:
        s.parse("hunter2")
    assert "hunter2" not in str(caught.value) and "T_SECRET_PORT=<7 characters, secret>" in str(caught.value)


def test_several_settings_report_every_bad_one_at_once():
    with pytest.raises(SettingError) as caught:
        env_values(["HARVESTER_SEARCH_RRF_K", "HARVESTER_SEARCH_CANDIDATES", "HARVESTER_SEARCH_EF_SEARCH"],
                   {"HARVESTER_SEARCH_RRF_K": "x", "HARVESTER_SEARCH_EF_SEARCH": "0"})
    assert str(caught.value) == ("HARVESTER_SEARCH_RRF_K='x' must be a whole number from 0 to 100000; "
                                 "HARVESTER_SEARCH_EF_SEARCH='0' must be a whole number from 1 to 1000")
    assert caught.value.names == ("HARVESTER_SEARCH_RRF_K", "HARVESTER_SEARCH_EF_SEARCH")


def test_a_setting_is_checked_when_registered():
    with pytest.raises(ValueError, match="setting T_X: default 0 is not a whole number from 1 to 3"):
        Setting("T_X", "int", 0, "x", "testing", 1, 3)
    with pytest.raises(ValueError, match="topic 'nowhere' is not one of"):
        Setting("T_X", "str", None, "x", "nowhere")


# -- the code that reads them: a bad value fails there, named, with that room's error --------------------------
def _readers():
    from harvester.embeddings import get_provider
    from harvester.embeddings.base import TerminalEmbeddingError
    from harvester.embeddings.batching import EmbedSettings
    from harvester.embeddings.gemini import GeminiProvider
    from harvester.embeddings.local import LocalProvider
    from harvester.embeddings.ollama import OllamaProvider
    from harvester.http.guard import FetchPolicy
    from harvester.store import db, duplicates
    from harvester.store.embedded import server
    from harvester.store.portal_indexes import PortalIndexSettings
    from harvester.store.search import SearchSettings
    from harvester.store.vectors import IndexSettings
    from harvester.testing import demo

    return [
        (("HARVESTER_TASK_", "HARVESTER_BUSY_", "HARVESTER_BACKFILL_"), task_settings, SettingError),
        (("HARVESTER_OUTCOMES_", "HARVESTER_VALIDATE_"), report_settings, SettingError),
        (("HARVESTER_FETCH_",), lambda: FetchPolicy.for_harvest("https://portal.example/"), SettingError),
        (("CB_",), breaker_config, BreakerConfigError),
        (("HARVESTER_EMBED_",), EmbedSettings.from_env, ValueError),
        (("HARVESTER_INDEX_",), IndexSettings.from_env, ValueError),
        (("HARVESTER_SEARCH_",), SearchSettings.from_env, ValueError),
        (("HARVESTER_PORTAL_INDEX_",), PortalIndexSettings.from_env, ValueError),
        (("HARVESTER_LOCK_TIMEOUT_SECS",), lambda: db.lock_timeout(), db.DatabaseConfigError),
        (("HARVESTER_GROUPING_WAIT_SECS",), lambda: duplicates.grouping_wait(), db.DatabaseConfigError),
        (("HARVESTER_EMBEDDED_DB",), db.embedded_allowed, db.DatabaseConfigError),
        (("HARVESTER_EMBEDDED_SHARED_BUFFERS",), server.shared_buffers, server.EmbeddedServerError),
        (("HARVESTER_EMBEDDING_PROVIDER",), get_provider, TerminalEmbeddingError),
        (("HARVESTER_LOCAL_",), LocalProvider, TerminalEmbeddingError),
        (("GEMINI_",), GeminiProvider, TerminalEmbeddingError),
        (("OLLAMA_",), OllamaProvider, TerminalEmbeddingError),
        (("HARVESTER_DEMO_PORT",), lambda: demo.main([]), SystemExit),
    ]


CHECKED = [s for s in SETTINGS.values() if s.kind not in ("str", "path")]


@pytest.mark.parametrize("s", CHECKED, ids=[s.name for s in CHECKED])
def test_the_code_that_reads_a_setting_refuses_a_bad_value_naming_it(s, monkeypatch):
    readers = [(read, error) for prefixes, read, error in _readers() if s.name.startswith(prefixes)]
    assert readers, f"{s.name}: say here which code reads it"
    (read, error), = readers
    monkeypatch.setenv(s.name, "bad")
    with pytest.raises(error) as caught:
        read()
    assert f"{s.name}='bad' " in str(caught.value)


def test_settings_objects_from_an_empty_environment_are_their_defaults():
    from harvester.embeddings.batching import EmbedSettings
    from harvester.store.search import SearchSettings
    from harvester.store.vectors import IndexSettings

    assert task_settings({}) == TaskSettings()
    assert breaker_config({}) == BreakerConfig()
    assert EmbedSettings.from_env({}) == EmbedSettings()
    assert IndexSettings.from_env({}) == IndexSettings()
    assert SearchSettings.from_env({}) == SearchSettings()


# -- the circuit breaker's settings (read here; checked by the domain too) ------------------------------------
def test_the_breaker_reads_every_variable():
    config = breaker_config({
        "CB_FAILURE_THRESHOLD": "3", "CB_RECOVERY_TIMEOUT_SECS": "10.5", "CB_SUCCESS_THRESHOLD": "1",
        "CB_RATE_LIMIT_BACKOFF_MULTIPLIER": "3", "CB_MAX_RECOVERY_TIMEOUT_SECS": "100",
        "CB_HALF_OPEN_MAX_PROBES": "4", "CB_PROBE_LEASE_SECS": " 45 ", "UNRELATED": "x"})
    assert config == BreakerConfig(3, 10.5, 1, 3.0, 100.0, 4, 45.0)
    assert breaker_config({"CB_FAILURE_THRESHOLD": "  "}) == BreakerConfig()


@pytest.mark.parametrize("env, message", [
    ({"CB_FAILURE_THRESHOLD": "five"}, "CB_FAILURE_THRESHOLD='five' must be a whole number >= 1"),
    ({"CB_FAILURE_THRESHOLD": "2.5"}, "CB_FAILURE_THRESHOLD='2.5' must be a whole number >= 1"),
    ({"CB_FAILURE_THRESHOLD": "0"}, "CB_FAILURE_THRESHOLD='0' must be a whole number >= 1"),
    ({"CB_SUCCESS_THRESHOLD": "-1"}, "CB_SUCCESS_THRESHOLD='-1' must be a whole number >= 1"),
    ({"CB_HALF_OPEN_MAX_PROBES": "0"}, "CB_HALF_OPEN_MAX_PROBES='0' must be a whole number >= 1"),
    ({"CB_RECOVERY_TIMEOUT_SECS": "soon"}, "CB_RECOVERY_TIMEOUT_SECS='soon' must be a number > 0"),
    ({"CB_RECOVERY_TIMEOUT_SECS": "0"}, "CB_RECOVERY_TIMEOUT_SECS='0' must be a number > 0"),
    ({"CB_RECOVERY_TIMEOUT_SECS": "nan"}, "CB_RECOVERY_TIMEOUT_SECS='nan' must be a number > 0"),
    ({"CB_PROBE_LEASE_SECS": "inf"}, "CB_PROBE_LEASE_SECS='inf' must be a number > 0"),
    ({"CB_RATE_LIMIT_BACKOFF_MULTIPLIER": "0.5"}, "CB_RATE_LIMIT_BACKOFF_MULTIPLIER='0.5' must be a number >= 1"),
    # a rule between two settings: the domain's own check
    ({"CB_MAX_RECOVERY_TIMEOUT_SECS": "10"}, "CB_MAX_RECOVERY_TIMEOUT_SECS (max_recovery_timeout_secs) 10 must be at"
                                             " least CB_RECOVERY_TIMEOUT_SECS (recovery_timeout_secs) 30"),
])
def test_bad_breaker_settings_name_the_variable(env, message):
    with pytest.raises(BreakerConfigError) as caught:
        breaker_config(env)
    assert str(caught.value) == f"circuit breaker settings: {message}"


def test_every_bad_breaker_variable_is_reported_at_once():
    with pytest.raises(BreakerConfigError) as error:
        breaker_config({"CB_FAILURE_THRESHOLD": "x", "CB_PROBE_LEASE_SECS": "y"})
    assert "CB_FAILURE_THRESHOLD='x'" in str(error.value) and "CB_PROBE_LEASE_SECS='y'" in str(error.value)


# -- the docs -----------------------------------------------------------------------------------------------------
def test_the_markdown_table_lists_every_setting_under_its_topic():
    text = markdown_table()
    for s in SETTINGS.values():
        assert f"| `{s.name}` | " in text, s.name
        assert f"| `{s.name}` | " in markdown_table(s.topic), s.name
        others = [t for t in TOPICS if t != s.topic]
        assert not any(f"| `{s.name}` | " in markdown_table(t) for t in others), s.name
    assert [line for line in text.splitlines() if line.startswith("## ")] == [
        f"## {title}" for key, title in TOPICS.items() if any(s.topic == key for s in SETTINGS.values())]
    assert ("| `HARVESTER_BUSY_POLL_SECS` | `60` | a whole number from 1 to 3600 | How often begin checks a portal"
            in text)
    assert "| `GEMINI_API_KEY` | unset | text | The Gemini API key" in text and "; **secret**: never shown" in text
    with pytest.raises(ValueError, match="topic 'nope' is not one of: runs, "):
        markdown_table("nope")


def test_the_table_needs_neither_airflow_nor_a_database():
    code = ("import sys\nfrom harvester.config.settings import markdown_table\nassert markdown_table()\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'psycopg', 'requests', 'numpy'))\n"
            "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(ROOT / "plugins"), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("cls_path, prefix", [
    ("harvester.embeddings.batching:EmbedSettings", "HARVESTER_EMBED_"),
    ("harvester.store.search:SearchSettings", "HARVESTER_SEARCH_"),
    ("harvester.store.vectors:IndexSettings", "HARVESTER_INDEX_"),
])
def test_every_variable_of_a_settings_family_reaches_its_field(cls_path, prefix):
    """fields_from_env finds each field's variable by name: a registered variable of the family that
    no field takes (a renamed field, a typo) would be silently ignored."""
    import importlib

    module, name = cls_path.split(":")
    cls = getattr(importlib.import_module(module), name)
    family = sorted(n for n, s in SETTINGS.items() if n.startswith(prefix) and not s.pattern)
    assert family
    for variable in family:
        bad = {variable: "not-a-value"}
        with pytest.raises(ValueError, match=variable):
            cls.from_env(bad)
