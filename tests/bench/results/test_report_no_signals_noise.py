"""report.html / report.md of a CPU run whose plan asked for no server signals (no
``[engine] metrics_path``) spend no panel on them (issue 34 item 9: six "Server: ...: not
available" lines), and still state the workload, the SLO goodput uses and the machine's
CPU and load. Real ``gpudoctor bench`` and ``bench report`` processes against the loopback
stream server (tests/bench/stream_server.py)."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.bench.campaign_support import stub_plan, write


def _gd(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args],
                          capture_output=True, text=True, timeout=180, env=env)  # fmt: skip


def _text(page: str) -> str:
    page = re.sub(r"<script.*?</script>|<style.*?</style>", "", page, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def test_a_run_without_metrics_path_gets_no_signals_panel(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    plan = write(
        tmp_path, stub_plan(tiny_model_dir, concurrency="[1, 2]") + "[slo]\nttft_ms = 500\n"
    )
    out = tmp_path / "run"
    assert _gd(str(plan), "--out", str(out)).returncode == 0

    done = _gd("report", str(out))

    assert done.returncode == 0, done.stderr
    page = _text((out / "report.html").read_text())
    md = (out / "report.md").read_text()
    assert "Server signals" not in page and "not available (the plan sets no" not in page
    assert "Server signals" not in md and "metrics_path" not in md
    assert "Workload and SLO" in page and "TTFT ≤ 500 ms (goodput" in page
    machine = page[page.index("Machine fact") :]
    assert "cpu model" in machine and "load avg" in machine
    assert " null " not in machine and " [] " not in machine and " None " not in machine
    ttfts = re.findall(r"TTFT (\S+ \S+)", page[page.index("Request timeline") :])
    assert ttfts and all(re.fullmatch(r"[\d.]+ ms,?", t) for t in ttfts), ttfts[:3]
