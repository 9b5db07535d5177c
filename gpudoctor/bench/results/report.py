"""``gpudoctor bench report DIR``: report.md (a table per TP) and PNG plots of a run.

Tables: rows = configs, columns = concurrency; each cell reads
``output tok/s · TTFT p50/p99 ms · TPOT p50 ms · accept length``. Plots (matplotlib,
Agg backend, imported lazily): output throughput vs concurrency per config, latency
percentiles vs concurrency, and output throughput vs median TPOT (the Pareto view:
up and to the left is better).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor import fsio
from gpudoctor.bench.results.html_report import render_html
from gpudoctor.bench.results.md_escape import md_text
from gpudoctor.bench.results.reader import CellResult, ResultsError, read_run
from gpudoctor.bench.results.report_facts import (
    attention,
    slo_text,
    status_counts,
    workload_rows,
)

FIGSIZE_IN = (8.0, 5.0)
DPI = 100  # plots are FIGSIZE_IN * DPI pixels: 800 x 500
PLOTS_HINT = "matplotlib is not installed: pip install 'gpudoctor[plots]' for the plots"
PLOT_FILES = {
    "throughput": "throughput_vs_concurrency.png",
    "latency": "latency_vs_concurrency.png",
    "pareto": "throughput_vs_tpot.png",
}


@dataclass(frozen=True)
class ReportFiles:
    """What ``write_report`` wrote: the markdown file and the plot files.

    Attributes:
        markdown: report.md.
        plots: the PNGs written (empty without matplotlib).
        cells: cells in the report.
        warnings: one line each: corrupt results lines skipped, plots not drawn.
    """

    markdown: Path
    plots: tuple[Path, ...]
    cells: int
    warnings: tuple[str, ...] = ()
    html: Path | None = None


def _fmt(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def cell_text(cell: CellResult | None) -> str:
    """Return one table cell: ``tok/s · TTFT p50/p99 · TPOT p50 · accept`` or the status."""
    if cell is None:
        return ""
    if not cell.ok:
        return "FAILED" if cell.status == "failed" else md_text(cell.status)
    text = (
        f"{_fmt(cell.value('output_throughput'))} · "
        f"{_fmt(cell.value('median_ttft_ms'))}/{_fmt(cell.value('p99_ttft_ms'))} · "
        f"{_fmt(cell.value('median_tpot_ms'), 1)} · {_fmt(cell.value('accept_length'), 2)}"
    )
    failed = cell.failed_requests()
    metrics = (cell.measurement or {}).get("metrics") or {}
    sent = ((cell.measurement or {}).get("client") or {}).get("audit") or {}
    sent = sent.get("achieved_rate") if cell.request_rate is not None else None
    if isinstance(sent, (int, float)):  # the rate actually sent, beside the column's asked one
        text += f" · sent {sent:.4g} req/s"
    marks = [f"⚠ {failed} failed" if failed else "",
             f"⚠ {metrics['token_count_mismatches']} usage mismatch"
             if metrics.get("token_count_mismatches") else "",
             "⚠ suspect" if cell.flag("suspect") else "",
             "⚠ client-bound" if cell.flag("client_bound") else ""]  # fmt: skip
    return " ".join([text, *(m for m in marks if m)])


def _ordered(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def markdown_tables(cells: Sequence[CellResult]) -> str:
    """Return the markdown of one table per TP (rows = configs, columns = concurrency)."""
    parts = []
    for tp in sorted({c.tp for c in cells}):
        group = [c for c in cells if c.tp == tp]
        loads = [c.load_label for c in sorted(group, key=lambda c: c.load)]
        loads = list(dict.fromkeys(loads))
        by_place = {(c.config, c.load_label): c for c in group if c.repeat == 0}
        header = "| config | " + " | ".join(md_text(n) for n in loads) + " |"
        rule = "|---|" + "---|" * len(loads)
        rows = [
            f"| {md_text(config)} | "
            + " | ".join(cell_text(by_place.get((config, n))) for n in loads)
            + " |"
            for config in _ordered([c.config for c in group])
        ]
        parts.append("\n".join([f"## TP {tp}", "", header, rule, *rows]))
    return "\n\n".join(parts)


def _series(cells: Sequence[CellResult]) -> dict[str, list[CellResult]]:
    """Return the measured cells grouped by ``config (TPn)``, sorted by concurrency."""
    series: dict[str, list[CellResult]] = {}
    for cell in sorted((c for c in cells if c.ok), key=lambda c: c.concurrency):
        series.setdefault(f"{cell.config} (TP{cell.tp})", []).append(cell)
    return series


def _points(rows: list[CellResult], x: str, y: str) -> tuple[list[float], list[float]]:
    pairs = [(c.concurrency if x == "concurrency" else c.value(x), c.value(y)) for c in rows]
    kept = [(a, b) for a, b in pairs if a is not None and b is not None]
    return [a for a, _ in kept], [b for _, b in kept]


def figures(cells: Sequence[CellResult]) -> dict[str, Any]:
    """Return the report's three plots as matplotlib Figures, drawn but not saved, keyed as
    ``PLOT_FILES`` is: ``throughput`` (output tok/s vs concurrency, log2 x), ``latency``
    (TTFT and TPOT ms vs concurrency side by side, p50 solid and p99 dashed in the series'
    colour) and ``pareto`` (output tok/s vs median TPOT ms, each point marked ``c=N``). One
    line per ``config (TPn)`` of the measured cells, by concurrency; a point lacking either
    number is left out; a legend only when there is a line. The caller closes them."""
    import matplotlib  # lazy: heavy, and only the report needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _series(cells)

    throughput, ax = plt.subplots(figsize=FIGSIZE_IN, dpi=DPI)
    for label, rows in series.items():
        ax.plot(*_points(rows, "concurrency", "output_throughput"), marker="o", label=label)
    ax.set(xlabel="concurrency", ylabel="output tokens/s", title="Output throughput")
    ax.set_xscale("log", base=2)
    _legend(ax, series)

    latency, axes = plt.subplots(1, 2, figsize=FIGSIZE_IN, dpi=DPI)
    for number, (label, rows) in enumerate(series.items()):
        for ax, metric in zip(axes, ("ttft", "tpot"), strict=True):
            for pct, style in (("median", "-"), ("p99", "--")):
                xs, ys = _points(rows, "concurrency", f"{pct}_{metric}_ms")
                ax.plot(xs, ys, style, marker="o", color=f"C{number % 10}",
                        label=label if pct == "median" else None)  # fmt: skip
    for ax, metric in zip(axes, ("TTFT", "TPOT"), strict=True):
        ax.set(xlabel="concurrency", ylabel=f"{metric} ms", title=f"{metric} p50 (—) / p99 (--)")
        ax.set_xscale("log", base=2)
    _legend(axes[0], series)

    pareto, ax = plt.subplots(figsize=FIGSIZE_IN, dpi=DPI)
    for label, rows in series.items():
        xs, ys = _points(rows, "median_tpot_ms", "output_throughput")
        ax.plot(xs, ys, marker="o", label=label)
        for row in rows:
            x, y = row.value("median_tpot_ms"), row.value("output_throughput")
            if x is not None and y is not None:
                ax.annotate(f"c={row.concurrency}", (x, y), fontsize=7)
    ax.set(xlabel="median TPOT ms", ylabel="output tokens/s", title="Throughput vs TPOT")
    _legend(ax, series)
    return {"throughput": throughput, "latency": latency, "pareto": pareto}


def _legend(ax: Any, series: dict[str, list[CellResult]]) -> None:
    if series:
        ax.legend(fontsize=7)


def write_plots(cells: Sequence[CellResult], out_dir: Path) -> list[Path]:
    """Write the three PNG plots of :func:`figures` into ``out_dir`` (``FIGSIZE_IN * DPI``
    pixels, replaced atomically, never through a link); return their paths. Every figure
    is closed, also when a write fails (a long-lived process draws many reports)."""
    import matplotlib.pyplot as plt

    drawn = figures(cells)
    try:
        return [_save(fig, out_dir / PLOT_FILES[name]) for name, fig in drawn.items()]
    finally:
        for fig in drawn.values():
            plt.close(fig)


def _save(fig: Any, path: Path) -> Path:
    png = io.BytesIO()
    with warnings.catch_warnings():  # an emoji in a config name: a box in the PNG, not a
        warnings.filterwarnings("ignore", "Glyph .* missing from font")  # source-path warning
        fig.tight_layout()
        fig.savefig(png, format="png")
    fsio.atomic_replace(path, png.getvalue(), mode=0o644, require_trusted_dir=True)  # no link
    return path


def placement_table(cells: Sequence[CellResult]) -> list[str]:
    """Return report.md's "where each cell ran" lines: slot and GPU UUIDs per cell
    (empty when no cell ran on a known GPU)."""
    placed = [c for c in cells if c.gpus]
    if not placed:
        return []
    lines = ["## Where each cell ran", "", "| config | TP | c | slot | GPUs (UUID) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for c in placed:
        lines.append(f"| {md_text(c.config)} | {c.tp} | {c.concurrency} | {c.slot if c.slot is not None else '–'} "
                     f"| {', '.join(md_text(g) for g in c.gpus)} |")  # fmt: skip
    return [*lines, ""]


def server_signal_lines(cells: Sequence[CellResult]) -> list[str]:
    """Return report.md's server-signals section as lines (none for runs without it)."""
    from gpudoctor.bench.results.signals_view import markdown_section

    section = markdown_section(cells)
    return ["", *section.rstrip("\n").split("\n")] if section else []


