"""`harvester export` into a directory: the manifest describes the files beside it or is absent at
every moment (real exports killed with SIGKILL at random instants), an earlier export's files of
another format or leftover temporary files are not left unlisted, and no symbolic link inside the
directory is followed (issue 36)."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harvester.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
FORMATS = ("parquet", "csv", "jsonl")
DATA_NAMES = {f"{what}.{fmt}" for what in ("datasets", "changes") for fmt in FORMATS}


def fill(url: str, n: int) -> None:
    """``n`` synthetic datasets with raw records, by the export bench's set-based SQL."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import export_bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    export_bench.fill(url, n)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def check_invariant(directory: Path) -> str:
    """Asserts that manifest.json is absent, or lists exactly the data files beside it, each with its
    size and SHA-256; 'absent' or 'whole'."""
    names = {p.name for p in directory.iterdir()}
    if "manifest.json" not in names:
        return "absent"
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    listed = {item["path"] for item in manifest["files"]}
    for item in manifest["files"]:
        path = directory / item["path"]
        assert path.is_file() and not path.is_symlink(), f"the manifest lists {path}, which is not there"
        assert path.stat().st_size == item["bytes"], f"the manifest describes another {path} (size)"
        assert sha256(path) == item["sha256"], f"the manifest describes another {path} (SHA-256)"
    visible = {name for name in names if not name.startswith(".")}
    assert visible == listed | {"manifest.json"}, f"files beside the manifest it does not list: {visible - listed}"
    return "whole"


