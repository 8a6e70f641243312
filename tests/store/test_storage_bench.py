"""bench/storage_bench.py at 300 datasets, on a test database: it harvests them, then twice edits 3
and harvests again, and its report accounts for every byte of the schema's relations, per live
dataset, at each stage (after the first sync, after the incremental runs, after a VACUUM)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_storage_bench_measures_every_relation(database_url, db):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "storage_bench.py"), "--datasets", "300",
                           "--dimension", "64", "--runs", "2", "--database-url", database_url, "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stages = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(stages) == ["after the first sync", "after 2 incremental runs of 1%", "after a plain VACUUM"]
    assert [(r["datasets"], r["versions"]) for r in stages.values()] == [(300, 300), (300, 306), (300, 306)]
    # only the replaced versions store their snapshot: a current one's is its dataset's row (sql/031)
    assert [r["snapshots"] for r in stages.values()] == [0, 6, 6]
    # once a run committed, the staging tables hold nothing of it (issue 40)
    assert all(set(r["staged_rows"].values()) == {0} for r in stages.values())
    report = stages["after a plain VACUUM"]
    # what the report sums is every relation of the schema, as PostgreSQL counts them
    (schema_bytes,) = db.execute(
        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'public' AND c.relkind = 'r'").fetchone()
    assert sum(t["bytes"] for t in report["tables"]) == schema_bytes
    tables = {t["table"] for t in report["tables"]}
    assert {"datasets", "embeddings", "dataset_vectors", "dataset_search", "dataset_versions"} <= tables
    assert "| **all** |" in done.stdout and "| goal | 12,000 |" in done.stdout
