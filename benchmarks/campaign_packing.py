"""Packing a campaign onto the GPUs of a host: the same matrix run one server at a time and
packed onto 8 stand-in GPUs, side by side in one run.

The matrix: 6 configurations x 4 concurrencies (4 configurations at TP1, 2 at TP2: ten
GPU-jobs' worth of 8 GPUs) of tests/bench/stream_server.py --hold-gpus, a real HTTP
server that holds its stand-in GPUs (an exclusive flock per GPU UUID) and takes a known
time per token, so every cell holds its "GPU" for a known time. Printed:

- serial wall / packed wall (what packing saves);
- packed wall / ideal, the ideal being the packed run's own GPU-seconds (each server's
  wall time x its tp) / GPUs, or the longest server when that is longer (goal: <= 1.15);
- the launcher's CPU per running server: the launcher process's CPU seconds (its
  load-generator client included) / the sum of the servers' wall seconds, % of a core.

    .venv/bin/python benchmarks/campaign_packing.py [--json] [--gpus 8] [--delay-ms 10]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.plan import parse_plan
from gpudoctor.bench.results.run_dir import read_records

STREAM_SERVER = Path(__file__).resolve().parents[1] / "tests" / "bench" / "stream_server.py"


def _plan(model_dir: Path, delay_ms: float) -> str:
    """Return the matrix's plan (servers hold ``tp`` stand-in GPUs each)."""
    command = [sys.executable, str(STREAM_SERVER), "--model", "{model}", "--host", "{host}",
               "--port", "{port}", "--hold-gpus", "{tp}"]  # fmt: skip
    configs = "".join(
        f'[[configs]]\nname = "cfg{i}"\ntp = [{1 if i < 4 else 2}]\nargs = {{ max-model-len = {2048 + i} }}\n'
        for i in range(6)
    )
    return textwrap.dedent(f"""\
        name = "packing"
        [model]
        path = "{model_dir}"
        [engine]
        name = "command"
        command = [{", ".join(json.dumps(w) for w in command)}]
        version = "stand-in"
        startup_timeout_s = 60
        stop_timeout_s = 5
        args = {{ token-delay-ms = {delay_ms} }}
        [axes]
        concurrency = [1, 2, 4, 8]
        [preflight]
        enabled = false
        [workload]
        input_len = 16
        output_len = 32
        num_prompts = 8
        prompts_per_concurrency = 3
        warmup = 0
        """) + configs  # fmt: skip


def _run(plan_text: str, work: Path, name: str, env: dict[str, str]) -> dict:
    """Run one campaign; return its wall and CPU seconds and its servers' seconds."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        plan = parse_plan(plan_text, str(work / f"{name}.toml"))
        out = work / name
        cpu0, t0 = time.process_time(), time.monotonic()
        summary = run_campaign(plan, LaunchOptions(out=out))
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    servers = read_records(out / "servers.jsonl")[0]
    server_s = sum(float(s.get("config_wall_s") or 0) for s in servers)
    gpu_s = sum(float(s.get("config_wall_s") or 0) * len(s.get("gpus") or [1]) for s in servers)
    return {"wall_s": wall, "cpu_s": cpu, "ok": summary.ok, "servers": len(servers), "server_s": server_s,
            "gpu_s": gpu_s, "longest_s": max(float(s.get("config_wall_s") or 0) for s in servers)}  # fmt: skip


def main() -> None:
    """Run the serial and the packed campaign; print (or --json) the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--delay-ms", type=float, default=10.0, help="stand-in time per token")
    args = ap.parse_args()
    from tests.support.tiny_llm import make_tiny_model

    with tempfile.TemporaryDirectory(prefix="gd-packing-") as tmp:
        work = Path(tmp)
        os.environ["GPUDOCTOR_BENCH_QUIRKS"] = str(work / "quirks.toml")
        model = make_tiny_model(work / "tiny-llm")
        text = _plan(model, args.delay_ms)
        locks = work / "locks"
        locks.mkdir()
        uuids = ",".join(f"GPU-{i:08x}-0000-4000-8000-{i:012x}" for i in range(args.gpus))
        # serial: no GPU pool (what the launcher did before packing): one server at a time
        serial_text = text.replace(', "--hold-gpus", "{tp}"', "")
        serial = _run(serial_text, work, "serial", {"GPUDOCTOR_FAKE_GPUS": ""})
        packed = _run(
            text,
            work,
            "packed",
            {"GPUDOCTOR_FAKE_GPUS": uuids, "GPUDOCTOR_FAKE_GPU_LOCKS": str(locks)},
        )
    ideal = max(packed["gpu_s"] / args.gpus, packed["longest_s"])
    result = {
        "matrix": "6 configs (4 TP1, 2 TP2) x 4 concurrencies = 24 cells",
        "gpus": args.gpus,
        "serial_wall_s": round(serial["wall_s"], 2),
        "packed_wall_s": round(packed["wall_s"], 2),
        "serial_over_packed": round(serial["wall_s"] / packed["wall_s"], 2),
        "ideal_s": round(ideal, 2),
        "packed_over_ideal": round(packed["wall_s"] / ideal, 3),
        "goal_packed_over_ideal": 1.15,
        "launcher_cpu_pct_per_server": round(
            100 * packed["cpu_s"] / max(packed["server_s"], 1e-9), 1
        ),
        "cells_ok": [serial["ok"], packed["ok"]],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['matrix']} on {args.gpus} stand-in GPUs")
    print(f"  one server at a time (no pool):           {result['serial_wall_s']:.1f} s")
    print(f"  packed:                                    {result['packed_wall_s']:.1f} s  "
          f"(serial/packed x{result['serial_over_packed']:.2f})")  # fmt: skip
    print(f"  ideal (GPU-seconds / GPUs):                {result['ideal_s']:.1f} s  "
          f"(packed/ideal {result['packed_over_ideal']:.3f}, goal <= 1.15)")  # fmt: skip
    print(
        f"  launcher CPU per running server:           {result['launcher_cpu_pct_per_server']:.1f} % of a core"
    )


if __name__ == "__main__":
    main()
