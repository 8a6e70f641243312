"""How the CLI prints: JSON (--json), tables and text (rich), times."""
from __future__ import annotations

import json
import sys
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Sequence


def jsonable(value):
    """The JSON form of what json cannot write itself: ISO times and dates, numbers, else text."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    return str(value)


def print_json(data) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=jsonable))


def console(min_width: int = 100):
    from rich.console import Console

    return Console(width=max(min_width, Console().width), highlight=False)


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence]) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Table(title=title, show_lines=False)
    for column in columns:
        out.add_column(column, overflow="fold")
    for row in rows:
        out.add_row(*["" if v is None else (v.strftime("%Y-%m-%d %H:%M:%S") if isinstance(v, datetime) else str(v))
                      for v in row])
    Console(width=max(100, Console().width)).print(out)


def when(value: datetime | None) -> str:
    """A time in UTC to the second ("-" for none)."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if value else "-"


def short(value: datetime) -> str:
    """A time in UTC to the minute."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M")


def error(message: str) -> int:
    """Say what is wrong on standard error, as argparse does; the exit code for it (2)."""
    print(f"harvester: error: {message}", file=sys.stderr)
    return 2
