"""bench/duplicates_bench.py at 2,000 datasets per portal, on a test database: the bench's own checks
(every copy grouped with its source, no decoy grouped, a no-change run touching nothing) pass, and
it prints every stage. Keeps the bench working as store/duplicates.py changes."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_grouping_bench_runs_and_its_checks_pass(database_url):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "duplicates_bench.py"), "--datasets", "2000",
                           "--changed", "100", "--database-url", database_url, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "checks: all passed" in done.stdout
    stages = {s["stage"]: s for s in json.loads(done.stdout.strip().splitlines()[-1])}
    assert list(stages) == ["national first scan", "aggregator first scan", "no-change run", "100 changed"]
    assert stages["national first scan"]["touched"] == stages["aggregator first scan"]["touched"] == 2000
    assert stages["aggregator first scan"]["groups"] == 800      # 40% copied
    assert stages["no-change run"]["examined"] == 0
    assert stages["100 changed"]["touched"] == 100
