"""A hostile or broken server's /metrics through the real ``gpudoctor bench`` (issue 46.5-7).

The engine is tests/bench/stream_server.py (a real HTTP server) serving a crafted /metrics
text with ``[engine] metrics_path``; gpudoctor runs as a subprocess, as a user runs it.

* 46.5: ``vllm:num_preemptions_total{position="0"} 3`` (a label the signal does not
  expect) made the summary raise TypeError at the cell's end: "this is a gpudoctor bug", no
  record written, every resume dying the same way. Now the value is not read, the cell's
  record is written, the run exits 0.
* 46.6: a bad line whose labels hold control sequences (OSC 52 clipboard write, window
  title, clear screen) is quoted by the parser's error in the closing table's footnote:
  they reached the terminal raw; now every run-file string is shown escaped.
* 46.7: the same with HTML: report.md's "Server signals" section quoted it raw, and a
  renderer that allows HTML ran its handler; now it is literal text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from markdown_it import MarkdownIt

from tests.bench.campaign_support import (
    STREAM_SERVER,
    help_cache,
    local_quirks,
    stub_plan,
    write,
)

__all__ = ["help_cache", "local_quirks"]

# Each request streams for about 1.2 s (8 tokens, 150 ms apart), so that the cell outlasts
# the scraper's first waits and a gauge is read from a scrape under load (scraper.RAMP_S).
CONFIGS = '[[configs]]\nname = "slow"\nargs = { token-delay-ms = 150 }\n'
WORKLOAD = "input_len = 32\noutput_len = 8\nnum_prompts = 4\nwarmup = 0"
EVIL = "\x1b]52;c;cHduZWQ=\x07\x1b]0;PWNED\x07\x1b[2J<img/src=x/onerror=alert(1)>"


def _run(
    tmp_path: Path, model_dir: Path, metrics: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    served = tmp_path / "metrics.prom"
    served.write_text(metrics)
    text = stub_plan(model_dir, CONFIGS, "[2]", WORKLOAD)
    text = text.replace('"{port}"]', f'"{{port}}", "--metrics-file", "{served}"]')
    text = text.replace('version = "stub-1"', 'version = "stub-1"\nmetrics_path = "/metrics"')
    plan = write(tmp_path, text, "plan.toml")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", str(plan), "--out", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    return proc, out


def test_a_position_label_on_a_counter_does_not_stop_the_campaign(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    proc, out = _run(tmp_path, tiny_model_dir,
                     'vllm:num_requests_running 1\nvllm:num_preemptions_total{position="0"} 3\n')  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "gpudoctor bug" not in proc.stdout + proc.stderr
    (record,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert record["status"] == "ok"
    signals = record["measurement"]["server_signals"]["signals"]
    assert signals["running"]["available"] is True
    assert signals["preemptions"] == {
        "available": False,
        "why": "vllm:num_preemptions_total served with no finite value of its kind",
    }


def test_control_sequences_and_html_from_a_metrics_line_stay_text(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    proc, out = _run(tmp_path, tiny_model_dir, f"vllm:kv_cache_usage_perc{{a={EVIL}}} 1\n")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    shown = proc.stdout + proc.stderr
    assert "\x1b" not in shown and "\x07" not in shown  # nothing of it drives the terminal
    assert (
        "server signals: not available (ValueError: Invalid labels: a=\\x1b]52;c;cHduZWQ=\\x07"
        in shown
    )
    report = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "report", str(out)],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert report.returncode == 0, report.stderr
    markdown = (out / "report.md").read_text()
    section = markdown[markdown.index("## Server signals") :]
    assert "Invalid labels: a=\\\\x1b\\]52;c;cHduZWQ=\\\\x07" in section
    body = MarkdownIt("commonmark").enable("table").render(markdown)
    assert "<img/src" not in body and "onerror" not in body.replace("&lt;img/src=x/onerror", "")
    assert "&lt;img/src=x/onerror=alert(1)&gt;" in body


def test_a_crashed_servers_api_key_stays_out_of_report_html_and_the_quirks_table(
    tmp_path: Path, tiny_model_dir: Path, local_quirks: Path
) -> None:
    """Issue 46.11: a configuration with ``api-key = KEY`` whose server prints its
    arguments and crashes. On the code before, report.html showed KEY in the log tail (the
    bundle replaces it) and the local quirks table stored it verbatim."""
    key = "PlantedOpaqueApiKey0123456789"
    text = stub_plan(tiny_model_dir, f'[[configs]]\nname = "k"\nargs = {{ api-key = "{key}" }}\n',
                     "[2]", WORKLOAD)  # fmt: skip
    engine = tmp_path / "crashing-engine"
    engine.write_text('#!/bin/sh\n[ "$1" = --help ] && echo "usage: [--api-key KEY] [--model M]'
                      ' [--host H] [--port P]" && exit 0\necho "serving with $*"\nexit 3\n')  # fmt: skip
    engine.chmod(0o755)
    text = text.replace(f'"{sys.executable}", "{STREAM_SERVER}", ', f'"{engine}", ', 1)
    plan = write(tmp_path, text, "plan.toml")
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", str(plan), "--out", str(out)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert (out / "results.jsonl").is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    (record,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert record["status"] == "crashed", record
    assert any(key in line for line in record["server_log_tail"])  # the server printed it
    report = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "report", str(out)],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert report.returncode == 0, report.stderr
    page = (out / "report.html").read_text()
    assert key not in page and "--api-key &lt;secret-1&gt;" in page
    table = local_quirks.read_text()
    assert key not in table and '"api-key" = "<redacted>"' in table
