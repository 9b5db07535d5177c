"""The table ``gpudoctor bench run`` prints at the end, as SGLang's bench_serving does:
one row per cell of the plan with output tok/s, TTFT and TPOT p50/p99 and errors."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.bench.results.reader import CellResult, ResultsError, read_run

if TYPE_CHECKING:
    from gpudoctor.bench.plan import Plan

COLUMNS = ("config", "TP", "c", "status", "out tok/s", "TTFT p50", "TTFT p99",
           "TPOT p50", "TPOT p99", "errors")  # fmt: skip


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def row(cell: CellResult) -> tuple[str, ...]:
    """Return one table row (latencies in ms; ``errors`` = failed requests of the cell)."""
    head = (cell.config, str(cell.tp), str(cell.concurrency), cell.status)
    if not cell.ok:
        return (*head, *("-",) * 6)
    measurement = cell.measurement or {}
    failed = cell.failed_requests()
    total = measurement.get("num_prompts")
    errors = f"{failed}/{total}" if failed and total else str(failed)
    return (*head, _num(cell.value("output_throughput"), 1),
            _num(cell.value("median_ttft_ms"), 1), _num(cell.value("p99_ttft_ms"), 1),
            _num(cell.value("median_tpot_ms"), 2), _num(cell.value("p99_tpot_ms"), 2),
            errors)  # fmt: skip


def results_table(run_dir: Path, plan: Plan | None = None) -> str:
    """Return the run's cells as a fixed-width text table (the plan's cells, in plan order,
    when ``plan`` is given; latencies in ms). A missing results file gives one line."""
    try:
        run = read_run(run_dir)
    except ResultsError as exc:
        return f"(no results: {exc})"
    cells = list(run.cells)
    if plan is not None:
        by_key = {c.key: c for c in cells}
        cells = [by_key[c.key] for c in plan.cells() if c.key in by_key]
    title = f"{'=' * 10} gpudoctor bench: {Path(run_dir)} (latencies in ms) {'=' * 10}"
    return "\n".join([title, format_table(COLUMNS, [row(c) for c in cells])])


def format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Return a plain fixed-width table (first column left-aligned, the others right):
    no escape sequences, whatever the terminal, so it pastes into notes and logs."""
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = []
    for number, r in enumerate(table):
        cells = (v.ljust(w) if i == 0 else v.rjust(w)
                 for i, (v, w) in enumerate(zip(r, widths, strict=True)))  # fmt: skip
        lines.append("  ".join(cells).rstrip())
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
