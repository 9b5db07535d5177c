"""The server signals of each cell (``measurement["server_signals"]``, written by the
scraper) as the table's text, report.md's section, report.html's panels and compare's
lines. A signal the server did not export reads "not available" (never 0)."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

from gpudoctor.bench.results.md_escape import md_text
from gpudoctor.bench.results.reader import CellResult
from gpudoctor.bench.results.svg import Series, line_chart

NOT_AVAILABLE = "not available"
# signal -> (column, how a value reads)
COLUMNS: dict[str, tuple[str, Callable[[float], str]]] = {
    "kv_cache_usage": ("KV max", lambda v: f"{v * 100:.0f}%"),
    "running": ("running max", lambda v: f"{v:.0f}"),
    "waiting": ("waiting max", lambda v: f"{v:.0f}"),
    "preemptions": ("preempt", lambda v: f"{v:.0f}"),
    "prefix_cache_hit_rate": ("prefix hit", lambda v: f"{v * 100:.0f}%"),
    "spec_accept_length": ("accept len", lambda v: f"{v:.2f}"),
}
_PEAK = {"kv_cache_usage", "running", "waiting"}  # gauges shown by their maximum


def entry(cell: CellResult, signal: str) -> dict[str, Any] | None:
    """Return the cell's record of ``signal`` (``{"available": ..}``), None when the
    cell was measured without the scraper (older runs)."""
    signals = ((cell.measurement or {}).get("server_signals") or {}).get("signals") or {}
    value = signals.get(signal)
    return value if isinstance(value, dict) else None


def value(cell: CellResult, signal: str) -> float | None:
    """Return the signal's figure for the cell (a gauge's max for KV/running/waiting, its
    mean otherwise; a counter's delta), None when not available."""
    e = entry(cell, signal)
    if not e or not e.get("available"):
        return None
    v = e.get("max") if signal in _PEAK and "max" in e else e.get("value")
    return float(v) if isinstance(v, (int, float)) else None


def text(cell: CellResult, signal: str) -> str:
    """Return the signal as the table shows it ("63%", "2.41", "not available", "-" when
    the cell has no signals at all)."""
    e = entry(cell, signal)
    if e is None:
        return "-"
    v = value(cell, signal)
    return NOT_AVAILABLE if v is None else COLUMNS[signal][1](v)


def histogram_text(cell: CellResult) -> str:
    """Return the per-position acceptance ("0.90 0.70 0.40"), or "not available"."""
    e = entry(cell, "spec_accept_histogram")
    if e is None:
        return "-"
    per = e.get("value") if e.get("available") else None
    if not isinstance(per, dict):
        return NOT_AVAILABLE
    return " ".join(f"{float(v):.2f}" for v in per.values())


