"""The table ``gpudoctor bench run`` prints at the end, as SGLang's bench_serving does:
one row per cell of the plan with output tok/s, TTFT and TPOT p50/p99 and errors.

With a request-rate axis a ``rate`` column shows each cell's rate; with ``repeats``
one row stands for all repeats of a cell: the mean of its measured repeats, ``n`` the
repeats measured, and ``±`` the relative standard deviation of output tok/s across
them. A ``[search]``'s result per configuration follows the table.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpudoctor.bench.cell_spec import rate_label
from gpudoctor.bench.results.reader import CellResult, ResultsError, SearchLine, read_run
from gpudoctor.bench.results.repeats import RepeatGroup, group_cells
from gpudoctor.bench.results.signals_view import table_columns
from gpudoctor.terminal import printable

if TYPE_CHECKING:
    from gpudoctor.bench.plan import Plan

COLUMNS = ("config", "TP", "c", "status", "out tok/s", "TTFT p50", "TTFT p99",
           "TPOT p50", "TPOT p99", "errors")  # fmt: skip
_METRICS = (("output_throughput", 1), ("median_ttft_ms", 1), ("p99_ttft_ms", 1),
            ("median_tpot_ms", 2), ("p99_tpot_ms", 2))  # fmt: skip


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def row(cell: CellResult) -> tuple[str, ...]:
    """Return one table row (latencies in ms; ``errors`` = failed requests of the cell)."""
    flags = [name.replace("_", "-") for name in ("suspect", "client_bound") if cell.flag(name)]
    status = "FAILED" if cell.status == "failed" else cell.status
    head = (cell.config, str(cell.tp), str(cell.concurrency), ",".join([status, *flags]))
    measurement = cell.measurement or {}
    if not cell.ok:
        verdict_errors = sum((measurement.get("errors") or {}).values())
        total = measurement.get("num_prompts")
        shown = f"{verdict_errors}/{total}" if cell.status == "failed" and total else "-"
        return (*head, *("-",) * 5, shown)
    failed = cell.failed_requests()
    total = measurement.get("num_prompts")
    errors = f"{failed}/{total}" if failed and total else str(failed)
    metrics = measurement.get("metrics") or {}
    wrong = metrics.get("token_count_mismatches")
    if wrong:
        errors += f" ({wrong} usage mismatch)"
    return (*head, *(_num(cell.value(m), d) for m, d in _METRICS), errors)


def rate_text(cell: CellResult) -> str:
    """Return the cell's rate as asked and, when measured, as sent (``500 (sent 498)``):
    the target alone would read as achieved."""
    asked = rate_label(cell.request_rate)
    audit = ((cell.measurement or {}).get("client") or {}).get("audit") or {}
    sent = audit.get("achieved_rate")
    if not isinstance(sent, (int, float)):
        return asked
    if cell.request_rate is None:  # closed loop: no rate asked; what it reached (issue 47)
        return f"closed loop, {sent:.3g}/s"
    return f"{asked} (sent {sent:.4g})"


def group_row(group: RepeatGroup) -> tuple[str, ...]:
    """Return the row of a repeated cell: means over its measured repeats, then ``n``
    (repeats measured) and ``±`` (relative std of output tok/s across them)."""
    first = group.first
    head = (first.config, str(first.tp), str(first.concurrency), group.status())
    if not group.measured:
        return (*head, *("-",) * 6, "0", "-")
    failed = sum(c.failed_requests() for c in group.measured)
    means = []
    for metric, digits in _METRICS:
        s = group.spread(metric)
        means.append(_num(None if s is None else s.mean, digits))
    tput = group.spread("output_throughput")
    rel = (
        "-"
        if tput is None or tput.rel_std is None or len(tput.values) < 2
        else f"{tput.rel_std:.1%}"
    )
    return (*head, *means, str(failed), str(len(group.measured)), rel)


def reason_lines(cells: list[CellResult]) -> list[str]:
    """Return why the cells that did not run or crashed did so: one line per configuration,
    status and reason (``why long (TP1) c=1, c=2 crashed: server exited ... ValueError: ...``),
    in the order the cells come. Failed cells are named on stderr with their errors."""
    grouped: dict[tuple[str, str, str, str], list[str]] = {}
    for cell in cells:
        if cell.status in ("crashed", "skipped") and cell.reason:
            key = (cell.config, str(cell.tp), cell.status, cell.reason)
            grouped.setdefault(key, []).append(cell.load_label)
    return [f"why {config} (TP{tp}) {', '.join(loads)} {status}: {reason}"
            for (config, tp, status, reason), loads in grouped.items()]  # fmt: skip


def search_lines(searches: tuple[SearchLine, ...] | list[SearchLine]) -> list[str]:
    """Return one line per configuration's search: the highest load that met the SLO and
    the first that did not."""
    out = []
    for s in searches:
        d = s.search
        slo = ", ".join(f"{k} <= {v:g}" for k, v in (d.get("slo") or {}).items() if v is not None)
        met = "none (not even low)" if d.get("met") is None else f"{d['met']:g}"
        failed = "none (high met it)" if d.get("failed") is None else f"{d['failed']:g}"
        out.append(f"search {s.label} over {d.get('over')}: met {met}, first failing {failed} "
                   f"({len(d.get('probes') or [])} probes; {slo}; goodput >= {d.get('goodput')}"
                   f"{'; ' + s.status + ': ' + s.reason if s.status != 'done' else ''})")  # fmt: skip
    return out


def results_table(run_dir: Path, plan: Plan | None = None) -> str:
    """Return the run's cells as a fixed-width text table (the plan's cells, in plan order,
    when ``plan`` is given; latencies in ms), then the search results. A missing
    results file gives one line."""
    try:
        run = read_run(run_dir)
    except ResultsError as exc:
        return f"(no results: {exc})"
    cells = list(run.cells)
    if plan is not None:
        by_key = {c.key: c for c in cells}
        order = [c.key for c in plan.cells()]
        wanted = set(order)
        probes = [c for c in cells if c.key not in wanted and c.search]
        cells = [by_key[k] for k in order if k in by_key] + sorted(probes, key=lambda c: c.load)
    title = f"{'=' * 10} gpudoctor bench: {Path(run_dir)} (latencies in ms) {'=' * 10}"
    rated = any(c.request_rate is not None for c in cells)
    groups = group_cells(cells)
    repeated = any(len(g.cells) > 1 for g in groups)
    header = COLUMNS + (("n", "±") if repeated else ())
    rows = [group_row(g) if repeated else row(g.first) for g in groups]
    if rated:
        header = (*header[:3], "rate", *header[3:])
        rows = [(*r[:3], rate_text(g.first), *r[3:]) for r, g in zip(rows, groups, strict=True)]
    extra, values, notes = table_columns([g.first for g in groups])
    header = (*header, *extra)
    # every string of the run file (config names, reasons quoting a server) reaches the
    # terminal escaped, as in `bench status`: no control sequence of theirs runs
    rows = [tuple(map(printable, (*r, *v))) for r, v in zip(rows, values, strict=True)]
    lines = [*notes, *reason_lines(cells), *search_lines(run.searches)]
    return "\n".join([printable(title), format_table(header, rows), *map(printable, lines)])


def format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Return a plain fixed-width table (first column left-aligned, the others right):
    no escape sequences, whatever the terminal, so it pastes into notes and logs. Widths
    are terminal cells (an emoji or CJK character takes two), not characters."""
    from rich.cells import cell_len

    table = [header, *rows]
    widths = [max(cell_len(r[i]) for r in table) for i in range(len(header))]
    lines = []
    for number, r in enumerate(table):
        pads = (" " * (w - cell_len(v)) for v, w in zip(r, widths, strict=True))
        cells = (v + pad if i == 0 else pad + v
                 for i, (v, pad) in enumerate(zip(r, pads, strict=True)))  # fmt: skip
        lines.append("  ".join(cells).rstrip())
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
