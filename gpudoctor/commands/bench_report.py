"""Click commands ``report`` and ``compare`` (added to ``gpudoctor bench`` by commands/bench.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gpudoctor.bench.results.reader import ResultsError

_RUN_DIR = click.Path(exists=True, file_okay=False, path_type=Path)
_SHORT = {
    "output_throughput": ("out tok/s", 1),
    "median_ttft_ms": ("TTFT p50 ms", 1),
    "p99_ttft_ms": ("TTFT p99 ms", 1),
    "median_tpot_ms": ("TPOT p50 ms", 2),
    "p99_tpot_ms": ("TPOT p99 ms", 2),
    "accept_length": ("accept", 2),
}


def _warn(lines: tuple[str, ...] | list[str]) -> None:
    for line in lines:
        click.echo(f"gpudoctor: warning: {line}", err=True)


@click.command("report")
@click.argument("run_dir", type=_RUN_DIR)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write report.md and the PNGs here instead of RUN_DIR.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the written paths as JSON.")
def report(run_dir: Path, out_dir: Path | None, as_json: bool) -> None:
    """Write RUN_DIR/report.md (a table per TP), PNG plots and RUN_DIR/report.html from
    RUN_DIR/results.jsonl. report.html is self-contained (inline SVG, no network): open it
    in a browser.

    \b
    Each table: rows = configs, columns = concurrency, cells =
      output tok/s · TTFT p50/p99 ms · TPOT p50 ms · accept length
    Plots: throughput vs concurrency, latency percentiles vs concurrency,
    throughput vs TPOT (the Pareto view); they need matplotlib
    (pip install 'gpudoctor[plots]'); without it report.md is written alone.
    A corrupt line of results.jsonl is skipped with a warning.

    \b
    Example:
      gpudoctor bench report runs/qwen3 && xdg-open runs/qwen3/report.md
    """
    from gpudoctor.bench.results.report import write_report
    from gpudoctor.commands.options import require_writable_dir

    require_writable_dir(out_dir or run_dir, "--out" if out_dir else "RUN_DIR")
    try:
        files = write_report(run_dir, out_dir)
    except ResultsError as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(
            f"cannot write the report into {out_dir or run_dir}: {exc.strerror or exc}; "
            "pick a writable --out"
        ) from exc
    _warn(files.warnings)
    if as_json:
        click.echo(json.dumps({"markdown": str(files.markdown), "cells": files.cells,
                               "plots": [str(p) for p in files.plots], "html": str(files.html),
                               "warnings": list(files.warnings)}))  # fmt: skip
        return
    click.echo(f"wrote {files.markdown} ({files.cells} cells), {files.html} and "
               f"{len(files.plots)} plots")  # fmt: skip


def _side_by_side(a: float | None, b: float | None, r: float | None, noise: bool | None,
                  digits: int) -> str:  # fmt: skip
    """Return ``A → B  ×ratio`` with ``≈`` when the ratio is within the noise."""
    if a is None and b is None:
        return "–"
    fa = "–" if a is None else f"{a:.{digits}f}"
    fb = "–" if b is None else f"{b:.{digits}f}"
    mark = {True: " ≈", False: "", None: " ?"}[noise]
    return f"{fa} → {fb}  " + ("–" if r is None else f"×{r:.2f}{mark}")


@click.command("compare")
@click.argument("run_a", type=_RUN_DIR)
@click.argument("run_b", type=_RUN_DIR)
@click.option(
    "--json", "as_json", is_flag=True, help="Print every value, ratio and interval as JSON."
)
def compare(run_a: Path, run_b: Path, as_json: bool) -> None:
    """Compare two runs cell by cell (matched by key): A → B and the ratio B / A.

    \b
    n = successful requests behind each side's numbers.
    ≈  the ratio is within the noise: the 95 % bootstrap interval of B / A
       (1000 resamples of both cells' per-request records) contains 1.
    ?  cannot tell: fewer than 5 requests on a side, or no raw records (raw/ missing).
    Above 1: B is higher (better for tok/s and accept length, worse for latency).

    \b
    Example:
      gpudoctor bench compare runs/before runs/after
    """
    from gpudoctor.bench.results.compare import compare_runs

    try:
        result = compare_runs(run_a, run_b)
    except ResultsError as exc:
        raise click.ClickException(str(exc)) from exc
    _warn(result.warnings)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    from gpudoctor.bench.results.summary_table import format_table

    header = ("config", "TP", "c", "n A/B", *(label for label, _ in _SHORT.values()))
    placed = any(c.gpus_a or c.gpus_b for c in result.cells)
    if placed:
        header = (*header, "GPUs A → B")
    rows = []
    for cell in result.cells:
        values = [_side_by_side(cell.a.get(m), cell.b.get(m), cell.ratios.get(m),
                                cell.within_noise.get(m) if m != "accept_length" else False, digits)
                  for m, (_, digits) in _SHORT.items()]  # fmt: skip
        where = (f"{_short_gpus(cell.gpus_a)} → {_short_gpus(cell.gpus_b)}",) if placed else ()
        rows.append((cell.config, str(cell.tp), str(cell.concurrency),
                     f"{cell.requests_a}/{cell.requests_b}", *values, *where))  # fmt: skip
    click.echo(f"A = {run_a}\nB = {run_b}\neach metric: A → B  ×B/A")
    click.echo(format_table(header, rows))
    from gpudoctor.bench.results.noise import MIN_REQUESTS

    click.echo("≈ within the noise (the 95 % bootstrap interval of B/A contains 1); "
               f"? cannot tell (< {MIN_REQUESTS} successful requests a side, or no raw records)")  # fmt: skip
    _signal_lines(result.cells)
    for label, keys in (("only in A", result.only_a), ("only in B", result.only_b)):
        if keys:
            click.echo(f"{label}: {', '.join(keys)}")
    for key, why in result.not_measured.items():
        click.echo(f"not compared: {key} ({why})")


def _signal_lines(cells) -> None:  # type: ignore[no-untyped-def]
    """Print each matched cell's server signals, A -> B (nothing for runs without them)."""
    for cell in cells:
        if cell.signals:
            click.echo(f"server signals {cell.config} (TP{cell.tp}) c={cell.concurrency}:")
            for line in cell.signals:
                click.echo(line)


def _short_gpus(uuids: tuple[str, ...]) -> str:
    """Return GPU UUIDs shortened for a table (``GPU-3f2a1b0c`` -> ``3f2a1b0c``), ``-`` when none."""
    return ",".join(u.removeprefix("GPU-")[:8] for u in uuids) or "-"