def render_markdown(
    run_dir: Path, cells: Sequence[CellResult], plots: Sequence[Path], notes: Sequence[str] = ()
) -> str:
    """Return report.md's text (``notes``: warnings shown under the title)."""
    lines = [
        f"# Benchmark report: {md_text(Path(run_dir).name)}",
        "",
        status_counts(cells),
        "",
        *attention_markdown(cells),
        *workload_markdown(run_dir),
        "Each cell: **output tok/s · TTFT p50/p99 ms · TPOT p50 ms · accept length** "
        "(– = not available). Definitions: docs/bench-metrics.md.",
        "",
        markdown_tables(cells),
        "",
        "## Plots",
        "",
        *(f"![{p.stem}]({p.name})" for p in plots),
        *([] if plots else ["No plots: " + PLOTS_HINT + "."]),
        "",
        *placement_table(cells),
        *server_signal_lines(cells),
    ]
    if notes:
        lines[4:4] = [*(f"> **Warning:** {md_text(n)}" for n in notes), ""]  # after the counts
    return "\n".join(lines)


def attention_markdown(cells: Sequence[CellResult]) -> list[str]:
    """Return report.md's "Needs attention" section (failed, suspect, client-bound cells
    first, then crashed and skipped, each with its reason); empty when every cell is clean."""
    rows = attention(cells)
    if not rows:
        return []
    lines = ["## Needs attention", "", "| cell | what | why |", "|---|---|---|"]
    lines += [f"| {md_text(a)} | **{md_text(b)}** | {md_text(c)} |" for a, b, c in rows]
    return [*lines, ""]


