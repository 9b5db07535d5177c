"""``gpudoctor bench compare DIR_A DIR_B``: per-cell values, ratios B / A and their noise.

Cells are matched by key. For each metric: A's value, B's value, B / A, and the 95 %
bootstrap interval of B / A over both cells' raw per-request records
(:mod:`gpudoctor.bench.results.noise`); a ratio whose interval contains 1 is "within the noise".
A ratio above 1 means B is higher: better for throughputs and accept length, worse for
latencies. Cells present in one run only, or not measured in both, are listed apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.bench.results import noise
from gpudoctor.bench.results.reader import CellResult, read_run

COMPARED = (*noise.BOOTSTRAPPED, "accept_length")


@dataclass(frozen=True)
class CellRatio:
    """One matched cell: per metric A, B, B / A and the 95 % interval of B / A.

    Attributes:
        requests_a, requests_b: successful requests behind each side's metrics.
        a, b: the metric values (None where a side lacks it).
        ratios: B / A (None where either side lacks the metric or A is 0).
        intervals: the bootstrap interval (low, high) of B / A, None without raw records.
        within_noise: per metric: True when the interval contains 1, None when unknown.
    """

    key: str
    config: str
    tp: int
    concurrency: int
    ratios: dict[str, float | None]
    a: dict[str, float | None] = field(default_factory=dict)
    b: dict[str, float | None] = field(default_factory=dict)
    requests_a: int = 0
    requests_b: int = 0
    intervals: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    within_noise: dict[str, bool | None] = field(default_factory=dict)
    gpus_a: tuple[str, ...] = ()
    gpus_b: tuple[str, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """The matched cells and the keys that could not be compared (with why)."""

    cells: tuple[CellRatio, ...]
    only_a: tuple[str, ...] = ()
    only_b: tuple[str, ...] = ()
    not_measured: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Return the comparison as a JSON-ready dict."""
        return {
            "cells": [vars(c) for c in self.cells],
            "only_a": list(self.only_a),
            "only_b": list(self.only_b),
            "not_measured": self.not_measured,
            "warnings": list(self.warnings),
            "noise": f"95% bootstrap interval of B/A, {noise.RESAMPLES} resamples of the "
            "per-request records; within_noise = the interval contains 1",
        }


def ratio(a: float | None, b: float | None) -> float | None:
    """Return b / a, or None when either is missing or a is 0."""
    if a is None or b is None or a == 0:
        return None
    return b / a


def _noise(
    a: CellResult, b: CellResult, dir_a: Path | None, dir_b: Path | None
) -> dict[str, tuple[float, float] | None]:
    if dir_a is None or dir_b is None:
        return {}
    samples = [
        noise.load_sample(d, c.raw, c.run_id, (c.measurement or {}).get("duration_s"))
        for d, c in ((dir_a, a), (dir_b, b))
    ]
    if samples[0] is None or samples[1] is None:
        return {}
    return noise.ratio_intervals(samples[0], samples[1])


def compare_cells(
    cells_a: list[CellResult], cells_b: list[CellResult],
    dir_a: Path | None = None, dir_b: Path | None = None,
) -> Comparison:  # fmt: skip
    """Return the per-cell comparison of run B with run A, matched by key (A's order);
    with the run directories, each ratio gets its bootstrap interval."""
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
        values_a = {name: a.value(name) for name in COMPARED}
        values_b = {name: b.value(name) for name in COMPARED}
        intervals = _noise(a, b, dir_a, dir_b)
        matched.append(CellRatio(
            a.key, a.config, a.tp, a.concurrency,
            ratios={n: ratio(values_a[n], values_b[n]) for n in COMPARED},
            a=values_a, b=values_b, requests_a=a.completed, requests_b=b.completed,
            intervals={n: intervals.get(n) for n in COMPARED},
            within_noise={n: (None if (iv := intervals.get(n)) is None else iv[0] <= 1.0 <= iv[1])
                          for n in COMPARED},
            gpus_a=a.gpus, gpus_b=b.gpus,
        ))  # fmt: skip
    return Comparison(
        cells=tuple(matched),
        only_a=tuple(c.key for c in cells_a if c.key not in by_key_b),
        only_b=tuple(c.key for c in cells_b if c.key not in keys_a),
        not_measured=not_measured,
    )


def compare_runs(dir_a: Path, dir_b: Path) -> Comparison:
    """Return the comparison of two run directories (raises ``ResultsError`` if unreadable)."""
    run_a, run_b = read_run(dir_a), read_run(dir_b)
    result = compare_cells(list(run_a.cells), list(run_b.cells), Path(dir_a), Path(dir_b))
    warnings = tuple(w for w in (run_a.warning(), run_b.warning()) if w)
    return Comparison(result.cells, result.only_a, result.only_b, result.not_measured, warnings)
