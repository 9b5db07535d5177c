"""Click commands ``report`` and ``compare`` (added to ``gpudoctor bench`` by commands/bench.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gpudoctor.bench.results_reader import ResultsError

_RUN_DIR = click.Path(exists=True, file_okay=False, path_type=Path)
_SHORT = {
    "output_throughput": "out tok/s",
    "mean_ttft_ms": "TTFT mean",
    "p99_ttft_ms": "TTFT p99",
    "mean_tpot_ms": "TPOT mean",
    "mean_itl_ms": "ITL mean",
    "accept_length": "accept",
}


@click.command("report")
@click.argument("run_dir", type=_RUN_DIR)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write report.md and the PNGs here instead of RUN_DIR.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the written paths as JSON.")
def report(run_dir: Path, out_dir: Path | None, as_json: bool) -> None:
    """Write RUN_DIR/report.md (a table per TP) and PNG plots from RUN_DIR/results.jsonl.

    \b
    Each table: rows = configs, columns = concurrency, cells =
      output tok/s · TTFT p50/p99 ms · TPOT p50 ms · accept length
    Plots: throughput vs concurrency, latency percentiles vs concurrency,
    throughput vs TPOT (the Pareto view).

    \b
    Example:
      gpudoctor bench report runs/qwen3 && xdg-open runs/qwen3/report.md
    """
    from gpudoctor.bench.report import write_report
    from gpudoctor.commands.options import require_writable_dir

    require_writable_dir(out_dir or run_dir, "--out" if out_dir else "RUN_DIR")

    try:
        files = write_report(run_dir, out_dir)
    except ResultsError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps({"markdown": str(files.markdown), "cells": files.cells,
                               "plots": [str(p) for p in files.plots]}))  # fmt: skip
        return
    click.echo(f"wrote {files.markdown} ({files.cells} cells) and {len(files.plots)} plots")


@click.command("compare")
@click.argument("run_a", type=_RUN_DIR)
@click.argument("run_b", type=_RUN_DIR)
@click.option("--json", "as_json", is_flag=True, help="Print every ratio as JSON.")
def compare(run_a: Path, run_b: Path, as_json: bool) -> None:
    """Print per-cell ratios B / A of two runs, cells matched by their key.

    \b
    Above 1: B is higher (better for tok/s and accept length, worse for latency).
    Example:
      gpudoctor bench compare runs/before runs/after
    """
    from gpudoctor.bench.compare import COMPARED, compare_runs

    try:
        result = compare_runs(run_a, run_b)
    except ResultsError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    shown = [m for m in COMPARED if m in _SHORT]
    table = Table(title=f"B / A   (A = {run_a}, B = {run_b})")
    for column in ("config", "TP", "c", *(_SHORT[m] for m in shown)):
        table.add_column(column, justify="left" if column == "config" else "right")
    for cell in result.cells:
        values = [("–" if cell.ratios[m] is None else f"{cell.ratios[m]:.3f}") for m in shown]
        table.add_row(cell.config, str(cell.tp), str(cell.concurrency), *values)
    console = Console()
    console.print(table)
    for label, keys in (("only in A", result.only_a), ("only in B", result.only_b)):
        if keys:
            console.print(f"{label}: {', '.join(keys)}")
    for key, why in result.not_measured.items():
        console.print(f"not compared: {key} ({why})")
