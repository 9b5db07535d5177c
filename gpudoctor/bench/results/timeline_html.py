"""report.html's request timeline: the cell a reader picks, drawn from its trace file.

Each ``RUN/trace/<cell>.json`` (:mod:`trace`) becomes one inline SVG: a row per lane,
each request a bar from send to end, its "waiting for the first token" part light and
its streaming part dark, a failed request red with a cross at its end; hovering a bar
shows the request (index, TTFT, end, error). A ``<select>`` shows one cell at a time.
Everything read from the files is escaped; a file that is not a trace is named, not drawn.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpudoctor.bench.results.reader import CellResult
from gpudoctor.bench.results.trace import cell_label, read_trace, trace_name

WIDTH = 900
ROW, PAD_L, PAD_T, PAD_B = 6, 56, 24, 30
MAX_TRACES = 200  # cells offered in the picker (a campaign of more shows the first ones)

SCRIPT = """
function gpudoctorPickCell(sel) {
  document.querySelectorAll('div.timeline').forEach(function (d) {
    d.style.display = d.getAttribute('data-cell') === sel.value ? 'block' : 'none';
  });
}
"""


def section(run_dir: Path, cells: Sequence[CellResult] = ()) -> str:
    """Return the "Request timeline" section of report.html ("" when the run has no
    trace files): the traces in the order of ``cells`` (the report's), so it opens on
    the first cell (issue 47: file names sort c16 before c2), then any other."""
    folder = Path(run_dir) / "trace"
    found = sorted(folder.glob("*.json")) if folder.is_dir() else []
    rank = {trace_name(cell_label(f"{c.config}@tp{c.tp}", c.concurrency, c.request_rate,
                                  c.repeat)): n for n, c in enumerate(cells)}  # fmt: skip
    paths = sorted(found, key=lambda p: (rank.get(p.name, len(rank)), p.name))[:MAX_TRACES]
    if not paths:
        return ""
    options, panels = [], []
    for n, path in enumerate(paths):
        cell = path.stem
        doc = read_trace(path)
        shown = "block" if n == 0 else "none"
        options.append(f'<option value="{html.escape(cell)}">{html.escape(cell)}</option>')
        body = svg(doc) if doc is not None else f"<p>{html.escape(path.name)}: not a trace file</p>"
        panels.append(f'<div class="timeline" data-cell="{html.escape(cell)}" '
                      f'style="display:{shown}">{body}</div>')  # fmt: skip
    return "\n".join([
        "<h2>Request timeline</h2>",
        "<p>Each bar is one request: light until its first token, dark while it streams, "
        "red with a cross when it failed. The same file opens in ui.perfetto.dev "
        "(RUN/trace/&lt;cell&gt;.json).</p>",
        f'<label>Cell: <select id="timeline-pick" onchange="gpudoctorPickCell(this)">'
        f'{"".join(options)}</select></label>',
        *panels,
        f"<script>{SCRIPT}</script>",
    ])  # fmt: skip


def _requests(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc.get("traceEvents", [])
            if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in ("request", "failed")
            and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))
            and isinstance(e.get("tid"), int)]  # fmt: skip


def svg(doc: dict[str, Any]) -> str:
    """Return one cell's timeline as an ``<svg class="timeline">`` element."""
    bars = _requests(doc)
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    if not bars:
        return "<p>No requests in this trace.</p>"
    end_us = max(b["ts"] + b["dur"] for b in bars) or 1
    lanes = max(b["tid"] for b in bars) + 1
    plot_w = WIDTH - PAD_L - 36
    height = PAD_T + lanes * ROW + PAD_B
    x = lambda us: PAD_L + plot_w * us / end_us  # noqa: E731
    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
           f'height="{height}" viewBox="0 0 {WIDTH} {height}">',
           f'<text x="{PAD_L}" y="14" font-size="12">{html.escape(str(meta.get("cell", "")))}: '
           f'{int(meta.get("requests_kept", len(bars)))} of {int(meta.get("requests", len(bars)))} '
           f'requests drawn, {int(meta.get("failed", 0))} failed</text>']  # fmt: skip
    for i in range(6):
        us = end_us * i / 5
        out.append(f'<text x="{x(us):.1f}" y="{height - 10}" font-size="10" '
                   f'text-anchor="middle">{us / 1e6:.3g} s</text>')  # fmt: skip
    ttft = {(e.get("tid"), e.get("ts")): e.get("dur") for e in doc.get("traceEvents", [])
            if isinstance(e, dict) and e.get("name") == "waiting for the first token"}  # fmt: skip
    for b in bars:
        y = PAD_T + b["tid"] * ROW
        x0, x1 = x(b["ts"]), max(x(b["ts"] + b["dur"]), x(b["ts"]) + 1)
        failed = b.get("cat") == "failed"
        args = b.get("args") if isinstance(b.get("args"), dict) else {}
        tip = html.escape(f"{b.get('name')}: sent {b['ts'] / 1e6:.3f} s, ended "
                          f"{(b['ts'] + b['dur']) / 1e6:.3f} s, TTFT {_ms(args.get('ttft_s'))}"
                          + (f", {args.get('error')}" if failed else ""))  # fmt: skip
        wait = ttft.get((b["tid"], b["ts"]))
        color = "#d62728" if failed else "#1f77b4"
        out.append(f'<g class="{"failed" if failed else "request"}"><title>{tip}</title>')
        out.append(f'<rect x="{x0:.1f}" y="{y}" width="{x1 - x0:.1f}" height="{ROW - 1}" '
                   f'fill="{color}"/>')  # fmt: skip
        if isinstance(wait, (int, float)) and not failed:
            out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x(b["ts"] + wait) - x0, 0):.1f}" '
                       f'height="{ROW - 1}" fill="#aec7e8"/>')  # fmt: skip
        if failed:
            out.append(
                f'<text x="{x1:.1f}" y="{y + ROW}" font-size="{ROW + 3}" fill="#d62728">'
                "\u2715</text>"
            )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def _ms(seconds: object) -> str:
    """Return a TTFT in seconds as the tooltip shows it ("6.67 ms"; "-" when unknown)."""
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        return f"{seconds * 1000:.3g} ms"
    return "-"
