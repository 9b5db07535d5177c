"""Server signals and the request timeline through a real campaign: the command engine
(tests/bench/stream_server.py, a real HTTP server) with ``[engine] metrics_path``
serving vLLM's recorded /metrics texts; the cell's record, RUN/trace/<cell>.json, the
closing table, report.md, report.html and ``bench compare`` all carry them."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.report import write_report
from gpudoctor.bench.results.summary_table import results_table
from gpudoctor.commands.bench import bench
from tests.bench.campaign_support import help_cache, local_quirks, stub_plan, write
from tests.bench.metrics_server import DATA

__all__ = ["help_cache", "local_quirks"]

# 6 tokens 100 ms apart, 12 requests at concurrency 4: ~1.8 s of load, so the scraper's first
# scrapes (0.1, 0.3, 0.7 s) see the server under load (a gauge is stated only from those)
CONFIGS = '[[configs]]\nname = "fast"\nargs = { token-delay-ms = 100 }\n'
WORKLOAD = "input_len = 32\noutput_len = 6\nnum_prompts = 12\nwarmup = 0"


def plan_text(model_dir: Path, metrics: bool) -> str:
    text = stub_plan(model_dir, CONFIGS, "[4]", WORKLOAD)
    if not metrics:
        return text
    files = f'"--metrics-file", "{DATA / "vllm-start.prom"}", "--metrics-file", "{DATA / "vllm-end.prom"}"'
    text = text.replace('"{port}"]', f'"{{port}}", {files}]')
    return text.replace('version = "stub-1"', 'version = "stub-1"\nmetrics_path = "/metrics"')


def run(tmp_path: Path, model_dir: Path, metrics: bool, name: str) -> Path:
    out = tmp_path / name
    plan = load_plan(write(tmp_path, plan_text(model_dir, metrics), f"{name}.toml"))
    run_campaign(plan, LaunchOptions(out=out))
    return out


def cell_record(out: Path) -> dict:
    (line,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()
               if '"status": "ok"' in x]  # fmt: skip
    return line


def test_signals_and_timeline_flow_through_the_campaign(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    out = run(tmp_path, tiny_model_dir, metrics=True, name="with")
    signals = cell_record(out)["measurement"]["server_signals"]
    assert signals["dialect"] == "vllm" and signals["failed"] == 0 and signals["scrapes"] >= 2
    s = signals["signals"]
    assert s["kv_cache_usage"]["max"] == 0.42
    assert s["preemptions"]["value"] == 3
    assert s["spec_accept_length"]["value"] == 3.0
    trace = json.loads((out / "trace" / "fast_tp1-c4.json").read_text())
    slices = [e for e in trace["traceEvents"] if e.get("cat") == "request"]
    assert len(slices) == 12 and trace["metadata"]["requests"] == 12
    assert {e["args"]["request_id"] for e in slices} == {f"cmpl-stub-{i}" for i in range(1, 13)}
    assert any(e["ph"] == "C" and e["name"] == "kv_cache_usage" for e in trace["traceEvents"])
    table = results_table(out)
    assert "KV max" in table.splitlines()[1] and "42%" in table
    files = write_report(out)
    md = files.markdown.read_text()
    assert "## Server signals" in md and "| 42% |" in md and "0.90 0.70 0.40" in md
    page = files.html.read_text()
    assert "Server: KV max" in page and '<svg class="timeline"' in page
    done = CliRunner().invoke(bench, ["compare", str(out), str(out)])
    assert done.exit_code == 0, done.output
    assert "server signals fast (TP1) c=4:" in done.output and "KV max: 42% -> 42%" in done.output


def test_without_metrics_path_every_signal_says_why(tmp_path: Path, tiny_model_dir: Path) -> None:
    out = run(tmp_path, tiny_model_dir, metrics=False, name="without")
    s = cell_record(out)["measurement"]["server_signals"]["signals"]
    why = 'the plan sets no [engine] metrics_path (e.g. "/metrics")'
    assert all(v == {"available": False, "why": why} for v in s.values())
    table = results_table(out)
    assert "KV max" not in table and "server signals" not in table  # none asked for: no noise
    assert (out / "trace" / "fast_tp1-c4.json").is_file()  # the timeline needs no /metrics


def test_a_server_without_metrics_is_named_under_the_table(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """``metrics_path`` set, the server answers 404 (as transformers serve does): every
    signal says so, and one line under the closing table names the server's answer."""
    text = stub_plan(tiny_model_dir, CONFIGS, "[4]", WORKLOAD).replace(
        'version = "stub-1"', 'version = "stub-1"\nmetrics_path = "/metrics"'
    )
    out = tmp_path / "404"
    run_campaign(load_plan(write(tmp_path, text, "404.toml")), LaunchOptions(out=out))
    s = cell_record(out)["measurement"]["server_signals"]
    assert s["scrapes"] >= 2 and s["failed"] == s["scrapes"]
    assert all("HTTP 404" in v["why"] for v in s["signals"].values())
    assert "server signals: not available (RuntimeError: GET http://127.0.0.1:" in results_table(
        out
    )
