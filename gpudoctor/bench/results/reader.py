"""Read a run directory's ``results.jsonl`` (one cell per line) for the report and compare.

Each line holds at least ``{"key", "config", "tp", "concurrency", "status",
"measurement"}``, ``measurement`` being what ``loadgen.measure_cell`` returned. The file
is append-only and resumable: when a key appears again, the later line wins.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor import fsio
from gpudoctor.bench.cell_spec import INF, rate_from_json, rate_label
from gpudoctor.bench.results.verdict import client_bound, judge, suspect

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
    request_rate: float | None = None
    repeat: int = 0
    group: str = ""
    search: str | None = None
    extra: dict[str, Any] | None = None  # reason, server_log_tail: what the HTML report shows
    gpus: tuple[str, ...] = ()  # the UUIDs of the GPUs its server ran on (packed runs)
    slot: int | None = None  # the launcher's slot number

    @property
    def load(self) -> tuple[int, float]:
        """Return the cell's load for sorting: (concurrency, request rate; closed loop last)."""
        return (self.concurrency, INF if self.request_rate is None else self.request_rate)

    @property
    def load_label(self) -> str:
        """Return ``c=4`` or ``c=4 r=2`` (the rate when the cell has one)."""
        if self.request_rate is None:
            return f"c={self.concurrency}"
        return f"c={self.concurrency} r={rate_label(self.request_rate)}"

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
    def reason(self) -> str:
        """Return why the cell is not ok, or the failures an ok cell tolerated ("" if none)."""
        return str((self.extra or {}).get("reason") or "")

    @property
    def first_error(self) -> str | None:
        """Return the first failed request's message, verbatim (None when none failed)."""
        first = (self.measurement or {}).get("first_error")
        if isinstance(first, dict) and first.get("message"):
            return str(first["message"])
        warm = ((self.measurement or {}).get("client") or {}).get("warmup") or {}
        return str(warm["first_error"]) if warm.get("first_error") else None

    def flag(self, name: str) -> str | None:
        """Return why the cell is flagged ``client_bound`` or ``suspect``, None if not."""
        value = (self.extra or {}).get(name)
        return str(value) if value else None

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
class SearchLine:
    """A ``[search]`` result of one configuration (``"record": "search"`` lines).

    Attributes:
        search: the search table as recorded: ``over``, ``slo``, ``goodput``, ``low``,
            ``high``, ``tolerance``, ``met``, ``failed``, ``probes``.
    """

    key: str
    config: str
    tp: int
    status: str
    search: dict[str, Any]
    reason: str = ""

    @property
    def label(self) -> str:
        """Return ``config (TPn)``."""
        return f"{self.config} (TP{self.tp})"


@dataclass(frozen=True)
class RunResults:
    """The readable cells of a run, its search results and the corrupt lines skipped."""

    path: Path
    cells: tuple[CellResult, ...]
    skipped: tuple[SkippedLine, ...] = ()
    searches: tuple[SearchLine, ...] = ()

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


def _status(row: dict, measurement: dict | None) -> tuple[str, str]:
    """Return the cell's status and reason; a record written before verdicts existed
    (``ok`` without a ``verdict``) is judged from its measurement now, so an old run whose
    requests all failed never reads as ok (issue 31)."""
    status, reason = str(row["status"]), str(row.get("reason") or "")
    legacy = not isinstance(row.get("verdict"), dict)
    counted = measurement is not None and "completed" in measurement and "errors" in measurement
    if status == "ok" and legacy and counted:
        verdict = judge(measurement)
        if verdict.status == "failed":
            return "failed", verdict.reason
    return status, reason


def cell_flags(measurement: dict[str, Any] | None) -> dict[str, str]:
    """Return what qualifies a measured cell's numbers: ``{"client_bound": why,
    "suspect": why}``, only the flags that apply (empty for a clean cell)."""
    if not measurement:
        return {}
    flags = {"client_bound": client_bound(measurement), "suspect": suspect(measurement)}
    return {k: v for k, v in flags.items() if v}


METRIC_BOUND = 1e18  # no measurement reaches it; a chart's axis arithmetic stays finite


def _finite(value: object) -> bool:
    """Return True for a number a chart and a table can show: finite (``1e400`` parses as
    inf) and below :data:`METRIC_BOUND` in size."""
    try:
        return _number(value) and abs(float(value)) < METRIC_BOUND  # type: ignore[arg-type]
    except OverflowError:  # an integer beyond any float
        return False


