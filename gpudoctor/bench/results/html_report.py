"""report.html: one self-contained page a person opens in a browser (no network, no CDN).

Plots are inline SVG made here (:mod:`svg`); a few lines of inline script only toggle a
series when its legend entry is clicked and mark the page as rendered
(``<body data-rendered="N">``, N = charts; script errors are written into ``#errors``).
Sections: each configuration's headline (:mod:`headline`: throughput against latency at a
glance); throughput vs TPOT per configuration with the Pareto front across all of
them ringed; TTFT and TPOT percentiles vs load; goodput vs load; GPU telemetry over
the campaign (one point per cell, in the order they ran); the searches' results;
crashed and skipped cells with their log tails; the machine (run.json). Every string
from the run directory is escaped.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpudoctor import fsio
from gpudoctor.bench.results import headline
from gpudoctor.bench.results.reader import CellResult, RunResults, SearchLine
from gpudoctor.bench.results.repeats import RepeatGroup, group_cells
from gpudoctor.bench.results.report_facts import (
    attention,
    machine_rows,
    slo_text,
    status_counts,
    workload_rows,
)
from gpudoctor.bench.results.summary_table import rate_text
from gpudoctor.bench.results.svg import Series, line_chart, pareto_front

_SCRIPT = """
window.onerror = function (msg, src, line) {
  var box = document.getElementById('errors');
  box.textContent += msg + ' (line ' + line + ')\\n';
  document.body.setAttribute('data-errors', 'yes');
};
document.addEventListener('DOMContentLoaded', function () {
  var charts = document.querySelectorAll('svg.chart');
  charts.forEach(function (chart) {
    chart.querySelectorAll('g.series').forEach(function (g) {
      g.style.cursor = 'pointer';
      g.addEventListener('click', function () { g.style.opacity = g.style.opacity === '0.15' ? '1' : '0.15'; });
    });
  });
  document.body.setAttribute('data-rendered', String(charts.length));
  document.title = document.title + ' (' + charts.length + ' charts)';
});
"""
_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
table { border-collapse: collapse; font-size: 13px; margin: 0.5em 0 1.5em; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
pre { background: #f6f6f6; padding: 6px; font-size: 11px; max-height: 16em; overflow: auto; }
#errors { color: #b00; }
.bar { display: inline-block; height: 9px; background: #1f77b4; vertical-align: middle; }
tr.best td { font-weight: bold; background: #eef5fb; }
"""


def _load_axis(cells: Sequence[CellResult]) -> tuple[str, Any]:
    rated = {
        c.request_rate
        for c in cells
        if c.request_rate is not None and not math.isinf(c.request_rate)
    }
    if len(rated) > 1 or (len({c.concurrency for c in cells}) < 2 and rated):
        return (
            "request rate (req/s)",
            lambda c: (
                c.request_rate
                if c.request_rate is not None and not math.isinf(c.request_rate)
                else None
            ),
        )
    return "concurrency", lambda c: float(c.concurrency)


def _mean(group: RepeatGroup, metric: str) -> float | None:
    s = group.spread(metric)
    return None if s is None else s.mean


def _by_config(groups: Sequence[RepeatGroup]) -> dict[str, list[RepeatGroup]]:
    out: dict[str, list[RepeatGroup]] = {}
    for g in groups:
        if g.measured:
            out.setdefault(f"{g.first.config} (TP{g.first.tp})", []).append(g)
    return out


def _metric_chart(title: str, xlabel: str, x_of: Any, configs: dict[str, list[RepeatGroup]],
                  metrics: Sequence[tuple[str, bool]], ylabel: str) -> str:  # fmt: skip
    """Return one chart of ``metrics`` over load, a line per configuration; "" when no
    configuration has a value (no empty "no data" chart: issue 47)."""
    series = []
    for color, (label, groups) in enumerate(configs.items()):
        for metric, dashed in metrics:
            pts = []
            for g in groups:
                x, y = x_of(g.first), _mean(g, metric)
                if x is not None and y is not None:
                    pts.append((x, y, f"{g.first.load_label}: {metric} {y:.4g}"))
            if pts:
                name = label if not dashed else f"{label} {metric}"
                series.append(Series(name, tuple(sorted(pts)), dashed, color))
    return line_chart(title, xlabel, ylabel, series) if series else ""


