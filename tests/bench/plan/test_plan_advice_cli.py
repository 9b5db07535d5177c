"""A concurrency above the prompts a cell sends is said (issue 34.8): `concurrency =
[65536]` with `num_prompts = 8` was accepted without a word. The real CLI, a dry run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.bench.campaign_support import stub_plan, write


def _dry(plan: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", str(plan), "--dry-run",
                           "--no-validate"], capture_output=True, text=True, timeout=120)  # fmt: skip


def test_concurrency_above_num_prompts_is_warned(tmp_path: Path, tiny_model_dir: Path) -> None:
    workload = "input_len = 32\noutput_len = 8\nnum_prompts = 8\nwarmup = 0"
    plan = write(tmp_path, stub_plan(tiny_model_dir, concurrency="[4, 65536]", workload=workload))
    done = _dry(plan)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, done.stderr  # one per configuration (a and b)
    assert "concurrency 65536 is more than the 8 prompts a cell sends" in warnings[0]
    assert "concurrency 4 " not in warnings[0]
    per = workload.replace("num_prompts = 8", "num_prompts = 8\nprompts_per_concurrency = 2")
    quiet = _dry(
        write(tmp_path, stub_plan(tiny_model_dir, concurrency="[65536]", workload=per), "b.toml")
    )
    assert quiet.returncode == 0 and "warning: " not in quiet.stderr, quiet.stderr
