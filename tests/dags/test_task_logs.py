"""What each task of a harvest DAG run says in its log (issue 38, finding 7), read from a real DAG run
(dag.test(): real Airflow, real HTTP to the local CKAN portal, real PostgreSQL, the local model
exported for ONNX Runtime on its first use).

A task's log opens with one line saying what the task will do, ends with an aligned summary table
whose last row links to the run's page on the Harvester page (under Airflow's [api] base_url), and
says in between only what is news: no "schema migrations: up to date" or "pgvector builds and
searches HNSW indexes" in every task, no listing line ending "so far", and the ONNX export of a
first use told step by step with an ETA instead of half a minute of silence."""
import logging
import re

from harvester.domain.tasklog import MAX_LINE

BASE_URL = "http://airflow.example.org:8080/tools/airflow"
TASKS = ("begin", "fetch_modified", "reconcile", "hash_compare", "embed_changed", "upsert")
_START = re.compile(r"\[DAG TEST\] starting task_id=(\w+) map_index=(-?\d+)")
_END = re.compile(r"\[DAG TEST\] end task task_id=(\w+)")


def task_logs(records) -> dict[str, list[logging.LogRecord]]:
    """The records each task logged, by task id (the mapped embed_changed's one shard as
    ``embed_changed``), without dag.test()'s own lines around them."""
    logs, current = {}, None
    for record in records:
        message = record.getMessage()
        if record.name == "airflow.sdk.definitions.dag":
            started, ended = _START.search(message), _END.search(message)
            if started:
                current = started.group(1)
                logs[current] = []
            elif ended:
                current = None
            continue
        if current is not None:
            logs[current].append(record)
    return logs


def summary_table(task: str, lines: list[str]) -> list[str]:
    """The table a task's log ends with: its title (``<task>: ..., in <time>:``) and rows."""
    titles = [i for i, line in enumerate(lines) if line.startswith(f"{task}: ") and line.endswith(":")
              and ", in " in line]
    assert titles, f"{task}'s log has no summary table:\n" + "\n".join(lines)
    return lines[titles[-1]:]


def assert_aligned(rows: list[str]) -> None:
    """Labels padded to one width; numbers right-aligned in one column, other values starting there."""
    labels = [re.match(r"  (\S+(?: \S+)*)", row).group(1) for row in rows]
    column = 4 + max(map(len, labels))
    cells = [row[column:] for row in rows]
    shown = "\n".join(rows)
    assert all(row[2:column].rstrip() == label for row, label in zip(rows, labels)), shown
    numbers = [cell for cell in cells if re.fullmatch(r" *[0-9][0-9,]*", cell)]
    assert len({len(cell) for cell in numbers}) <= 1, shown
    assert all(cell.strip() and not cell.startswith(" ") for cell in cells if cell not in numbers), shown


def test_each_task_log_opens_with_its_intent_and_ends_with_a_table_linking_the_run(
        harvest, portal_server, db, samples, caplog, monkeypatch, tmp_path, request):
    from harvester.store import vector_check

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", BASE_URL)
    monkeypatch.setenv("HARVESTER_MODEL_CACHE", str(tmp_path / "models"))  # the model's first use here
    vector_check.reset_cache()  # as in a task's own process: pgvector checked once, at its start
    from harvester.embeddings import local as local_model

    # An earlier test of this session may have loaded the model in this process; a task's process has not.
    local_model._onnx_encoder.cache_clear()
    # and the model it loads here, from a cache in tmp_path, is not left to the session's later tests
    request.addfinalizer(local_model._onnx_encoder.cache_clear)
    records = samples("data-birmingham-gov-uk.jsonl")[:30]
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    caplog.set_level(logging.INFO)

    assert harvest.run(full_sync=True).state == "success"

    run_id = db.execute("SELECT run_id FROM sync_runs").fetchone()[0]
    logs = task_logs(caplog.records)
    assert set(logs) == set(TASKS)
    for task in TASKS:
        lines = [r.getMessage() for r in logs[task] if r.levelno >= logging.INFO]
        shown = "\n".join(lines)
        # First: one line saying what the task will do, before any other of its lines.
        assert lines[0].startswith(f"{task}: ") and "\n" not in lines[0] and len(lines[0]) <= 200, shown
        assert logs[task][0].name == "harvester.pipeline.tasks", shown
        # Last: the aligned table, each row short, the run's page under Airflow's [api] base_url last.
        table = summary_table(task, lines)
        rows = table[1:]
        assert rows and all(row.startswith("  ") and len(row) <= MAX_LINE for row in rows), shown
        assert_aligned(rows)
        assert re.fullmatch(rf"  run page\s+{re.escape(BASE_URL)}/harvester/runs/{run_id}", rows[-1]), shown
        # Nothing that every task says without news, at INFO.
        assert not [line for line in lines if "schema migrations: up to date" in line
                    or "pgvector builds and searches" in line], shown
        assert not [line for line in lines if "so far" in line], shown

    # The listing's last line says what it listed, whole (not "... requests so far").
    fetch = [r.getMessage() for r in logs["fetch_modified"]]
    assert any(m.endswith(f": listing done: {len(records)} records in 1 request") for m in fetch), fetch
    table = dict(re.match(r"  (\S+(?: \S+)*)\s+(.*)", row).groups() for row in
                 summary_table("upsert", [r.getMessage() for r in logs["upsert"]])[1:])
    stats = db.execute("SELECT stats FROM sync_runs").fetchone()[0]
    assert table["created"] == f"{stats['created']:,}" and table["fetched"] == f"{stats['fetched']:,}"
    # The model's first use: its export, step by step with the time spent and an ETA, not silence.
    export = [r.getMessage() for r in logs["embed_changed"] if "for ONNX Runtime" in r.getMessage()]
    steps = [m for m in export if ": step " in m]
    assert len(steps) >= 6 and ": step 1 of 6, loading the model with PyTorch (" in steps[0], export
    assert all("ETA about" in m for m in steps[1:]), export
