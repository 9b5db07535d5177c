"""Read a run directory's ``results.jsonl`` (one cell per line) for the report and compare.

Each line holds at least ``{"key", "config", "tp", "concurrency", "status",
"measurement"}``, ``measurement`` being what ``loadgen.measure_cell`` returned. The file
is append-only and resumable: when a key appears again, the later line wins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS_FILE = "results.jsonl"


class ResultsError(Exception):
    """A run directory cannot be read (one-line message for the CLI)."""


@dataclass(frozen=True)
class CellResult:
    """One cell of a run: its place in the matrix, its status and its measurement."""

    key: str
    config: str
    tp: int
    concurrency: int
    status: str
    measurement: dict[str, Any] | None

    @property
    def ok(self) -> bool:
        """Return True when the cell ran and has a measurement."""
        return self.status == "ok" and self.measurement is not None

    def value(self, name: str) -> float | None:
        """Return a metric (``metrics[name]``, or ``accept_length``), None when absent."""
        if not self.ok:
            return None
        assert self.measurement is not None
        if name == "accept_length":
            value = self.measurement.get("accept_length")
        else:
            value = (self.measurement.get("metrics") or {}).get(name)
        return float(value) if isinstance(value, (int, float)) else None

    def failed_requests(self) -> int:
        """Return the number of failed requests in the cell (0 when not measured)."""
        if not self.ok:
            return 0
        assert self.measurement is not None
        return sum((self.measurement.get("errors") or {}).values())


def load_results(run_dir: Path) -> list[CellResult]:
    """Return the cells of ``run_dir/results.jsonl`` in first-seen order (later lines win).

    A torn last line (no final newline, not JSON: a crash mid-write) is ignored. Raises
    ResultsError when the file is missing, another line is not JSON, or a line lacks a
    required field (the message names the file and line).
    """
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        raise ResultsError(f"{path}: no such file (is {run_dir} a bench run directory?)")
    cells: dict[str, CellResult] = {}
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not text.endswith("\n"):
                break  # a write torn by a crash: the launcher reruns that cell
            raise ResultsError(f"{path}:{number}: not JSON ({exc.msg})") from exc
        try:
            cell = CellResult(
                key=str(row["key"]),
                config=str(row["config"]),
                tp=int(row["tp"]),
                concurrency=int(row["concurrency"]),
                status=str(row["status"]),
                measurement=row.get("measurement"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultsError(f"{path}:{number}: bad cell record ({exc!r})") from exc
        cells[cell.key] = cell  # a later line for the same key replaces the earlier one
    return list(cells.values())
