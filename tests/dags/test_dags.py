"""The DAG files parse cleanly in a real DagBag: one DAG per enabled portal, four tasks in order,
the hygiene users rely on; a bad portals.yaml is an import error naming the bad entry."""
import shutil
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _bag(folder, monkeypatch, portals: dict | None = None, tmp_path: Path | None = None):
    from airflow.dag_processing.dagbag import DagBag

    if portals is not None:
        path = tmp_path / "portals.yaml"
        path.write_text(yaml.safe_dump(portals))
        monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
    return DagBag(dag_folder=str(folder))


def test_one_dag_per_enabled_portal(airflow_db, monkeypatch, tmp_path):
    for name in ("HARVESTER_EMBEDDING_POOL", "HARVESTER_BUSY_POLL_SECS"):
        monkeypatch.delenv(name, raising=False)
    portals = {"portals": [
        {"name": "alpha", "url": "https://alpha.example.org", "schedule": "0 3 * * *"},
        {"name": "beta", "url": "https://beta.example.org", "enabled": False},
        {"name": "gamma", "url": "https://gamma.example.org/data", "schedule": None},
    ]}
    bag = _bag(ROOT / "dags", monkeypatch, portals, tmp_path)
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == ["harvest_alpha", "harvest_gamma", "review_changes"]
    review = bag.get_dag("review_changes")
    assert review.is_paused_upon_creation is True
    assert {a.uri for a in review.timetable.asset_condition.objects} == {
        "harvester://alpha/datasets", "harvester://gamma/datasets"}
    alpha = bag.get_dag("harvest_alpha")
    assert [a.uri for a in alpha.get_task("upsert").outlets] == ["harvester://alpha/datasets"]
    force = alpha.params.get_param("force_removals")
    assert force.value is False and force.schema["type"] == "boolean" and "20%" in force.description
    dag = bag.get_dag("harvest_alpha")
    assert {t.task_id for t in dag.tasks} >= {"fetch_modified", "hash_compare", "embed_changed", "upsert"}
    chain = ["begin", "fetch_modified", "reconcile", "hash_compare", "embed_changed", "upsert"]
    for upstream, downstream in zip(chain, chain[1:]):
        assert upstream in dag.get_task(downstream).upstream_task_ids
    assert dag.get_task("upsert").upstream_task_ids == {"begin", "embed_changed"}
    assert dag.catchup is False and dag.max_active_runs == 1
    assert dag.dagrun_timeout is not None and dag.doc_md and "harvester" in dag.tags
    for name in ("full_sync", "reconcile"):
        param = dag.params.get_param(name)
        assert param.value is False and param.schema["type"] == "boolean" and param.description
    assert "when the last one is older than 1d" in dag.doc_md
    assert dag.get_task("embed_changed").pool == "default_pool"  # HARVESTER_EMBEDDING_POOL unset: always there
    begin = dag.get_task("begin")  # waits for a busy portal without holding a worker slot
    assert begin.reschedule and begin.mode == "reschedule" and begin.poke_interval == 60
    assert dag.get_task("fetch_modified").retry_exponential_backoff
    assert bag.get_dag("harvest_gamma").schedule is None


def test_shipped_portals_file_parses(airflow_db, monkeypatch):
    monkeypatch.delenv("HARVESTER_PORTALS_FILE", raising=False)
    bag = _bag(ROOT / "dags", monkeypatch)
    assert bag.import_errors == {}
    enabled = [p for p in yaml.safe_load((ROOT / "dags" / "portals.yaml").read_text())["portals"] if p.get("enabled", True)]
    assert len(bag.dag_ids) == len(enabled)


def test_demo_portals_file_gives_harvest_demo(airflow_db, monkeypatch):
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(ROOT / "dags" / "portals.demo.yaml"))
    bag = _bag(ROOT / "dags", monkeypatch)
    assert bag.import_errors == {} and sorted(bag.dag_ids) == ["harvest_demo", "review_changes"]


def test_bad_portals_file_is_an_import_error_naming_the_entry(airflow_db, monkeypatch, tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(ROOT / "dags" / "harvest_portals.py", dags)
    (dags / "other.py").write_text(
        "from datetime import datetime\nfrom airflow.sdk import dag, task\n\n"
        "@dag(dag_id='other', schedule=None, start_date=datetime(2024, 1, 1))\n"
        "def other():\n    @task\n    def hello():\n        return 1\n    hello()\n\nother()\n")
    portals = {"portals": [{"name": "ok", "url": "https://ok.example.org"},
                           {"name": "broken", "url": "https://b.example.org", "page_size": 0}]}
    bag = _bag(dags, monkeypatch, portals, tmp_path)
    assert bag.dag_ids == ["other"]
    (error,) = bag.import_errors.values()
    assert "portals[1] (broken): page_size 0 must be a whole number from 1 to 1000" in error


def test_backfill_runs_are_recognised_as_full_syncs():
    from types import SimpleNamespace

    from airflow.utils.types import DagRunType

    from harvester.pipeline import tasks

    assert tasks._is_backfill(SimpleNamespace(run_type=DagRunType.BACKFILL_JOB))
    assert tasks._is_backfill(SimpleNamespace(run_type="backfill"))
    assert not tasks._is_backfill(SimpleNamespace(run_type=DagRunType.SCHEDULED))
    assert not tasks._is_backfill(SimpleNamespace(run_type=DagRunType.MANUAL))
