"""bench/scale_bench.py at 300 and 1,500 datasets, through `airflow dags test` as at full size: every
stage's figures come out for both sizes, with the counts of what the bench did to the portal; then
the same command with the same --home resumes: every stage skipped, state.json untouched. Keeps the
bench working as the pipeline, the DAG and search change."""
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGES = {"full", "nochange", "changes", "reconcile", "search", "storage"}
CHANGES, DRIFT, QUERIES = 40, 10, 30

pytestmark = pytest.mark.slow  # a dozen `airflow dags test` runs


def scale_bench(home: Path) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "scale_bench.py"), "--home", str(home),
                           "--sizes", "1500,300", "--repeats", "1", "--changes", str(CHANGES), "--drift", str(DRIFT),
                           "--queries", str(QUERIES), "--warmup", "5", "--recall-queries", "10", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + "\n--- stderr:\n" + done.stderr[-1500:]
    return done, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def home():
    # not under tmp_path: as root, the embedded server runs as a service account, which must reach
    # its data directory, and pytest keeps its own temporary folders to their owner (conftest's
    # pg_server does the same)
    path = Path(tempfile.mkdtemp(prefix="harvester-scale-bench-"))
    yield path / "scale"
    shutil.rmtree(path, ignore_errors=True)


def test_the_scale_bench_measures_every_stage_at_two_sizes_and_resumes(home):
    first, figures = scale_bench(home)
    assert set(figures["sizes"]) == {"300", "1500"}
    for n in (300, 1500):
        st = figures["sizes"][str(n)]
        assert set(st) == STAGES
        assert st["full"]["datasets"] == st["full"]["stats"]["created"] == n
        assert {"begin", "fetch_modified", "hash_compare", "embed_changed", "upsert"} <= set(st["full"]["tasks"])
        assert st["full"]["hnsw_build_s"] is not None and st["full"]["exact_rss_mb"] > 0
        assert st["full"]["pg_backend_mb"] > 0 and st["full"]["cpu"]["PostgreSQL"] > 0
        assert st["nochange"]["stats"]["created"] == st["nochange"]["stats"]["updated"] == 0
        assert st["nochange"]["floor"]["wall"] > 0
        assert st["changes"]["stats"]["updated"] == st["changes"]["stats"]["embedded"] == CHANGES
        assert {k: st["reconcile"]["stats"][k] for k in ("created", "updated", "removed")} == \
            {"created": DRIFT, "updated": DRIFT, "removed": DRIFT}
        assert st["search"]["queries"] == QUERIES and st["search"]["models"] == ["gemini-embedding-001@768"]
        assert 0 < st["search"]["recall"]["recall"] <= 1 and st["search"]["plain_p95"] > 0
        assert st["storage"]["datasets"] == n and st["storage"]["total_per_dataset"] > 0
        assert all(check["ok"] for stage in st.values() for check in stage.get("checks", []))
    assert "| goal | measured | met |" in first.stdout and "linear = 5.0" in first.stdout
    state = (home / "state.json").read_text()

    again, resumed = scale_bench(home)
    assert again.stdout.count(": skipped (done") == 2 * len(STAGES)
    assert "datasets: full" not in again.stdout and "airflow" not in " ".join(p.name for p in home.glob("logs/*-2.log"))
    assert (home / "state.json").read_text() == state
    assert resumed["sizes"] == figures["sizes"]