def _check_numbers(row: dict) -> None:
    """Raise ValueError naming the field when the matrix place (``tp``, ``concurrency``) is
    not a whole finite number, or a metric or ``accept_length`` is a non-finite number."""
    for name in ("tp", "concurrency"):
        value = row.get(name)
        if not _finite(value) or float(value) != int(value) or not 0 <= value < 1 << 31:  # type: ignore[arg-type]
            raise ValueError(f"{name} {str(value)[:40]} is not a whole number in range")
    measurement = row.get("measurement")
    if not isinstance(measurement, dict):
        return
    metrics = measurement.get("metrics") or {}
    if not isinstance(metrics, dict):
        raise TypeError("measurement metrics is not a table")
    for name, value in (*metrics.items(), ("accept_length", measurement.get("accept_length"))):
        if _number(value) and not _finite(value):
            raise ValueError(f"metric {name} is {str(value)[:40]}, not a finite number below 1e18")


def _cell(row: object) -> CellResult:
    if not isinstance(row, dict):
        raise TypeError(f"a JSON {type(row).__name__}, not an object")
    _check_numbers(row)
    key = str(row["key"])
    group = row.get("group")
    tail = row.get("server_log_tail")
    measurement = row.get("measurement") if isinstance(row.get("measurement"), dict) else None
    status, reason = _status(row, measurement)
    return CellResult(
        key=key,
        config=str(row["config"]),
        tp=int(row["tp"]),
        concurrency=int(row["concurrency"]),
        status=status,
        measurement=measurement,
        raw=row.get("raw") if isinstance(row.get("raw"), str) else None,
        request_rate=rate_from_json(row.get("request_rate")),
        repeat=int(row.get("repeat") or 0),
        group=group if isinstance(group, str) else key,
        search=row.get("search") if isinstance(row.get("search"), str) else None,
        extra={"reason": reason,
               "server_log_tail": [str(x) for x in tail] if isinstance(tail, list) else [],
               **cell_flags(measurement)},
        gpus=tuple(str(g) for g in row.get("gpus") or () if isinstance(g, str)),
        slot=row["slot"] if isinstance(row.get("slot"), int) else None,
    )  # fmt: skip


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _search(row: dict) -> SearchLine:
    data = row["search"]
    if not isinstance(data, dict):
        raise TypeError("a search record without its search table")
    for name in ("met", "failed"):
        if data.get(name) is not None and not _number(data[name]):
            raise TypeError(f"search {name} {data[name]!r} is not a number")
    slo = data.get("slo")
    if slo is not None and not (
        isinstance(slo, dict) and all(v is None or _number(v) for v in slo.values())
    ):
        raise TypeError("search slo is not a table of numbers")
    if not isinstance(data.get("probes") or [], list):
        raise TypeError("search probes is not a list")
    return SearchLine(str(row["key"]), str(row["config"]), int(row["tp"]), str(row["status"]),
                      data, str(row.get("reason") or ""))  # fmt: skip


def read_run(run_dir: Path) -> RunResults:
    """Return the cells of ``run_dir/results.jsonl`` in first-seen order (later lines win).

    A line that is not JSON or not a cell record (a torn write, a disk error, an edit) is
    skipped and listed in ``skipped``; the lines after it are kept. A torn last line (no
    final newline) is ignored silently: the launcher reruns that cell. Raises
    ResultsError only when the file is missing or unreadable.
    """
    path = Path(run_dir) / RESULTS_FILE
    try:  # never through a symlink (a planted results.jsonl -> /etc/shadow is refused)
        text = fsio.read_regular(path, follow_dir_link=True).decode("utf-8", "replace")
    except FileNotFoundError:
        if os.path.lexists(Path(run_dir) / "plan.toml"):  # a launch that has measured nothing yet
            raise ResultsError(
                f"{run_dir}: no cell has finished yet (no {RESULTS_FILE}); run this again once"
                f" one has (gpudoctor bench status {run_dir} shows the progress)"
            ) from None
        raise ResultsError(f"{path}: no such file (is {run_dir} a bench run directory?)") from None
    except fsio.FsioError as exc:
        raise ResultsError(str(exc)) from None
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    cells: dict[str, CellResult] = {}
    searches: dict[str, SearchLine] = {}
    skipped: list[SkippedLine] = []
    lines = text.split("\n")
    torn = lines.pop()  # "" when the file ends with a newline, else an unfinished write
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if isinstance(row, dict) and row.get("record") == "search":
                found = _search(row)
                searches[found.key] = found
                continue
            cell = _cell(row)
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
    return RunResults(path, tuple(cells.values()), tuple(skipped), tuple(searches.values()))


def load_results(run_dir: Path) -> list[CellResult]:
    """Return the readable cells of ``run_dir/results.jsonl`` (see :func:`read_run`)."""
    return list(read_run(run_dir).cells)
