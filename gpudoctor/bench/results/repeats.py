"""``repeats = N``: the runs of one cell, grouped, and their spread.

Every repeat of a cell is its own record (its own key, resumable); they share a
``group`` (repeat 0's key). Within one run the bootstrap (:mod:`noise`) says how much a
metric would move if the same requests were drawn again; across repeats the spread says
how much it moves when the whole cell runs again (server state, the machine's other
load), which is what a comparison of two runs must beat.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.bench.results.reader import CellResult


@dataclass(frozen=True)
class Spread:
    """A metric across the measured repeats of one cell.

    Attributes:
        values: one value per measured repeat, in repeat order.
        mean: their mean; std: their sample standard deviation (0 for one value).
        rel_std: std / mean (None when the mean is 0).
    """

    values: tuple[float, ...]
    mean: float
    std: float
    rel_std: float | None

    @property
    def low(self) -> float:
        """Return the smallest repeat's value."""
        return min(self.values)

    @property
    def high(self) -> float:
        """Return the largest repeat's value."""
        return max(self.values)


def spread(values: Sequence[float]) -> Spread | None:
    """Return the spread of ``values`` (None when empty)."""
    if not values:
        return None
    mean = math.fsum(values) / len(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return Spread(tuple(values), mean, std, std / mean if mean else None)


@dataclass(frozen=True)
class RepeatGroup:
    """The repeats of one cell (``cells`` in repeat order; one cell when not repeated)."""

    group: str
    cells: tuple[CellResult, ...]

    @property
    def first(self) -> CellResult:
        """Return repeat 0 (or the lowest repeat recorded)."""
        return self.cells[0]

    @property
    def measured(self) -> tuple[CellResult, ...]:
        """Return the repeats that have a measurement."""
        return tuple(c for c in self.cells if c.ok)

    def spread(self, name: str) -> Spread | None:
        """Return the spread of metric ``name`` over the measured repeats."""
        return spread([v for c in self.measured if (v := c.value(name)) is not None])

    def status(self) -> str:
        """Return ``ok`` when every repeat is, else e.g. ``ok 2/3`` or the one status."""
        statuses = [c.status for c in self.cells]
        if len(set(statuses)) == 1:
            return statuses[0]
        return f"ok {statuses.count('ok')}/{len(statuses)}"


def group_cells(cells: Sequence[CellResult]) -> list[RepeatGroup]:
    """Return the cells grouped by ``group`` (first-seen order, repeats sorted)."""
    groups: dict[str, list[CellResult]] = {}
    for cell in cells:
        groups.setdefault(cell.group or cell.key, []).append(cell)
    return [RepeatGroup(k, tuple(sorted(v, key=lambda c: c.repeat))) for k, v in groups.items()]
