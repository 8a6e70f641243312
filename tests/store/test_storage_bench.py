"""bench/storage_bench.py at 300 datasets, on a test database: it harvests them (3 edited once), and
its report accounts for every byte of the schema's relations, per live dataset."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_storage_bench_measures_every_relation(database_url, db):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "storage_bench.py"), "--datasets", "300",
                           "--dimension", "64", "--database-url", database_url, "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["datasets"] == 300 and report["versions"] == 303
    # what the report sums is every relation of the schema, as PostgreSQL counts them
    (schema_bytes,) = db.execute(
        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'public' AND c.relkind = 'r'").fetchone()
    assert sum(t["bytes"] for t in report["tables"]) == schema_bytes
    tables = {t["table"] for t in report["tables"]}
    assert {"datasets", "embeddings", "dataset_vectors", "dataset_search", "dataset_versions"} <= tables
    assert "| **all** |" in done.stdout
