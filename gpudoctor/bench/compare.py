"""``gpudoctor bench compare DIR_A DIR_B``: per-cell ratios B / A, cells matched by key.

A ratio above 1 means B is higher: better for throughputs and accept length, worse for
latencies. Cells present in one run only, or not measured in both, are listed apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.bench.results_reader import CellResult, load_results

COMPARED = (
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "mean_itl_ms",
    "mean_e2e_ms",
    "accept_length",
)


@dataclass(frozen=True)
class CellRatio:
    """B / A for every compared metric of one cell (None where either side lacks it)."""

    key: str
    config: str
    tp: int
    concurrency: int
    ratios: dict[str, float | None]


@dataclass(frozen=True)
class Comparison:
    """The matched cells' ratios and the keys that could not be compared (with why)."""

    cells: tuple[CellRatio, ...]
    only_a: tuple[str, ...] = ()
    only_b: tuple[str, ...] = ()
    not_measured: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the comparison as a JSON-ready dict."""
        return {
            "cells": [vars(c) for c in self.cells],
            "only_a": list(self.only_a),
            "only_b": list(self.only_b),
            "not_measured": self.not_measured,
        }


def ratio(a: float | None, b: float | None) -> float | None:
    """Return b / a, or None when either is missing or a is 0."""
    if a is None or b is None or a == 0:
        return None
    return b / a


def compare_cells(cells_a: list[CellResult], cells_b: list[CellResult]) -> Comparison:
    """Return the per-cell ratios of run B over run A, matched by cell key (A's order)."""
    by_key_b = {c.key: c for c in cells_b}
    keys_a = {c.key for c in cells_a}
    matched, not_measured = [], {}
    for a in cells_a:
        b = by_key_b.get(a.key)
        if b is None:
            continue
        if not (a.ok and b.ok):
            not_measured[a.key] = f"A {a.status}, B {b.status}"
            continue
        ratios = {name: ratio(a.value(name), b.value(name)) for name in COMPARED}
        matched.append(CellRatio(a.key, a.config, a.tp, a.concurrency, ratios))
    return Comparison(
        cells=tuple(matched),
        only_a=tuple(c.key for c in cells_a if c.key not in by_key_b),
        only_b=tuple(c.key for c in cells_b if c.key not in keys_a),
        not_measured=not_measured,
    )


def compare_runs(dir_a: Path, dir_b: Path) -> Comparison:
    """Return the comparison of two run directories (raises ``ResultsError`` if unreadable)."""
    return compare_cells(load_results(dir_a), load_results(dir_b))