def workload_markdown(run_dir: Path) -> list[str]:
    """Return report.md's "Workload and SLO" section (from the run's plan.toml)."""
    rows = workload_rows(run_dir)
    lines = ["## Workload and SLO", ""]
    lines += [f"- **{name}**: {md_text(value)}" for name, value in rows] or [
        "- plan.toml is missing or unreadable: the workload is unknown"
    ]
    return [*lines, f"- **SLO**: {md_text(slo_text(run_dir))}", ""]


def _check_out_dir(out_dir: Path, option: str) -> None:
    """Create ``out_dir`` or check that it is the caller's (as a run directory is, issue
    22.1); raise ResultsError (one line) for another user's or a world-writable one."""
    from gpudoctor.bench.results.run_dir import RunDirError, check_run_dir

    try:
        check_run_dir(out_dir, option, create=True)
    except RunDirError as exc:
        raise ResultsError(str(exc)) from None


REPORT_MARKER = "<!-- written by `gpudoctor bench report`: regenerate, do not edit -->"
_OURS_BEFORE_MARKER = (b"# Benchmark report: ", b"<!DOCTYPE html>")  # reports of earlier versions


def _foreign_page(path: Path) -> str | None:
    """Return why ``path`` must not be replaced (it is not a regular file, or neither its
    marker line nor an earlier version's first line says gpudoctor wrote it); None when it
    is absent or gpudoctor's own (the rule of ``list --markdown``)."""
    try:
        head = fsio.read_regular(path, limit=4096)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return str(exc)
    if REPORT_MARKER.encode() in head or head.startswith(_OURS_BEFORE_MARKER):
        return None
    return f"{path} exists and gpudoctor did not write it (no marker line)"


def _refuse_foreign_pages(out_dir: Path, option: str) -> None:
    """Raise ResultsError (one line) before anything is written when report.md or
    report.html in ``out_dir`` is a file gpudoctor did not write."""
    for name in ("report.md", "report.html"):
        why = _foreign_page(out_dir / name)
        if why:
            raise ResultsError(f"{why}: never replaced; choose another {option} or move it away")


def write_report(run_dir: Path, out_dir: Path | None = None) -> ReportFiles:
    """Write ``report.md``, the PNG plots and ``report.html`` (self-contained, inline SVG)
    for ``run_dir`` into ``out_dir`` (default: run_dir).

    Returns the paths written and the warnings. Without matplotlib, report.md is written
    without plots (a warning says how to get them). Corrupt lines of results.jsonl are
    skipped with a warning. Raises ``ResultsError`` when results.jsonl is missing.
    """
    run = read_run(run_dir)
    cells = list(run.cells)
    out_dir = Path(out_dir or run_dir)
    option = "--out" if out_dir != Path(run_dir) else "RUN_DIR"
    _check_out_dir(out_dir, option)
    _refuse_foreign_pages(out_dir, option)
    warnings = [w for w in (run.warning(),) if w]
    try:
        plots = write_plots(cells, out_dir)
    except ImportError:  # matplotlib is an extra: gpudoctor[plots]
        plots = []
        warnings.append(PLOTS_HINT)
    markdown = out_dir / "report.md"
    notes = warnings[:1] if run.skipped else []
    text = render_markdown(run_dir, cells, plots, notes)
    fsio.atomic_replace(markdown, f"{REPORT_MARKER}\n{text}", mode=0o644,
                        require_trusted_dir=True)  # never a link  # fmt: skip
    page = out_dir / "report.html"
    html_text = render_html(run_dir, run, notes).replace(
        "<!DOCTYPE html>", f"<!DOCTYPE html>\n{REPORT_MARKER}", 1
    )
    fsio.atomic_replace(page, html_text.encode("utf-8"), mode=0o644, require_trusted_dir=True)
    return ReportFiles(markdown, tuple(plots), len(cells), tuple(warnings), page)
