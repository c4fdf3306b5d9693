"""The one output of every benchmark scenario: markdown tables printed as they are measured, and
with `--json PATH` the same rows (raw values, not the printed strings) and notes in one JSON file."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, TextIO

ROOT = Path(__file__).resolve().parents[1]
SECRET_FLAGS = ("--admin-token", "--api-key")
REDACTED = "<redacted>"


@dataclass(frozen=True)
class Column:
    """A row's `key`, printed under `header` with `fmt` (str.format; a missing or None value prints as -,
    a string as it is: a ratio row's "1.20x" under a number's column); right-aligned when `right`, by
    default when it has a format of its own (a number)."""

    key: str
    header: str
    fmt: str = "{}"
    right: Optional[bool] = None

    @property
    def rule(self) -> str:
        return "---:" if (self.fmt != "{}" if self.right is None else self.right) else "---"

    def cell(self, row: dict) -> str:
        value = row.get(self.key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return value if isinstance(value, str) else self.fmt.format(value)


@dataclass
class Table:
    """Rows of one measurement; columns as Column or (key, header[, fmt]). Formatted columns print right-aligned."""

    title: str
    columns: list
    rows: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.columns = [c if isinstance(c, Column) else Column(*c) for c in self.columns]

    def add(self, **row: Any) -> dict:
        self.rows.append(row)
        return row

    def markdown(self) -> str:
        lines = ["| " + " | ".join(c.header for c in self.columns) + " |",
                 "|" + "|".join(c.rule for c in self.columns) + "|"]
        lines += ["| " + " | ".join(c.cell(r) for c in self.columns) + " |" for r in self.rows]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"title": self.title, "columns": [{"key": c.key, "header": c.header} for c in self.columns],
                "rows": [{k: _plain(v) for k, v in r.items()} for r in self.rows]}


def _plain(value: Any) -> Any:
    """JSON has no NaN or infinity: null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def redacted_argv(argv: list[str]) -> list[str]:
    """argv with the values of --admin-token and --api-key replaced: no secret belongs in a
    benchmark artifact (results are pasted into docs and tickets)."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg in SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif arg.startswith(tuple(f + "=" for f in SECRET_FLAGS)):
            out.append(arg.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(arg)
    return out


def commit() -> str:
    got = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return got.stdout.strip() or "?"


class Output:
    """What a scenario reports: `table` prints a Table (its title, then markdown) and keeps it; `note`
    prints a line (a verdict, a ratio, the setup) and keeps it; `data` holds raw records a scenario
    keeps beside its tables (JSON-able); `write_json` writes all kept."""

    def __init__(self, scenario: str, argv: list[str], stream: Optional[TextIO] = None):
        self.scenario, self.argv = scenario, list(argv)
        self.stream = stream or sys.stdout
        self.started = datetime.now(timezone.utc)
        self.tables: list[Table] = []
        self.notes: list[str] = []
        self.data: dict[str, Any] = {}

    def table(self, table: Table) -> Table:
        self.tables.append(table)
        print(f"\n{table.title}\n\n{table.markdown()}\n" if table.title else f"\n{table.markdown()}\n",
              file=self.stream, flush=True)
        return table

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(text, file=self.stream, flush=True)

    def to_json(self) -> dict:
        return {"scenario": self.scenario, "argv": redacted_argv(self.argv), "commit": commit(),
                "started": self.started.isoformat(timespec="seconds"),
                "tables": [t.to_json() for t in self.tables], "notes": self.notes, "data": _plain(self.data)}

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1, default=str) + "\n")