def markdown_section(cells: Sequence[CellResult]) -> str:
    """Return report.md's "Server signals" section: one row per measured cell, and why
    a signal is not available (the first reason seen per signal). Every text of the run
    (a config name, a reason that quotes a server's /metrics line) is literal Markdown
    (``md_escape.md_text``): no renderer makes HTML of it."""
    measured = _worth_showing(cells)
    if not measured:
        return ""
    if not _any_available(measured):
        why = next(iter(unavailable_reasons(measured).values()), "no cell exported one")
        return f"## Server signals\n\nNone available ({md_text(why)}).\n"
    head = ["config", "TP", "load", *(c for c, _ in COLUMNS.values()), "accept per position"]
    lines = ["## Server signals (scraped from /metrics during each cell)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    for c in measured:
        row = [c.config, str(c.tp), c.load_label, *(text(c, s) for s in COLUMNS),
               histogram_text(c)]  # fmt: skip
        lines.append("| " + " | ".join(md_text(x) for x in row) + " |")
    reasons = unavailable_reasons(measured)
    if reasons:
        lines += ["", *(f"- {s}: not available ({md_text(why)})" for s, why in reasons.items())]
    return "\n".join(lines) + "\n"


def _worth_showing(cells: Sequence[CellResult]) -> list[CellResult]:
    """Return the cells whose server signals a report shows: none when no cell scraped a
    /metrics (the plan asked for none, e.g. a CPU run with no ``metrics_path``)."""
    measured = [c for c in cells if c.measurement and c.measurement.get("server_signals")]
    scraped = any((c.measurement or {}).get("server_signals", {}).get("url") for c in measured)
    return measured if scraped else []


def _any_available(cells: Sequence[CellResult]) -> bool:
    """Return whether any cell has any signal with a value."""
    return any(value(c, s) is not None for c in cells for s in COLUMNS)


def unavailable_reasons(cells: Sequence[CellResult]) -> dict[str, str]:
    """Return signal -> the first reason a cell gave for it not being available."""
    out: dict[str, str] = {}
    for c in cells:
        for s in [*COLUMNS, "spec_accept_histogram"]:
            e = entry(c, s)
            if e is not None and not e.get("available") and s not in out:
                out[s] = str(e.get("why") or "no reason given")
    return out


def plain(why: str) -> str:
    """Return a scrape failure as a reader reads it (issue 47: "RuntimeError: GET
    http://127.0.0.1:41234/metrics: HTTP 404"): no exception class, no host and port."""
    import re
    from urllib.parse import urlsplit

    text = re.sub(r"^\w*(Error|Exception): ", "", why)
    found = re.fullmatch(r"GET (\S+): HTTP (\d{3})", text)
    if found:
        path = urlsplit(found.group(1)).path or "/"
        return (
            f"the server answered HTTP {found.group(2)} to GET {path}: it exports no metrics there"
        )
    return text


def html_panels(cells: Sequence[CellResult], x_of: Callable[[CellResult], float | None],
                xlabel: str) -> list[str]:  # fmt: skip
    """Return report.html's panels: one chart per signal over load, a line per
    configuration; a signal no cell has says so instead of a chart."""
    measured = _worth_showing(cells)
    if not measured:
        return []
    if not _any_available(measured):  # one line, not a panel of "not available" per signal
        why = next(iter(unavailable_reasons(measured).values()), "no cell exported one")
        return [f'<p class="na">Server signals: none collected ({html.escape(plain(why))})</p>']
    out = []
    configs: dict[str, list[CellResult]] = {}
    for c in measured:
        configs.setdefault(f"{c.config} (TP{c.tp})", []).append(c)
    reasons = unavailable_reasons(measured)
    for signal, (column, fmt) in COLUMNS.items():
        series = []
        for color, (label, rows) in enumerate(configs.items()):
            pts = []
            for c in rows:
                x, y = x_of(c), value(c, signal)
                if x is not None and y is not None:
                    pts.append((x, y, f"{c.load_label}: {column} {fmt(y)}"))
            if pts:
                series.append(Series(label, tuple(sorted(pts)), False, color))
        if series:
            out.append(line_chart(f"Server: {column}", xlabel, column, series))
        else:
            why = html.escape(reasons.get(signal, "no cell exported it"))
            out.append(f'<p class="na">Server: {html.escape(column)}: not available ({why})</p>')
    return out


TABLE_SIGNALS = ("kv_cache_usage", "waiting", "preemptions", "spec_accept_length")


def table_columns(
    cells: Sequence[CellResult],
) -> tuple[tuple[str, ...], list[tuple[str, ...]], list[str]]:
    """Return the closing table's server-signal columns: (header, one row of texts per
    cell, footnotes). No columns when no cell has an available signal; then one footnote
    says why they are not available when a /metrics was scraped (nothing when none was
    configured, or for runs measured without a scraper)."""
    reasons = unavailable_reasons(cells)
    scraped = any(((c.measurement or {}).get("server_signals") or {}).get("url") for c in cells)
    if not any(value(c, s) is not None for c in cells for s in TABLE_SIGNALS):
        if not reasons or not scraped:
            return (), [() for _ in cells], []
        why = next(iter(reasons.values()))
        return (), [() for _ in cells], [f"server signals: not available ({why})"]
    header = tuple(COLUMNS[s][0] for s in TABLE_SIGNALS)
    rows = [tuple("n/a" if text(c, s) == NOT_AVAILABLE else text(c, s) for s in TABLE_SIGNALS)
            for c in cells]  # fmt: skip
    notes = [f"n/a: {COLUMNS[s][0]} not available ({why})" for s, why in reasons.items()
             if s in TABLE_SIGNALS]  # fmt: skip
    return header, rows, notes


def compare_lines(a: CellResult, b: CellResult) -> list[str]:
    """Return ``bench compare``'s lines for one matched cell: each signal A -> B, "not
    available" where a side lacks it; nothing when neither side has signals."""
    if entry(a, "running") is None and entry(b, "running") is None:
        return []
    out = []
    for signal, (column, _fmt) in COLUMNS.items():
        ta, tb = text(a, signal), text(b, signal)
        if ta != tb or ta != NOT_AVAILABLE:
            out.append(f"    {column}: {ta} -> {tb}")
    return out
