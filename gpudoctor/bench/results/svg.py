"""Line charts as inline SVG text (no library, no network): for report.html.

Every label is escaped (names come from plans and result files someone else may have
written); each point has a ``<title>`` the browser shows on hover.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH, HEIGHT = 560, 320
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 64, 16, 28, 44
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip


@dataclass(frozen=True)
class Series:
    """One line: a label, its points ``(x, y, hover text)`` and a dash style."""

    label: str
    points: tuple[tuple[float, float, str], ...]
    dashed: bool = False
    color: int = 0


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if not math.isfinite(high - low):  # values the reader refuses; never a crash here
        return [low, high] if math.isfinite(low) and math.isfinite(high) else [0.0]
    if high <= low:
        return [low]
    step = 10 ** math.floor(math.log10((high - low) / count))
    for factor in (1, 2, 5, 10):
        if (high - low) / (step * factor) <= count:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 1)]


def _widen(value: float) -> float:
    return max(1.0, abs(value) / 1e6)


def _fmt(value: float) -> str:
    """Return a tick label: 3 significant digits below 1000, whole numbers above (never
    ``4e+03``: issue 47)."""
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


LEGEND_ROW = 14  # px per legend row, below the chart's axis label


def _legend(series: Sequence[Series]) -> tuple[list[str], int]:
    """Return the legend's elements (the solid series, left to right, wrapped) placed below
    the plot, where no data point is (issue 47), and the height they add to the chart."""
    out, x, row = [], _PAD_L, 0
    for s in (x for x in series if not x.dashed):
        width = 22 + 6 * len(s.label) + 14
        if x > _PAD_L and x + width > WIDTH - _PAD_R:
            x, row = _PAD_L, row + 1
        y = HEIGHT + 4 + row * LEGEND_ROW
        color = COLORS[s.color % len(COLORS)]
        out.append(f'<rect x="{x}" y="{y + 4}" width="10" height="3" fill="{color}"/>'
                   f'<text x="{x + 14}" y="{y + 8}" font-size="10">{html.escape(s.label)}</text>')  # fmt: skip
        x += width
    return out, (row + 1) * LEGEND_ROW + 4 if out else 0


def line_chart(
    title: str, xlabel: str, ylabel: str, series: Sequence[Series],
    marked: Sequence[tuple[float, float]] = (), front: Sequence[tuple[float, float]] = (),
) -> str:  # fmt: skip
    """Return an ``<svg class="chart">`` element: the series as lines with dots, the
    ``marked`` points ringed and ``front`` drawn as a thick grey line (a Pareto front);
    a legend below the plot. Empty series give a chart saying "no data"."""
    points = [(x, y) for s in series for x, y, _ in s.points] + list(front)
    esc = html.escape
    legend, extra = _legend(series) if points else ([], 0)
    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} '
           f'{HEIGHT + extra}" width="{WIDTH}" height="{HEIGHT + extra}" role="img" '
           f'aria-label="{esc(title)}">',
           f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13" '
           f'font-weight="bold">{esc(title)}</text>']  # fmt: skip
    if not points:
        out.append(f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" fill="#666">'
                   "no data</text></svg>")  # fmt: skip
        return "".join(out)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0.0, min(ys)), max(ys)
    # one value on an axis: widen it by 1, or by a millionth where 1 is lost in the float
    # (values up to reader.METRIC_BOUND); a zero-width axis would divide by zero
    x0, x1 = (x0 - _widen(x0), x1 + _widen(x1)) if x0 == x1 else (x0, x1)
    y1 = y1 + _widen(y1) if y1 == y0 else y1 * 1.05
    w, h = WIDTH - _PAD_L - _PAD_R, HEIGHT - _PAD_T - _PAD_B

    def px(x: float) -> float:
        return _PAD_L + (x - x0) / (x1 - x0) * w

    def py(y: float) -> float:
        return _PAD_T + h - (y - y0) / (y1 - y0) * h

    out.append(
        f'<rect x="{_PAD_L}" y="{_PAD_T}" width="{w}" height="{h}" fill="none" stroke="#999"/>'
    )
    for t in _ticks(x0, x1):
        out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{_PAD_T + h}" y2="{_PAD_T + h + 4}" '
                   f'stroke="#999"/><text x="{px(t):.1f}" y="{_PAD_T + h + 16}" font-size="10" '
                   f'text-anchor="middle">{_fmt(t)}</text>')  # fmt: skip
    for t in _ticks(y0, y1):
        out.append(f'<line x1="{_PAD_L}" x2="{_PAD_L + w}" y1="{py(t):.1f}" y2="{py(t):.1f}" '
                   f'stroke="#eee"/><text x="{_PAD_L - 4}" y="{py(t) + 3:.1f}" font-size="10" '
                   f'text-anchor="end">{_fmt(t)}</text>')  # fmt: skip
    out.append(f'<text x="{_PAD_L + w / 2}" y="{HEIGHT - 6}" font-size="11" text-anchor="middle">'
               f'{esc(xlabel)}</text><text x="12" y="{_PAD_T + h / 2}" font-size="11" '
               f'text-anchor="middle" transform="rotate(-90 12 {_PAD_T + h / 2})">{esc(ylabel)}</text>')  # fmt: skip
    if front:
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in front)
        out.append(
            f'<polyline class="front" points="{path}" fill="none" stroke="#bbb" '
            'stroke-width="6" stroke-linejoin="round"/>'
        )
    for s in series:
        color = COLORS[s.color % len(COLORS)]
        dash = ' stroke-dasharray="5,3"' if s.dashed else ""
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, _ in s.points)
        out.append(f'<g class="series" data-label="{esc(s.label)}"><polyline points="{path}" '
                   f'fill="none" stroke="{color}" stroke-width="1.6"{dash}/>')  # fmt: skip
        for x, y, hover in s.points:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}">'
                       f"<title>{esc(s.label)}: {esc(hover)}</title></circle>")  # fmt: skip
        out.append("</g>")
    for x, y in marked:
        out.append(
            f'<circle class="marked" cx="{px(x):.1f}" cy="{py(y):.1f}" r="7" fill="none" '
            'stroke="#000" stroke-width="1.5"/>'
        )
    out += legend
    out.append("</svg>")
    return "".join(out)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Return the points no other point beats (lower x and higher y is better), by x."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(set(points), key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front
