"""report.html as a benchmarker reads it (issue 47), through the real CLI (`bench report`)
on runs of the real campaign against tests/bench/stream_server.py, the page opened in a real
headless Chromium: the headline per configuration at the top, no empty "no data" charts for
a failed run, tick labels without exponents, legends below the plots, a closed-loop rate
that reads as one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.bench.campaign_support import help_cache, local_quirks, stub_plan, write
from tests.bench.results.test_html_report import _chromium

__all__ = ["help_cache", "local_quirks"]

GD = [sys.executable, "-m", "gpudoctor"]
CONFIGS = ('[[configs]]\nname = "fast"\nargs = { token-delay-ms = 1 }\n'
           '[[configs]]\nname = "slow"\nargs = { token-delay-ms = 4 }\n')  # fmt: skip


def _run_and_report(tmp_path: Path, plan: str) -> tuple[Path, str]:
    """Run ``plan`` and `bench report` it (real subprocesses); return the run dir and the
    DOM Chromium built from report.html."""
    out = tmp_path / "run"
    subprocess.run([*GD, "bench", str(write(tmp_path, plan)), "--out", str(out)],
                   capture_output=True, text=True, timeout=600)  # fmt: skip
    done = subprocess.run([*GD, "bench", "report", str(out)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    dom = _chromium(tmp_path, "--dump-dom", (out / "report.html").as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-errors="yes"' not in dom.stdout
    return out, dom.stdout


def test_the_page_opens_on_each_configurations_throughput_and_latency(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    workload = "input_len = 32\noutput_len = 16\nnum_prompts = 16\nwarmup = 0"
    _, dom = _run_and_report(tmp_path, stub_plan(tiny_model_dir, CONFIGS, "[1, 4]", workload))
    heads = re.findall(r"<h2>(.*?)</h2>", dom)
    assert heads[0] == "At a glance: each configuration's throughput and the latency it costs"
    glance = dom.split("</h2>", 2)[1]
    assert "<b>Highest throughput: " in glance and "<b>lowest TTFT p50: " in glance
    rows = re.findall(r"<tr[^>]*><td>([^<]*)</td>", glance.split('<table class="glance">')[1])
    assert rows == ["fast (TP1)", "slow (TP1)"] or rows == ["slow (TP1)", "fast (TP1)"]
    assert 'class="best"' in glance
    # the closed-loop rate column, the axes and the legends (issue 47)
    assert "- (sent" not in dom and "closed loop, " in dom
    ticks = re.findall(r'font-size="10"[^>]*>([^<]*)</text>', dom)
    assert ticks and not [t for t in ticks if re.fullmatch(r"-?[\d.]+e[+-]\d+", t)]
    for chart in re.findall(r'<svg class="chart".*?</svg>', dom, re.S):
        height = int(re.search(r'viewBox="0 0 560 (\d+)"', chart).group(1))  # type: ignore[union-attr]
        legend = re.findall(r'<text x="[\d.]+" y="([\d.]+)" font-size="10">(fast|slow)', chart)
        assert legend and all(float(y) > 320 for y, _ in legend)  # below the plot
        assert height > 320


def test_a_failed_run_shows_no_empty_charts(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A failed run showed four large empty "no data" charts."""
    plan = stub_plan(tiny_model_dir, '[[configs]]\nname = "a"\n', "[1, 2]",
                     server_args="reject-status = 500")  # fmt: skip
    _, dom = _run_and_report(tmp_path, plan)
    assert "no data" not in dom and '<svg class="chart"' not in dom
    assert "<p>No chart: no cell was measured.</p>" in dom
    assert "<b>No configuration has a measured cell</b>" in dom
