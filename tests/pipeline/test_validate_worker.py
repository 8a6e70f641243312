"""The child process one API validation runs in (harvester.pipeline.validate_worker): killed at its
deadline even where the validation itself never looks at the clock, saying what it was doing; and
started with none of the api-server's environment (issue 35)."""
from __future__ import annotations

import asyncio
import tempfile

from harvester.pipeline import validate_worker as worker
from harvester.pipeline.validate import FetchPolicy


def run(document: bytes, kind: str, deadline: float, memory: int = 1024 ** 3) -> worker.Outcome:
    policy = FetchPolicy(allow_private=False, max_bytes=100 * 1024 ** 2, timeout=deadline, deadline=deadline)
    with tempfile.TemporaryFile() as fp:
        fp.write(document)
        fp.flush()
        return asyncio.run(worker.run({"name": "packages.json", "kind": kind, "rows": 1000,
                                       "policy": worker.policy_fields(policy)},
                                      deadline=deadline, memory=memory, document=fp.fileno()))


def test_a_validation_past_its_time_is_killed_saying_where_it_was():
    """800,000 CKAN packages: normalized one by one for seconds, with no deadline looked at on the
    way (the document was read whole at once): the parent kills the child KILL_MARGIN past it."""
    packages = b"[" + b",".join([b'{"name": "x"}'] * 800_000) + b"]"
    outcome = run(packages, "ckan", deadline=1.0)
    assert outcome.report is None and outcome.error["kind"] == "timeout" and outcome.error["killed"]
    assert outcome.error["message"] == ("the validation's time ran out (HARVESTER_VALIDATE_TIMEOUT_SECS=1) while "
                                        "reading the upload: it was stopped")
    assert 1.0 + worker.KILL_MARGIN - 0.1 < outcome.seconds < 1.0 + worker.KILL_MARGIN + 1.0, outcome.seconds
    assert outcome.peak_memory and outcome.peak_memory < 1024 ** 3


def test_a_validation_in_time_answers_its_report_and_peak_memory():
    packages = b"[" + b",".join([b'{"name": "x"}', b'{"id": "p2", "name": "p2", "title": "T"}']) + b"]"
    outcome = run(packages, "ckan", deadline=30.0)
    assert outcome.error is None, outcome.error
    assert (outcome.report["records"], outcome.report["kind"]) == (2, "ckan")
    assert outcome.report["rows_total"] == sum(g["count"] for g in outcome.report["groups"]) > 0
    assert 10 * 1024 ** 2 < outcome.peak_memory < 200 * 1024 ** 2


def test_the_child_gets_none_of_the_api_servers_environment(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "not-for-a-parser")
    monkeypatch.setenv("AIRFLOW_CONN_HARVESTER_DB", "postgresql://u:secret@db/h")
    environment = worker._environment()
    assert set(environment) == {"PYTHONPATH", "LANG", "PYTHONUTF8", "PYTHONDONTWRITEBYTECODE", "MALLOC_ARENA_MAX"}
    assert "secret" not in repr(environment)
