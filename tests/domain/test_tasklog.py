"""What task logs say (pure): progress lines with rate and ETA, and the aligned summary table (issue 38, finding 7)."""
from harvester.domain import tasklog
from harvester.domain.tasklog import Progress, progress_line, table


class Log:
    def __init__(self):
        self.lines = []

    def info(self, fmt, *args):
        self.lines.append(fmt % args)


def test_progress_lines_are_bounded_in_time_and_say_done_total_rate_and_eta():
    now = [0.0]
    log = Log()
    progress = Progress("embedding texts", 100, log, every_seconds=5, clock=lambda: now[0])
    for second in range(1, 5):  # many batches within the interval: no line
        now[0] = float(second)
        progress.advance(5)
    assert log.lines == []
    now[0] = 10.0
    progress.advance(30)
    assert log.lines == ["embedding texts: 50 of 100 (50%), 5.0/s, ETA 10.0 s"]
    now[0] = 11.0
    progress.advance(10)  # a second later: still the one line
    assert len(log.lines) == 1 and progress.lines == 1


def test_an_estimated_total_says_about_for_the_total_and_the_eta():
    line = progress_line("listing records of socrata", 2_000, 10_000, 20.0, exact=False, unit="records")
    assert line == "listing records of socrata: 2,000 of about 10,000 records (~20%), 100/s, ETA about 1m 20s"
    # past an estimate: no made-up time
    assert tasklog.eta(12_000, 10_000, 10.0, exact=False) == "ETA unknown (past the portal's estimate)"


def test_without_a_total_there_is_no_eta_and_nothing_says_so_far():
    line = progress_line("listing records of dcat", 1_234, None, 61.0)
    assert line == "listing records of dcat: 1,234 in 1m 01s, 20.2/s (no total known: no ETA)"
    assert "so far" not in line


def test_durations_rates_and_sizes_read_as_people_write_them():
    assert [tasklog.duration(s) for s in (0.04, 12.34, 125, 3725)] == ["0.0 s", "12.3 s", "2m 05s", "1h 02m"]
    assert [tasklog.rate(d, s) for d, s in ((5, 2), (123_456, 10), (1, 0))] == ["2.5/s", "12,346/s", "-"]
    assert [tasklog.size(n) for n in (512, 81_222, 12 * 1024 ** 2)] == ["512 B", "79.3 KiB", "12.0 MiB"]
    assert tasklog.eta(0, 100, 3.0) is None and tasklog.eta(5, None, 3.0) is None


def test_the_summary_table_aligns_labels_and_numbers():
    lines = table("fetch_modified of run 7 (demo) done in 3.2 s", [
        ("fetched", 12_345), ("failed", 0), ("received", "79.3 KiB"), ("complete", True), ("skipped", None),
        ("run page", "http://localhost:8080/harvester/runs/7")])
    assert lines == [
        "fetch_modified of run 7 (demo) done in 3.2 s",
        "  fetched   12,345",
        "  failed         0",
        "  received  79.3 KiB",
        "  complete  yes",
        "  skipped   -",
        "  run page  http://localhost:8080/harvester/runs/7",
    ]


def test_a_long_row_is_cut_for_the_log_viewer_but_a_link_never_is():
    link = "http://airflow.example.org/" + "x" * 200
    lines = table("t", [("why", "w" * 300), ("run page", link)])
    assert len(lines[1]) == tasklog.MAX_LINE and lines[1].endswith("…")
    assert lines[2].endswith(link)


def test_a_step_of_a_job_with_estimated_shares_says_about_and_no_eta_before_anything_is_measured():
    what = "exporting local model m for ONNX Runtime"
    assert tasklog.step_line(what, 1, 6, "loading the model", 0.0, 0.0) == \
        "exporting local model m for ONNX Runtime: step 1 of 6, loading the model (0.0 s in)"
    assert tasklog.step_line(what, 2, 6, "tracing it", 9.3, 0.31) == \
        "exporting local model m for ONNX Runtime: step 2 of 6, tracing it (9.3 s in, ETA about 20.7 s)"