def charts(run: RunResults, telemetry_rows: list[dict[str, Any]]) -> list[str]:
    """Return the report's SVG charts (see the module docstring)."""
    cells = list(run.cells)
    groups = group_cells(cells)
    configs = _by_config(groups)
    xlabel, x_of = _load_axis(cells)
    series, all_points = [], []
    for color, (label, rows) in enumerate(configs.items()):
        pts = []
        for g in rows:
            x, y = _mean(g, "median_tpot_ms"), _mean(g, "output_throughput")
            if x is not None and y is not None:
                pts.append((x, y, f"{g.first.load_label}: TPOT p50 {x:.3g} ms, {y:.4g} tok/s"))
        if pts:
            series.append(Series(label, tuple(sorted(pts)), False, color))
            all_points += [(x, y) for x, y, _ in pts]
    front = pareto_front(all_points)
    out = [line_chart("Output throughput vs median TPOT (Pareto front ringed)", "median TPOT (ms)",
                      "output tokens/s", series, marked=front, front=front)] if series else []  # fmt: skip
    out.append(_metric_chart("TTFT p50 (solid) / p99 (dashed)", xlabel, x_of, configs,
                             (("median_ttft_ms", False), ("p99_ttft_ms", True)), "ms"))  # fmt: skip
    out.append(_metric_chart("TPOT p50 (solid) / p99 (dashed)", xlabel, x_of, configs,
                             (("median_tpot_ms", False), ("p99_tpot_ms", True)), "ms"))  # fmt: skip
    out.append(_metric_chart("Goodput (requests/s meeting the SLO)", xlabel, x_of, configs,
                             (("goodput", False),), "req/s"))  # fmt: skip
    tele = []
    for name, unit in (("util_pct", "GPU util %"), ("power_w", "power W"), ("temp_c", "temp °C")):
        pts = tuple((float(i), float(r[name]), f"{r['label']}: {unit} {r[name]:.3g}")
                    for i, r in enumerate(telemetry_rows) if isinstance(r.get(name), (int, float)))  # fmt: skip
        if pts:
            tele.append(Series(unit, pts, False, len(tele)))
    if tele:  # a panel only where there is telemetry (a CPU run has none)
        out.append(line_chart("GPU telemetry over the campaign (mean per cell, in run order)",
                              "cell (run order)", "value", tele))  # fmt: skip
    return [chart for chart in out if chart]


def _telemetry_rows(cells: Sequence[CellResult]) -> list[dict[str, Any]]:
    rows = []
    for c in cells:
        t = (c.measurement or {}).get("telemetry") if c.ok else None
        if isinstance(t, dict) and t:
            row: dict[str, Any] = {"label": f"{c.config} {c.load_label}"}
            for name in ("util_pct", "power_w", "temp_c"):
                v = t.get(name)
                if isinstance(v, dict) and isinstance(v.get("mean"), (int, float)):
                    row[name] = v["mean"]
            rows.append(row)
    return rows


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _searches(searches: Sequence[SearchLine]) -> str:
    if not searches:
        return "<p>No search in this run.</p>"
    rows = []
    for s in searches:
        d = s.search
        slo = ", ".join(f"{k} ≤ {v:g}" for k, v in (d.get("slo") or {}).items() if v is not None)
        rows.append((s.label, str(d.get("over")), "none" if d.get("met") is None else f"{d['met']:g}",
                     "none" if d.get("failed") is None else f"{d['failed']:g}",
                     str(len(d.get("probes") or [])), slo, str(d.get("goodput")), s.status))  # fmt: skip
    return _table(("config", "over", "highest met", "first failing", "probes", "SLO", "goodput ≥",
                   "status"), rows)  # fmt: skip


def _summary(groups: Sequence[RepeatGroup]) -> str:
    rows = []
    for g in groups:
        c = g.first
        vals = [_mean(g, m) for m in ("output_throughput", "median_ttft_ms", "p99_ttft_ms",
                                      "median_tpot_ms", "p99_tpot_ms", "goodput")]  # fmt: skip
        tput = g.spread("output_throughput")
        spread = (
            f"±{tput.rel_std:.1%}"
            if tput and tput.rel_std is not None and len(tput.values) > 1
            else ""
        )
        rows.append((f"{c.config} (TP{c.tp})", str(c.concurrency), rate_text(c),
                     g.status(), *("–" if v is None else f"{v:.4g}" for v in vals),
                     str(len(g.cells)), spread))  # fmt: skip
    return _table(("config", "c", "rate", "status", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
                   "TPOT p99", "goodput", "runs", "spread"), rows)  # fmt: skip


