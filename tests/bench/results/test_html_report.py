"""report.html opened in a real headless Chromium (Debian's ``chromium``): it renders
its charts without a script error, loads nothing from the network, shows the crashed
cell's log tail, and a screenshot is taken. The run comes from the real campaign
against tests/bench/stream_server.py."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.report import write_report
from tests.bench.campaign_support import help_cache, local_quirks, stub_plan, write

__all__ = ["help_cache", "local_quirks"]

CHROMIUM = shutil.which("chromium")
CONFIGS = ('[[configs]]\nname = "fast"\nargs = { token-delay-ms = 1 }\n'
           '[[configs]]\nname = "slow"\nargs = { token-delay-ms = 4 }\n'
           '[[configs]]\nname = "broken"\nargs = { fail-start = true }\n')  # fmt: skip


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if CHROMIUM is None:
        if os.environ.get("GPUDOCTOR_REQUIRE_LAB"):
            pytest.fail("chromium is not installed (tests/run.sh installs it)")
        pytest.skip("chromium is not installed (apt-get install chromium; tests/run.sh does)")
    profile = tmp_path / "chromium-profile"
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", f"--user-data-dir={profile}", *args]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_report_html_renders_in_chromium_without_errors(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    workload = "input_len = 32\noutput_len = 6\nnum_prompts = 6\nwarmup = 0"
    text = (
        stub_plan(tiny_model_dir, CONFIGS, "[2, 4]", workload).replace(
            "concurrency = [2, 4]\n", 'concurrency = [2, 4]\nrequest_rate = [30, "inf"]\n'
        )
        + "[slo]\nttft_ms = 200\n"
    )
    out = tmp_path / "run"
    run_campaign(load_plan(write(tmp_path, text)), LaunchOptions(out=out))
    files = write_report(out)
    assert files.html is not None and files.html.is_file()
    page = files.html.read_text(encoding="utf-8")
    assert "<link" not in page and " src=" not in page and "@import" not in page  # no fetch at all
    assert page.count('<svg class="chart"') == 4  # no GPU telemetry panel on a CPU run
    assert "GPU telemetry" not in page
    assert "fail-start given, refusing to start" in page  # the crashed config's log tail
    # for a benchmarker (issues 31, 34.9): the workload and the SLO, no raw null / []
    assert "32 in / 6 out tokens" in page and "TTFT ≤ 200 ms" in page
    assert "open loop, 30, inf req/s, Poisson arrivals" in page
    assert "<td>null</td>" not in page and "<td>[]</td>" not in page
    assert "cpu model" in page and "load avg" in page
    dom = _chromium(tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", files.html.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-rendered="4"' in dom.stdout, dom.stdout[:2000]
    assert 'data-errors="yes"' not in dom.stdout
    assert "Uncaught" not in dom.stderr and "CONSOLE" not in dom.stderr, dom.stderr[-2000:]
    shot = tmp_path / "report.png"
    done = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1000,1250",
                     "--hide-scrollbars", files.html.as_uri())  # fmt: skip
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    assert _png_size(shot) == (1000, 1250)
    assert shot.stat().st_size > 20_000  # charts drawn, not a blank page
    keep = os.environ.get("GPUDOCTOR_REPORT_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


def test_a_page_with_a_script_error_is_caught(tmp_path: Path) -> None:
    """The error trap works: a page whose script throws says so in the dumped DOM."""
    from gpudoctor.bench.results import html_report

    page = tmp_path / "broken.html"
    page.write_text(f"<html><head><script>{html_report._SCRIPT}</script></head><body>"
                    '<pre id="errors"></pre><script>undefinedFunction()</script></body></html>')  # fmt: skip
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert 'data-errors="yes"' in dom.stdout and "undefinedFunction" in dom.stdout
