"""The top of report.html: each configuration's headline, throughput against latency at a
glance (issue 47), as guidellm's and AIPerf's summaries lead with throughput and the
latency it costs before any chart.

One row per configuration (its name and TP): the highest output throughput it reached and
at which load, the TTFT and TPOT it cost there; its lightest load's TTFT and TPOT (what one
user waits) with the tokens per second one stream gets; and how many of its cells were
measured. A bar shows each peak against the best one; the best peak is named above the
table, as is the lowest TTFT. Every string from the run is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.bench.results.repeats import RepeatGroup


@dataclass(frozen=True)
class Headline:
    """One configuration's headline; latencies in ms, throughput in output tokens/s."""

    config: str
    peak_tps: float
    peak_load: str
    peak_ttft_ms: float | None
    peak_tpot_ms: float | None
    light_load: str
    light_ttft_ms: float | None
    light_tpot_ms: float | None
    measured: int
    cells: int


def _mean(group: RepeatGroup, metric: str) -> float | None:
    s = group.spread(metric)
    return None if s is None else s.mean


def headlines(groups: Sequence[RepeatGroup]) -> list[Headline]:
    """Return one Headline per configuration with a measured output throughput, in the
    order the configurations first appear."""
    by_config: dict[str, list[RepeatGroup]] = {}
    for g in groups:
        by_config.setdefault(f"{g.first.config} (TP{g.first.tp})", []).append(g)
    out = []
    for config, rows in by_config.items():
        rated = [g for g in rows if _mean(g, "output_throughput") is not None]
        if not rated:
            continue
        peak = max(rated, key=lambda g: _mean(g, "output_throughput") or 0.0)
        light = min(rated, key=lambda g: g.first.load)
        out.append(Headline(
            config, _mean(peak, "output_throughput") or 0.0, peak.first.load_label,
            _mean(peak, "median_ttft_ms"), _mean(peak, "median_tpot_ms"),
            light.first.load_label, _mean(light, "median_ttft_ms"), _mean(light, "median_tpot_ms"),
            len(rated), len(rows),
        ))  # fmt: skip
    return out


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g} ms"


def _per_user(tpot_ms: float | None) -> str:
    """Return the tokens/s one stream gets at a TPOT (1000 / TPOT ms)."""
    return "–" if not tpot_ms else f"{1000 / tpot_ms:.3g} tok/s"


def section(groups: Sequence[RepeatGroup]) -> str:
    """Return the "At a glance" section of report.html."""
    rows = headlines(groups)
    head = "<h2>At a glance: each configuration's throughput and the latency it costs</h2>"
    if not rows:
        return (f"{head}<p><b>No configuration has a measured cell</b>: every cell failed,"
                " crashed or was skipped; the reasons are below.</p>")  # fmt: skip
    esc = html.escape
    best = max(rows, key=lambda h: h.peak_tps)
    quick = min((h for h in rows if h.light_ttft_ms is not None),
                key=lambda h: h.light_ttft_ms or 0.0, default=None)  # fmt: skip
    lines = [f"<p><b>Highest throughput: {best.peak_tps:,.0f} output tok/s</b>, "
             f"{esc(best.config)} at {esc(best.peak_load)}"]  # fmt: skip
    if quick is not None:
        lines.append(f"; <b>lowest TTFT p50: {_ms(quick.light_ttft_ms)}</b>, "
                     f"{esc(quick.config)} at {esc(quick.light_load)}")  # fmt: skip
    lines.append(".</p>")
    header = ("configuration", "peak output tok/s", "at", "TTFT p50 there", "TPOT p50 there",
              "lightest load", "TTFT p50", "TPOT p50", "one stream", "cells measured")  # fmt: skip
    body = []
    for h in rows:
        width = 100 * h.peak_tps / best.peak_tps if best.peak_tps else 0
        bar = (f'<span class="bar" style="width:{width:.0f}px"></span> '
               f"{h.peak_tps:,.0f}")  # fmt: skip
        cells = [esc(h.config), bar, esc(h.peak_load), _ms(h.peak_ttft_ms), _ms(h.peak_tpot_ms),
                 esc(h.light_load), _ms(h.light_ttft_ms), _ms(h.light_tpot_ms),
                 _per_user(h.light_tpot_ms), f"{h.measured} of {h.cells}"]  # fmt: skip
        cls = ' class="best"' if h is best else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    table = ('<table class="glance"><tr>' + "".join(f"<th>{esc(t)}</th>" for t in header)
             + "</tr>" + "".join(body) + "</table>")  # fmt: skip
    return head + "".join(lines) + table
