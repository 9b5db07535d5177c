"""End to end against the real `transformers serve` (CPU) with the tiny Llama model.

Server starts cost ~10 s each here, so the tests share as few as they can: one
campaign covers the 2-config x 3-concurrency matrix AND the context clamping.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.launch.dry_run import dry_run
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import wait_no_leftovers, write
from tests.bench.launch.test_kill_resume import kill_and_resume

MAX_POS = 2048  # the tiny model's max_position_embeddings


def transformers_plan(model_dir: Path, configs: str, concurrency: str, workload: str) -> str:
    """Return a plan for `transformers serve` on the CPU with ``configs`` and ``workload``."""
    return (
        textwrap.dedent(
            f"""\
        name = "tiny"
        [model]
        path = "{model_dir}"
        [engine]
        name = "transformers"
        args = {{ device = "cpu", log-level = "info" }}
        startup_timeout_s = 180
        stop_timeout_s = 10
        [axes]
        concurrency = {concurrency}
        [preflight]
        only = ["proc", "shm", "model"]
        [workload]
        """
        )
        + textwrap.dedent(workload)
        + "\n"
        + textwrap.dedent(configs)
    )


def test_matrix_end_to_end_with_an_overflowing_input_clamped(
    tmp_path: Path, tiny_model_dir: Path, help_cache: Path
) -> None:
    configs = """\
        [[configs]]
        name = "default"
        [[configs]]
        name = "cb"
        args = { continuous-batching = true, cb-num-blocks = 64, cb-max-batch-tokens = 2048 }
        """
    workload = """\
        input_len = 2100          # > max_position_embeddings: must be clamped
        output_len = 4
        num_prompts = 3
        warmup = 0
        ignore_eos = false
        """
    plan = load_plan(
        write(tmp_path, transformers_plan(tiny_model_dir, configs, "[1, 2, 3]", workload))
    )
    out = tmp_path / "run"
    summary = run_campaign(plan, LaunchOptions(out=out, help_cache=help_cache))
    assert (summary.ok, summary.crashed, summary.skipped, summary.server_starts) == (6, 0, 0, 2)
    records, _ = read_records(out / "results.jsonl")
    assert sorted(r["key"] for r in records) == sorted(c.key for c in plan.cells())
    budget = MAX_POS - 4 - 32
    for r in records:
        m = r["measurement"]
        assert r["status"] == "ok" and m["completed"] == 3 and sum(m["errors"].values()) == 0, (
            r["reason"] if "reason" in r else m["errors"]
        )
        assert (
            r["clamp"]["clamped"]
            and r["clamp"]["input_len"] == budget
            and r["clamp"]["max_context"] == MAX_POS
        )
        for line in (out / r["raw"]).read_text().splitlines():
            raw = json.loads(line)
            assert (
                raw["ok"] and raw["usage_prompt_tokens"] + raw["usage_completion_tokens"] <= MAX_POS
            )
            assert raw["usage_prompt_tokens"] > 1500  # the clamp kept the prompt long
    servers = [json.loads(s) for s in (out / "servers.jsonl").read_text().splitlines()]
    assert [s["label"] for s in servers] == ["default@tp1", "cb@tp1"]  # one start per config
    for s in servers:
        log = (out / s["log"]).read_text()
        assert "Application startup complete" in log
        assert "longer than the specified maximum" not in log and "exceeded the model" not in log
    verdicts = [json.loads(v) for v in (out / "preflight.jsonl").read_text().splitlines()]
    assert [v["status"] for v in verdicts] == ["PASS", "PASS", "PASS"]
    assert wait_no_leftovers(out) == []


def test_config_that_cannot_start_is_crashed_quirked_and_skipped_next_time(
    tmp_path: Path, tiny_model_dir: Path, help_cache: Path
) -> None:
    configs = """\
        [[configs]]
        name = "fa2"                  # accepted by --help, fatal at start: flash-attn is not installed
        args = { attn-implementation = "flash_attention_2" }
        [[configs]]
        name = "default"
        """
    workload = "input_len = 16\noutput_len = 4\nnum_prompts = 2\nwarmup = 0\nignore_eos = false\n"
    plan_path = write(tmp_path, transformers_plan(tiny_model_dir, configs, "[1, 2]", workload))
    plan = load_plan(plan_path)
    out = tmp_path / "run"
    summary = run_campaign(plan, LaunchOptions(out=out, help_cache=help_cache))
    records, _ = read_records(out / "results.jsonl")
    assert [(r["config"], r["status"]) for r in records] == [("fa2", "crashed")] * 2 + [
        ("default", "ok")
    ] * 2
    assert "server failed to start: server exited with code 1" in records[0]["reason"]
    assert any("FlashAttention2" in line for line in records[0]["server_log_tail"])
    assert summary.server_starts == 2 and wait_no_leftovers(out) == []
    # next time (another run directory), the dry run and the run both skip it
    again = dry_run(plan, LaunchOptions(out=tmp_path / "next", help_cache=help_cache))
    assert [c["action"] for c in again["cells"]] == ["skip", "skip", "run", "run"]
    assert again["cells"][0]["reason"].startswith(f"quirk crash-{plan.configs[0].key}")
    only_fa2 = plan_path.read_text().split('[[configs]]\nname = "default"')[0]
    plan2 = load_plan(write(tmp_path, only_fa2, "fa2.toml"))
    summary2 = run_campaign(plan2, LaunchOptions(out=tmp_path / "next", help_cache=help_cache))
    assert (summary2.skipped, summary2.server_starts) == (2, 0)


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_transformers(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    configs = '[[configs]]\nname = "default"\n'
    workload = "input_len = 64\noutput_len = 8\nnum_prompts = 3\nwarmup = 0\nignore_eos = false\n"
    plan_path = write(tmp_path, transformers_plan(tiny_model_dir, configs, "[1, 2]", workload))
    result = kill_and_resume(plan_path, tmp_path, kills_wanted=3, seed=7)
    assert result["kills"] == 3 and len(result["cells_at_kill"]) == 3
