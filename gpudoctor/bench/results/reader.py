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
    raw: str | None = None
    gpus: tuple[str, ...] = ()  # the UUIDs of the GPUs its server ran on (packed runs)
    slot: int | None = None  # the launcher's slot number

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

    @property
    def completed(self) -> int:
        """Return the successful requests behind the cell's metrics (0 when not measured)."""
        value = (self.measurement or {}).get("completed") if self.ok else 0
        return int(value) if isinstance(value, int) else 0

    @property
    def run_id(self) -> str | None:
        """Return the measurement's run id (tags its lines in the raw file)."""
        client = (self.measurement or {}).get("client")
        return client.get("run_id") if isinstance(client, dict) else None


@dataclass(frozen=True)
class SkippedLine:
    """A line of results.jsonl that was left out: its number (1-based) and why."""

    number: int
    why: str


@dataclass(frozen=True)
class RunResults:
    """The readable cells of a run and the corrupt lines that were skipped."""

    path: Path
    cells: tuple[CellResult, ...]
    skipped: tuple[SkippedLine, ...] = ()

    def warning(self) -> str | None:
        """Return one line naming the skipped lines (None when every line was read)."""
        if not self.skipped:
            return None
        shown = ", ".join(f"line {s.number}: {s.why}" for s in self.skipped[:5])
        more = f", +{len(self.skipped) - 5} more" if len(self.skipped) > 5 else ""
        return (
            f"{self.path}: skipped {len(self.skipped)} corrupt line(s) ({shown}{more}); "
            f"kept the other {len(self.cells)} cell(s)"
        )


def _cell(row: object) -> CellResult:
    if not isinstance(row, dict):
        raise TypeError(f"a JSON {type(row).__name__}, not an object")
    return CellResult(
        key=str(row["key"]),
        config=str(row["config"]),
        tp=int(row["tp"]),
        concurrency=int(row["concurrency"]),
        status=str(row["status"]),
        measurement=row.get("measurement") if isinstance(row.get("measurement"), dict) else None,
        raw=row.get("raw") if isinstance(row.get("raw"), str) else None,
        gpus=tuple(str(g) for g in row.get("gpus") or () if isinstance(g, str)),
        slot=row["slot"] if isinstance(row.get("slot"), int) else None,
    )


def read_run(run_dir: Path) -> RunResults:
    """Return the cells of ``run_dir/results.jsonl`` in first-seen order (later lines win).

    A line that is not JSON or not a cell record (a torn write, a disk error, an edit) is
    skipped and listed in ``skipped``; the lines after it are kept. A torn last line (no
    final newline) is ignored silently: the launcher reruns that cell. Raises
    ResultsError only when the file is missing or unreadable.
    """
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        raise ResultsError(f"{path}: no such file (is {run_dir} a bench run directory?)")
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    cells: dict[str, CellResult] = {}
    skipped: list[SkippedLine] = []
    lines = text.split("\n")
    torn = lines.pop()  # "" when the file ends with a newline, else an unfinished write
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            cell = _cell(json.loads(line))
        except json.JSONDecodeError as exc:
            skipped.append(SkippedLine(number, f"not JSON ({exc.msg})"))
            continue
        except (KeyError, TypeError, ValueError) as exc:
            skipped.append(SkippedLine(number, f"bad cell record ({exc!r})"))
            continue
        cells[cell.key] = cell  # a later line for the same key replaces the earlier one
    if torn.strip():
        try:
            cell = _cell(json.loads(torn))
            cells[cell.key] = cell  # complete, only its newline is missing
        except (ValueError, KeyError, TypeError):
            pass  # a write torn by a crash
    return RunResults(path, tuple(cells.values()), tuple(skipped))


def load_results(run_dir: Path) -> list[CellResult]:
    """Return the readable cells of ``run_dir/results.jsonl`` (see :func:`read_run`)."""
    return list(read_run(run_dir).cells)