class Watcher:
    """Sees, by polling the directory, when an export starts changing what the manifest describes:
    the manifest replaced or gone, or a data file created or replaced."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.before = self._state()

    def _state(self) -> dict[str, int]:
        state = {}
        for name in ("manifest.json", *DATA_NAMES):
            try:
                state[name] = os.stat(self.directory / name, follow_symlinks=False).st_ino
            except FileNotFoundError:
                pass
        return state

    def changed(self) -> bool:
        return self._state() != self.before


def run_export(directory: Path, fmt: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins"), "_AIRFLOW__AS_LIBRARY": "1"}
    return subprocess.Popen([sys.executable, "-m", "harvester.cli.main", "export", "datasets", "--format", fmt,
                             "--include-removed", "--raw", "--force", "--output", str(directory)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.slow  # 26 real exports of about 70 MB: 40-55 s each case on two cores
@pytest.mark.parametrize("formats", [("jsonl",), FORMATS], ids=["same-format", "formats-in-turn"])
def test_killed_exports_leave_a_manifest_that_matches_or_none(database_url, db, tmp_path, formats):
    """Real exports (10,000 datasets with their raw records: tens of MB) killed with SIGKILL: at a
    random instant of the whole run, or a random instant in the first 30 ms after the directory's
    files start changing (where a data file replaced before its manifest is seen). After each kill,
    and after each export that ended first, the manifest matches the files beside it, or is absent."""
    fill(database_url, 10_000)
    out = tmp_path / "out"
    started = time.monotonic()
    first = run_export(out, formats[-1])
    assert first.wait(timeout=120) == 0, first.stderr.read().decode()
    duration = time.monotonic() - started
    assert check_invariant(out) == "whole"

    rng = random.Random(36)
    seen = []
    for turn in range(12):
        fmt = formats[turn % len(formats)]
        # each export's bytes differ from the one before (the same rows would make the same file)
        db.execute("UPDATE datasets SET title = %s WHERE id = (SELECT min(id) FROM datasets)", (f"turn {turn}",))
        watcher = Watcher(out)
        proc = run_export(out, fmt)
        if turn % 2:  # any instant of the run
            time.sleep(rng.uniform(0, duration))
        else:  # soon after the files start changing
            deadline = time.monotonic() + 120
            while not watcher.changed() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.0005)
            time.sleep(rng.uniform(0, 0.03))
        proc.send_signal(signal.SIGKILL)
        code = proc.wait(timeout=60)
        assert code in (0, -signal.SIGKILL), proc.stderr.read().decode()
        seen.append((fmt, "killed" if code else "ended", check_invariant(out)))

    # an export that runs to its end removes whatever the killed ones left: temporary files included
    last = run_export(out, formats[0])
    assert last.wait(timeout=120) == 0, last.stderr.read().decode()
    assert check_invariant(out) == "whole"
    assert sorted(p.name for p in out.iterdir()) == [f"datasets.{formats[0]}", "manifest.json"], seen
    assert any(state == "killed" for _, state, _ in seen), seen


def _plant(tmp_path: Path, out: Path, name: str, target_exists: bool) -> Path:
    target = tmp_path / "elsewhere" / "precious.txt"
    target.parent.mkdir(exist_ok=True)
    if target_exists:
        target.write_text("not the export's to touch\n")
    out.mkdir(exist_ok=True)
    os.symlink(target, out / name)
    return target


@pytest.mark.parametrize("target_exists", [True, False], ids=["to-a-file", "dangling"])
@pytest.mark.parametrize("name", [".datasets.csv.partial", "datasets.csv", ".manifest.json.partial",
                                  "manifest.json", "datasets.jsonl"])
def test_a_symbolic_link_in_the_directory_is_refused_and_its_target_untouched(
        database_url, tmp_path, capsys, name, target_exists):
    """A link planted at the temporary or the final name of the data file or the manifest (or of a
    stale file the export would remove) is refused, naming it, with --force too; the link stays and
    its target is neither written, created nor removed; nothing else is written."""
    fill(database_url, 20)
    out = tmp_path / "out"
    target = _plant(tmp_path, out, name, target_exists)
    assert main(["export", "datasets", "--format", "csv", "--force", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out / name} is a symbolic link" in err, err
    assert (out / name).is_symlink() and os.readlink(out / name) == str(target)
    if target_exists:
        assert target.read_text() == "not the export's to touch\n"
    else:
        assert not target.exists()
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_an_earlier_export_leaves_no_stale_file(database_url, tmp_path, capsys):
    """--force replaces an earlier export whatever its format (or what it exported): its data file
    goes with its manifest, and temporary files a killed export left go too. Without --force any of
    an earlier export's files is refused, naming it, even without its manifest."""
    fill(database_url, 30)
    out = tmp_path / "out"
    assert main(["export", "datasets", "--format", "csv", "--output", str(out)]) == 0
    (out / ".datasets.jsonl.partial").write_text("left by a killed export")
    (out / ".manifest.json.partial").write_text("{")
    assert main(["export", "datasets", "--format", "parquet", "--force", "--output", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["datasets.parquet", "manifest.json"]
    assert check_invariant(out) == "whole"

    assert main(["export", "changes", "--format", "jsonl", "--force", "--output", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["changes.jsonl", "manifest.json"]
    assert check_invariant(out) == "whole"
    capsys.readouterr()

    # a data file without its manifest (an export killed after renaming it): refused without --force
    (out / "manifest.json").unlink()
    assert main(["export", "datasets", "--format", "csv", "--output", str(out)]) == 2
    assert f"{out / 'changes.jsonl'} exists already" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["changes.jsonl"]


def test_the_output_directory_may_be_a_link_and_one_export_writes_at_a_time(database_url, tmp_path, capsys):
    """--output naming a symbolic link to a directory writes into that directory (the user's choice);
    while another export holds the directory's lock, an export is refused, naming the directory."""
    fill(database_url, 10)
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert main(["export", "datasets", "--format", "jsonl", "--output", str(link)]) == 0
    assert sorted(p.name for p in real.iterdir()) == ["datasets.jsonl", "manifest.json"]
    assert check_invariant(real) == "whole"
    capsys.readouterr()

    held = os.open(real, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert main(["export", "datasets", "--format", "csv", "--force", "--output", str(real)]) == 2
        assert f"another export is writing into {real}" in capsys.readouterr().err
    finally:
        os.close(held)
    assert sorted(p.name for p in real.iterdir()) == ["datasets.jsonl", "manifest.json"]
