"""What a task log says, as text: progress lines of long steps and the summary table a task ends with.

Pure (no Airflow, no database): the Airflow glue (pipeline/tasks.py) and the steps hand it numbers
and log the lines it returns. The rules users read logs by:

- a progress line says done/total, the rate per second and the time left: ``listing records of
  demo: 1,200 of 5,000 (24%), 40.0/s, ETA 1m 35s``; at most one every ``every_seconds``, whatever
  the number of pages (bounded noise);
- a total the portal estimated or capped (a count that is not exact) is written ``about 5,000``,
  and so is an ETA worked out from it; with no total there is no ETA, and nothing says "so far";
- a summary table is a title and one row per figure, labels padded to one width and numbers
  right-aligned in one column, each row short enough for Airflow's log viewer.
"""
from __future__ import annotations

import time
from typing import Iterable, Sequence

PROGRESS_EVERY_SECONDS = 10.0  # at most one progress line this often (per step)
MAX_LINE = 120  # a table row longer than this is cut, with an ellipsis (the log viewer cuts it anyway)


def count(n: int | float) -> str:
    """``1234567`` -> ``1,234,567``."""
    return f"{int(n):,}"


def duration(seconds: float) -> str:
    """``0.4 s``, ``12.3 s``, ``2m 05s``, ``1h 02m``: short, and exact enough for a log."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def rate(done: int, seconds: float) -> str:
    """Items per second: ``40.0/s``, ``1,234/s``; ``-`` before any time has passed."""
    if seconds <= 0:
        return "-"
    per = done / seconds
    return f"{per:,.0f}/s" if per >= 100 else f"{per:.1f}/s"


def eta(done: int, total: int | None, seconds: float, *, exact: bool = True) -> str | None:
    """The time left at the rate so far: ``ETA 1m 35s``, ``ETA about 1m 35s`` from a total that
    is not exact; None without a total or a rate (nothing to say). Past the total: ``ETA 0.0 s``
    (exact) or ``ETA unknown`` (an estimate turned out low)."""
    if not total or done <= 0 or seconds <= 0:
        return None
    left = total - done
    if left <= 0:
        return "ETA 0.0 s" if exact else "ETA unknown (past the portal's estimate)"
    return f"ETA {'' if exact else 'about '}{duration(left * seconds / done)}"


def size(n: int | float) -> str:
    """Bytes in the largest binary unit that keeps a number of at least 1: ``79.3 KiB``, ``12.0 MiB``."""
    n = float(max(0, n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # (not reached)


def progress_line(what: str, done: int, total: int | None, seconds: float, *, exact: bool = True,
                  unit: str = "") -> str:
    """One progress line: ``what: done of total (pct), rate, ETA``; ``of about total`` and ``ETA
    about`` when the total is not exact; only ``done`` and the rate without a total."""
    noun = f" {unit}" if unit else ""
    if total:
        pct = 100.0 * done / total
        share = f"{min(pct, 100.0):.0f}%" if exact else f"~{pct:.0f}%"
        text = (f"{what}: {count(done)} of {'' if exact else 'about '}{count(total)}{noun} ({share}), "
                f"{rate(done, seconds)}")
        left = eta(done, total, seconds, exact=exact)
        return f"{text}, {left}" if left else text
    return f"{what}: {count(done)}{noun} in {duration(seconds)}, {rate(done, seconds)} (no total known: no ETA)"


def step_line(what: str, step: int, steps: int, name: str, seconds: float, share: float) -> str:
    """A step of a job whose steps' shares of the whole are known only roughly (``share``: the part
    done before this step): ``exporting m: step 2 of 6, tracing (9.3 s in, ETA about 20.7 s)``; no
    ETA at the first step (nothing measured yet)."""
    text = f"{what}: step {step} of {steps}, {name} ({duration(seconds)} in"
    if 0 < share < 1 and seconds > 0:
        text += f", ETA about {duration(seconds * (1 - share) / share)}"
    return text + ")"


class Progress:
    """Progress of a long step, logged as it advances: at most one line every ``every_seconds``
    (whatever the number of pages or batches), each with done/total, rate and ETA. ``total`` may be
    set or changed as it becomes known (a portal's count in its first answer), ``exact`` saying
    whether it is the exact number (else: "about")."""

    def __init__(self, what: str, total: int | None, log, *, exact: bool = True, unit: str = "",
                 every_seconds: float = PROGRESS_EVERY_SECONDS, clock=time.monotonic):
        self.what, self.total, self.exact, self.unit = what, total, exact, unit
        self.log, self.every, self.clock = log, every_seconds, clock
        self.done = 0
        self.lines = 0  # how many progress lines were logged
        self.started = self._last = clock()

    def set_total(self, total: int | None, exact: bool = True) -> None:
        """The total as the source now tells it (None: leave what was known)."""
        if total:
            self.total, self.exact = total, exact

    def advance(self, n: int) -> None:
        self.done += n
        now = self.clock()
        if now - self._last >= self.every:
            self._last = now
            self.lines += 1
            self.log.info("%s", self.line(now))

    def seconds(self, now: float | None = None) -> float:
        return max((now if now is not None else self.clock()) - self.started, 0.0)

    def line(self, now: float | None = None) -> str:
        return progress_line(self.what, self.done, self.total, self.seconds(now), exact=self.exact, unit=self.unit)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return count(value)
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def table(title: str, rows: Iterable[Sequence]) -> list[str]:
    """A summary table as lines: ``title``, then one line per (label, value) row, indented two
    spaces, labels padded to the longest, numbers right-aligned in one column, other values
    (text, a size, a link) starting where the numbers' column starts. A row longer than MAX_LINE
    is cut with an ellipsis; a link is never cut (it would not open)."""
    rows = [(str(label), value) for label, value in rows]
    width = max((len(label) for label, _ in rows), default=0)
    numbers = max((len(_cell(v)) for _, v in rows if _is_number(v)), default=0)
    lines = [title]
    for label, value in rows:
        text = _cell(value)
        cell = text.rjust(numbers) if _is_number(value) else text
        line = f"  {label.ljust(width)}  {cell}".rstrip()
        if len(line) > MAX_LINE and "://" not in text:
            line = line[:MAX_LINE - 1] + "…"
        lines.append(line)
    return lines
