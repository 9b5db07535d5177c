"""``gpudoctor bench compare DIR_A DIR_B``: per-cell values, ratios B / A and their noise.

Cells are matched by key. For each metric: A's value, B's value, B / A, and the 95 %
bootstrap interval of B / A over both cells' raw per-request records
(:mod:`gpudoctor.bench.results.noise`); a ratio whose interval contains 1 is "within the noise".
A ratio above 1 means B is higher: better for throughputs and accept length, worse for
latencies. Cells present in one run only, or not measured in both, are listed apart.

With ``repeats = N`` the repeats of a cell are one comparison: the values are the means
over the measured repeats, ``repeats_a`` / ``repeats_b`` their spread, and
``repeat_intervals`` the range of B / A the repeats allow (lowest B over highest A to
highest B over lowest A); a ratio is within the noise when that range, or the bootstrap
interval of the first repeats, contains 1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.bench.cell_spec import rate_to_json
from gpudoctor.bench.results import noise
from gpudoctor.bench.results.reader import CellResult, ResultsError, read_run
from gpudoctor.bench.results.repeats import RepeatGroup, Spread, group_cells
from gpudoctor.bench.results.signals_view import compare_lines

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
    request_rate: float | str | None = None
    repeats_a: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    repeats_b: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    repeat_intervals: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    gpus_a: tuple[str, ...] = ()
    gpus_b: tuple[str, ...] = ()
    signals: tuple[str, ...] = ()  # server signals A -> B (signals_view.compare_lines)


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
            "per-request records (first repeats); repeat_intervals = the B/A range across "
            "repeats; within_noise = either contains 1",
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
    """Return the per-cell comparison of run B with run A, matched by key (A's order;
    the repeats of a cell together, by group); with the run directories, each ratio
    gets its bootstrap interval."""
    groups_b = {g.group: g for g in group_cells(cells_b)}
    groups_a = group_cells(cells_a)
    keys_a = {g.group for g in groups_a}
    matched, not_measured = [], {}
    for group_a in groups_a:
        group_b = groups_b.get(group_a.group)
        if group_b is None:
            continue
        if not (group_a.measured and group_b.measured):
            not_measured[group_a.group] = f"A {group_a.status()}, B {group_b.status()}"
            continue
        ratio_ab = _group_ratio(group_a, group_b, dir_a, dir_b)
        lines = tuple(compare_lines(group_a.first, group_b.first))
        matched.append(dataclasses.replace(ratio_ab, signals=lines) if lines else ratio_ab)
    return Comparison(
        cells=tuple(matched),
        only_a=tuple(g.group for g in groups_a if g.group not in groups_b),
        only_b=tuple(k for k in groups_b if k not in keys_a),
        not_measured=not_measured,
    )


def _repeat_interval(a: Spread | None, b: Spread | None) -> tuple[float, float] | None:
    """Return the range of B / A the repeats allow (None without 2 repeats a side)."""
    if a is None or b is None or len(a.values) < 2 or len(b.values) < 2 or a.low <= 0:
        return None
    return (b.low / a.high, b.high / a.low)


def _group_ratio(
    ga: RepeatGroup, gb: RepeatGroup, dir_a: Path | None, dir_b: Path | None
) -> CellRatio:
    a, b = ga.measured[0], gb.measured[0]
    spreads_a = {n: ga.spread(n) for n in COMPARED}
    spreads_b = {n: gb.spread(n) for n in COMPARED}
    values_a = {n: (s.mean if (s := spreads_a[n]) else None) for n in COMPARED}
    values_b = {n: (s.mean if (s := spreads_b[n]) else None) for n in COMPARED}
    intervals = _noise(a, b, dir_a, dir_b)
    repeat_iv = {n: _repeat_interval(spreads_a[n], spreads_b[n]) for n in COMPARED}

    def within(name: str) -> bool | None:
        verdicts = [iv[0] <= 1.0 <= iv[1] for iv in (intervals.get(name), repeat_iv[name]) if iv]
        return any(verdicts) if verdicts else None

    def as_json(spread: Spread | None) -> dict[str, Any] | None:
        return None if spread is None else {"values": list(spread.values), "mean": spread.mean,
                                            "std": spread.std, "rel_std": spread.rel_std}  # fmt: skip

    return CellRatio(
        ga.group, a.config, a.tp, a.concurrency,
        ratios={n: ratio(values_a[n], values_b[n]) for n in COMPARED},
        a=values_a, b=values_b,
        requests_a=sum(c.completed for c in ga.measured),
        requests_b=sum(c.completed for c in gb.measured),
        intervals={n: intervals.get(n) for n in COMPARED},
        within_noise={n: within(n) for n in COMPARED},
        request_rate=rate_to_json(a.request_rate),
        repeats_a={n: as_json(spreads_a[n]) for n in COMPARED},
        repeats_b={n: as_json(spreads_b[n]) for n in COMPARED},
        repeat_intervals=repeat_iv,
        gpus_a=a.gpus, gpus_b=b.gpus,
    )  # fmt: skip


def compare_runs(dir_a: Path, dir_b: Path) -> Comparison:
    """Return the comparison of two run directories (raises ``ResultsError`` if unreadable)."""
    run_a, run_b = read_run(dir_a), read_run(dir_b)
    result = compare_cells(list(run_a.cells), list(run_b.cells), Path(dir_a), Path(dir_b))
    if run_a.cells and run_b.cells and not result.cells and not result.not_measured:
        raise ResultsError(  # issue 47: an empty table and hex keys, exit 0, said nothing
            f"no cell in common: {dir_a} and {dir_b} ran different plans (A: {_configs(run_a)};"
            f" B: {_configs(run_b)}); compare two runs of the same plan"
        )
    warnings = tuple(w for w in (run_a.warning(), run_b.warning()) if w)
    return Comparison(result.cells, result.only_a, result.only_b, result.not_measured, warnings)


def _configs(run: Any) -> str:
    """Return the configuration names of a run's cells (``configs a, b``), for messages."""
    names = list(dict.fromkeys(c.config for c in run.cells))
    more = f" and {len(names) - 6} more" if len(names) > 6 else ""
    return f"config{'s' if len(names) > 1 else ''} {', '.join(names[:6])}{more}"
