"""`bench status`'s ETA is GPU time: a TP4 cell holds 4 GPUs, so on a 4-GPU pool the
pending TP4 cells run one after another and the ETA is at least their count times the
measured cell time (not a quarter of it, as counting cells over GPUs would say).

A real packed campaign with 4 stand-in GPUs (tests/bench/stream_server.py as servers);
three of its records then dropped the way ``--retry-crashed`` drops them, so three cells
are pending again; `gpudoctor bench status --json` run as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.run_dir import RunDir, read_records
from tests.bench.campaign_support import wait_no_leftovers, write
from tests.bench.launch.test_packing import packed_plan, standin_gpus

__all__ = ["standin_gpus"]


def test_pending_tp4_cells_on_a_4_gpu_pool_count_their_gpu_time(
    tmp_path: Path, tiny_model_dir: Path, standin_gpus: Path
) -> None:
    text = packed_plan(tiny_model_dir, '[[configs]]\nname = "wide"\ntp = [4]\n')
    text = text.replace("concurrency = [1, 2]", "concurrency = [1, 2, 3, 4]")
    plan = load_plan(write(tmp_path, text))
    run = tmp_path / "run"
    assert run_campaign(plan, LaunchOptions(out=run)).ok == 4
    assert wait_no_leftovers(run) == []
    records = read_records(run / "results.jsonl")[0]
    pending = {r["key"] for r in records if r["concurrency"] != 1}
    with RunDir(run) as rd:
        assert rd.drop_records(pending) == 3
    (kept,) = read_records(run / "results.jsonl")[0]
    cell_s = kept["timings"]["cell_s"]
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "status", str(run), "--json"],
                          capture_output=True, text=True, timeout=120, env=os.environ.copy())  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["progress"] == {"recorded": 1, "total": 4}
    serial = 3 * cell_s  # the pool runs one TP4 cell at a time
    assert doc["eta_s"] is not None and doc["eta_s"] >= 0.99 * serial, (doc["eta_s"], cell_s)
    assert doc["eta_s"] <= 2 * serial, (doc["eta_s"], cell_s)