def _attention(cells: Sequence[CellResult]) -> str:
    rows = attention(cells)
    if not rows:
        return "<p>None: every cell is ok, its requests succeeded, no flag.</p>"
    return _table(("cell", "what", "why"), rows)


def _workload(run_dir: Path) -> str:
    rows = workload_rows(run_dir) or [("workload", "unknown: plan.toml is missing or unreadable")]
    return _table(("workload", "value"), [*rows, ("SLO", slo_text(run_dir))])


def _failures(cells: Sequence[CellResult]) -> str:
    bad = [c for c in cells if c.status in ("crashed", "skipped", "failed")]
    if not bad:
        return "<p>None.</p>"
    from gpudoctor.redact import Redactor

    secrets = Redactor(identities=False)  # a server's log may print its token: as the bundle
    parts = []
    for c in bad:
        extra = c.extra or {}
        tail = secrets.redact("\n".join(extra.get("server_log_tail") or []), "report.html")
        parts.append(f"<h3>{html.escape(f'{c.config} (TP{c.tp}) {c.load_label}: {c.status}')}</h3>"
                     f"<p>{html.escape(str(extra.get('reason') or ''))}</p>"
                     + (f"<pre>{html.escape(tail)}</pre>" if tail else ""))  # fmt: skip
    return "".join(parts)


def _machine(run_dir: Path) -> str:
    try:
        facts = json.loads(fsio.read_regular(Path(run_dir) / "run.json", follow_dir_link=True))
    except (OSError, ValueError):
        return "<p>No readable run.json.</p>"
    if not isinstance(facts, dict):
        return "<p>No readable run.json.</p>"
    return _table(("fact", "value"), machine_rows(facts))


def _signals_and_timeline(run_dir: Path, cells: Sequence[CellResult]) -> list[str]:
    """Return the server-signal panels (one per signal over load) and the request
    timeline's section; nothing for a run measured without them."""
    from gpudoctor.bench.results import signals_view, timeline_html

    xlabel, x_of = _load_axis(cells)
    panels = signals_view.html_panels(cells, x_of, xlabel)
    out = ["<h2>Server signals (from /metrics during each cell)</h2>",
           '<div class="charts">', *panels, "</div>"] if panels else []  # fmt: skip
    timeline = timeline_html.section(run_dir, [g.first for g in group_cells(list(cells))])
    return [*out, timeline] if timeline else out


def render_html(run_dir: Path, run: RunResults, notes: Sequence[str] = ()) -> str:
    """Return report.html's text for the run (``notes``: warnings shown at the top)."""
    cells = list(run.cells)
    groups = group_cells(cells)
    name = html.escape(Path(run_dir).name)
    svgs = charts(run, _telemetry_rows(cells))
    warn = "".join(f"<p><b>Warning:</b> {html.escape(n)}</p>" for n in notes)
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Benchmark report: {name}</title><style>{_STYLE}</style>",
        f"<script>{_SCRIPT}</script></head><body>",
        f"<h1>Benchmark report: {name}</h1>", '<pre id="errors"></pre>', warn,
        f"<p>{html.escape(status_counts(cells))} Definitions: docs/bench-metrics.md. "
        "Click a line to fade it.</p>",
        headline.section(groups),
        "<h2>Failed, suspect and client-bound cells</h2>", _attention(cells),
        "<h2>Workload and SLO</h2>", _workload(run_dir),
        '<h2>Charts</h2><div class="charts">', *svgs, "</div>" if svgs else
        "</div><p>No chart: no cell was measured.</p>",
        "<h2>Cells</h2>", _summary(groups),
        "<h2>Search: the highest load that met the SLO</h2>", _searches(run.searches),
        *_signals_and_timeline(run_dir, cells),
        "<h2>Failed, crashed and skipped cells: server log tails</h2>", _failures(cells),
        "<h2>Machine</h2>", _machine(run_dir),
        "</body></html>",
    ])  # fmt: skip
