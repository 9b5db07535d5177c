"""`bench compare A B` prints the ratio B / A and, beside it, the bootstrap interval of
that same ratio: when B is clearly slower, the interval lies around the printed ratio
(below 1 for throughput), not around its inverse.

Two real runs of one plan by the real campaign loop; the server (tests/bench/stream_server.py
behind a wrapper) generates each token 1 ms apart in A and 8 ms apart in B. `gpudoctor
bench compare --json` runs as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.plan import load_plan
from tests.bench.campaign_support import (
    STREAM_SERVER,
    local_quirks,
    stub_plan,
    wait_no_leftovers,
    write,
)

__all__ = ["local_quirks"]


def test_the_interval_printed_is_that_of_b_over_a(tmp_path: Path, tiny_model_dir: Path) -> None:
    delay = tmp_path / "token-delay-ms"
    wrapper = tmp_path / "server.sh"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STREAM_SERVER}" "$@" '
                       f'--token-delay-ms "$(cat {delay})"\n')  # fmt: skip
    wrapper.chmod(0o755)
    workload = "input_len = 16\noutput_len = 16\nnum_prompts = 12\nwarmup = 0"
    text = stub_plan(tiny_model_dir, '[[configs]]\nname = "a"\n', "[2]", workload)
    text = text.replace(f'"{sys.executable}", "{STREAM_SERVER}"', f'"{wrapper}"')
    plan = load_plan(write(tmp_path, text))
    runs = {}
    for name, ms in (("fast", "1"), ("slow", "8")):
        delay.write_text(ms)
        runs[name] = tmp_path / name
        assert run_campaign(plan, LaunchOptions(out=runs[name])).ok == 1
        assert wait_no_leftovers(runs[name]) == []
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "compare",
                           str(runs["fast"]), str(runs["slow"]), "--json"],
                          capture_output=True, text=True, timeout=120, env=os.environ.copy())  # fmt: skip
    assert done.returncode == 0, done.stderr
    (cell,) = json.loads(done.stdout)["cells"]
    ratio = cell["ratios"]["output_throughput"]
    low, high = cell["intervals"]["output_throughput"]
    assert ratio < 0.5, ratio  # B generates 8x slower: clearly lower throughput
    assert low <= ratio <= high, (ratio, low, high)
    assert high < 1.0 and cell["within_noise"]["output_throughput"] is False
