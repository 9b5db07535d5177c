"""The ``[search]`` block: the highest load that meets the SLO, by bisection, per configuration.

A search probes the load (``over = "request_rate"`` at the configuration's largest
concurrency, or ``over = "concurrency"``) between ``low`` and ``high``: a probe passes
when at least ``goodput`` of its requests met every SLO (``slo_attainment``, failures
count as misses). First ``low`` (failing: nothing meets the SLO), then ``high``
(passing: the bound is met), then the midpoint of the highest pass and the lowest fail
until they are within ``tolerance``. Every probe is an ordinary cell whose key depends
only on its load, so a resumed search replays its recorded probes (no cell runs twice)
and goes on where it stopped. This module is pure: the launcher runs the probes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.bench.cell_spec import SLO
from gpudoctor.bench.plan_model import SearchSpec, ServerConfig

_KEYS = {"over", "slo", "goodput", "low", "high", "tolerance"}
_SLO_KEYS = {"ttft_ms", "tpot_ms", "e2el_ms"}


def parse_search(
    r: Any, t: dict, plan_slo: SLO | None, configs: tuple[ServerConfig, ...]
) -> SearchSpec | None:
    """Return the ``[search]`` table as a SearchSpec (None when absent); ``r`` is the
    parser's reader (errors name the line and key)."""
    if not t:
        return None
    r.check_keys(t, _KEYS, "search")
    over = r.typed(t, "over", "search.over", (str,), "request_rate")
    if over not in ("request_rate", "concurrency"):
        raise r.error("search.over", f"expected request_rate or concurrency, got {over!r}")
    slo_table = r.table(t, "slo", "search.slo")
    r.check_keys(slo_table, _SLO_KEYS, "search.slo")
    slo = None
    if slo_table:
        slo = SLO(**{k: float(r.typed(slo_table, k, f"search.slo.{k}", (int, float), None))
                     for k in slo_table})  # fmt: skip
    if slo is None and plan_slo is None:
        raise r.error("search.slo", "missing: a search needs an SLO (search.slo or [slo])")
    goodput = float(r.typed(t, "goodput", "search.goodput", (int, float), 0.95))
    if not 0 < goodput <= 1:
        raise r.error("search.goodput", f"must be in (0, 1], got {goodput:g}")
    low = r.typed(t, "low", "search.low", (int, float), 1)
    high = r.typed(t, "high", "search.high", (int, float), None)
    if high is None:
        raise r.error("search.high", "missing: the highest load to try")
    tolerance = r.typed(t, "tolerance", "search.tolerance", (int, float), None)
    if tolerance is not None and not math.isfinite(tolerance):
        raise r.error("search.tolerance", f"must be a finite number, got {tolerance}")
    if not 0 < low < high:
        raise r.error("search", f"expected 0 < low < high, got low = {low}, high = {high}")
    if over == "concurrency":
        if not all(isinstance(v, int) for v in (low, high)):
            raise r.error("search", "low and high of a concurrency search must be integers")
        tolerance = max(int(tolerance or 1), 1)
    else:
        if any(len(c.request_rates) > 1 for c in configs):
            raise r.error("search.over", "a request_rate search replaces the request_rate axis")
        tolerance = float(tolerance if tolerance is not None else (high - low) / 16)
    if tolerance <= 0:
        raise r.error("search.tolerance", f"must be > 0, got {tolerance}")
    return SearchSpec(over, slo, goodput, float(low), float(high), float(tolerance))


def passes(measurement: dict[str, Any] | None, goodput: float) -> bool:
    """Return True when a probe's measurement met the SLO for at least ``goodput`` of
    its requests (``metrics.slo_attainment``)."""
    metrics = (measurement or {}).get("metrics") or {}
    attainment = metrics.get("slo_attainment")
    return isinstance(attainment, (int, float)) and attainment >= goodput


@dataclass(frozen=True)
class SearchResult:
    """The outcome of one configuration's search.

    Attributes:
        met: the highest load that met the SLO (None: not even ``low``).
        failed: the lowest load that did not (None: ``high`` met it).
        probes: ``(load, passed)`` in the order they ran (passed None = not measured).
        status: ``done``, or ``crashed`` / ``skipped`` when a probe could not be measured.
    """

    met: float | None
    failed: float | None
    probes: tuple[tuple[float, bool | None], ...]
    status: str = "done"


@dataclass
class Bisection:
    """The search's state machine: ``next_probe()`` gives the next load to measure (None
    when finished), ``record(load, passed)`` feeds its outcome back."""

    spec: SearchSpec
    outcomes: dict[float, bool | None] = field(default_factory=dict)
    order: list[float] = field(default_factory=list)

    def _round(self, value: float) -> float:
        if self.spec.over == "concurrency":
            return float(int(value))
        return float(f"{value:.4g}")  # stable keys: 4 significant digits

    def next_probe(self) -> float | None:
        """Return the next load to probe, or None when the search is over."""
        if any(v is None for v in self.outcomes.values()):
            return None  # a probe that could not be measured ends the search
        low, high = self.spec.low, self.spec.high
        if low not in self.outcomes:
            return low
        if not self.outcomes[low]:
            return None
        if high not in self.outcomes:
            return high
        if self.outcomes[high]:
            return None
        lo, hi = self._bracket()
        mid = self._round((lo + hi) / 2)
        if hi - lo <= self.spec.tolerance or mid in (lo, hi):
            return None
        return mid

    def _bracket(self) -> tuple[float, float]:
        lo = max(v for v, ok in self.outcomes.items() if ok)
        hi = min(v for v, ok in self.outcomes.items() if ok is False and v > lo)
        return lo, hi

    def record(self, load: float, passed: bool | None) -> None:
        """Record a probe's outcome (None: crashed or skipped, which ends the search)."""
        self.outcomes[load] = passed
        self.order.append(load)

    def result(self, status: str = "done") -> SearchResult:
        """Return the result so far (call when :meth:`next_probe` gave None)."""
        probes = tuple((v, self.outcomes[v]) for v in self.order)
        passed = [v for v, ok in self.outcomes.items() if ok]
        met = max(passed) if passed else None
        failing = [v for v, ok in self.outcomes.items() if ok is False and (met is None or v > met)]
        return SearchResult(met, min(failing) if failing else None, probes, status)
