"""Launcher overhead of `gpudoctor bench` on the CPU matrix (real `transformers serve`).

Runs a 2-config x 3-concurrency campaign with the tiny Llama model and reports:

- per cell: the launcher's own time inside a configuration's sweep, i.e.
  (config wall - server start wait - server stop - sum of measure_cell time) / cells,
  as a ratio of the mean cell (goal: < 2 %);
- per campaign: the fixed cost outside the configurations (flag validation with the
  engine's --help, preflight, run directory, guardian, reaping) in seconds;
- per config: the launcher's server-start wait vs the server's own start time as seen
  in its log ("Application startup complete"), as a ratio;
- server starts per configuration (goal: exactly one).

    .venv/bin/python benchmarks/bench_overhead.py [--json] [--keep DIR] [--prompts N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpudoctor.bench.engines import engine_for
from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.plan import parse_plan
from gpudoctor.bench.results.run_dir import read_records


def _plan(model_dir: Path, prompts: int) -> str:
    return textwrap.dedent(
        f"""\
        name = "overhead"
        [model]
        path = "{model_dir}"
        [engine]
        name = "transformers"
        args = {{ device = "cpu", log-level = "info" }}
        [axes]
        concurrency = [1, 2, 4]
        [[configs]]
        name = "default"
        [[configs]]
        name = "cb"
        args = {{ continuous-batching = true, cb-num-blocks = 256, cb-max-batch-tokens = 1024 }}
        [workload]
        input_len = 128
        output_len = 16
        num_prompts = {prompts}
        warmup = 1
        ignore_eos = false
        [preflight]
        only = ["proc", "shm", "model"]
        """
    )


def measure(work: Path, prompts: int) -> dict:
    """Run the campaign in ``work`` and return the overhead numbers (seconds and ratios)."""
    from tests.support.tiny_llm import make_tiny_model

    model = make_tiny_model(work / "tiny-llm")
    plan = parse_plan(_plan(model, prompts), str(work / "plan.toml"))
    out = work / "run"
    t_help = time.monotonic()  # the engine's --help, run once and cached (as the CLI does)
    engine_for(plan.engine).help_text(work / "help-cache")
    help_s = time.monotonic() - t_help
    t0 = time.monotonic()
    options = LaunchOptions(
        out=out, quirks_path=work / "quirks.toml", help_cache=work / "help-cache"
    )
    summary = run_campaign(plan, options)
    total = time.monotonic() - t0
    records, _ = read_records(out / "results.jsonl")
    servers = [json.loads(line) for line in (out / "servers.jsonl").read_text().splitlines()]
    per_config = []
    for s in servers:
        cells = [r for r in records if r["config_key"] == s["config_key"]]
        measured = sum(r["timings"]["measure_s"] for r in cells)
        in_loop = s["config_wall_s"] - s["startup_s"] - s["stop_s"] - measured
        per_config.append({
            "label": s["label"], "cells": len(cells), "config_wall_s": s["config_wall_s"],
            "startup_wait_s": s["startup_s"], "server_log_ready_s": s["log_ready_s"],
            "start_wait_over_server_start": s["startup_s"] / s["log_ready_s"] if s["log_ready_s"] else None,
            "stop_s": s["stop_s"], "measure_s": measured, "launcher_in_loop_s": in_loop,
            "launcher_per_cell_s": in_loop / len(cells), "mean_cell_s": measured / len(cells),
        })  # fmt: skip
    loop_overhead = sum(c["launcher_in_loop_s"] for c in per_config)
    n_cells = sum(c["cells"] for c in per_config)
    mean_cell = statistics.mean(r["timings"]["measure_s"] for r in records)
    fixed = total - sum(c["config_wall_s"] for c in per_config)
    starts = Counter(s["label"] for s in servers)
    return {
        "cells": n_cells, "ok": summary.ok, "campaign_wall_s": total,
        "launcher_per_cell_s": loop_overhead / n_cells, "mean_cell_s": mean_cell,
        "launcher_per_cell_ratio": loop_overhead / n_cells / mean_cell,
        "campaign_fixed_overhead_s": fixed,
        "engine_help_uncached_s": help_s,
        "campaign_overhead_ratio": (fixed + loop_overhead) / total,
        "server_starts_per_config": dict(starts),
        "exactly_one_start_per_config": set(starts.values()) == {1} and len(starts) == len(plan.configs),
        "configs": per_config,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument("--keep", type=Path, help="run in DIR and keep it (default: a temp dir)")
    parser.add_argument("--prompts", type=int, default=8, help="requests per cell (default 8)")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        result = measure(args.keep, args.prompts)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
            result = measure(Path(tmp), args.prompts)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"cells: {result['cells']} ({result['ok']} ok), campaign wall {result['campaign_wall_s']:.1f} s"
    )
    print(f"launcher per cell: {result['launcher_per_cell_s'] * 1000:.1f} ms of a {result['mean_cell_s']:.2f} s "
          f"mean cell = {result['launcher_per_cell_ratio'] * 100:.2f} % (goal < 2 %)")  # fmt: skip
    print(
        f"engine --help for flag validation (first run only, then cached): {result['engine_help_uncached_s']:.2f} s"
    )
    print(f"fixed campaign overhead (version, preflight, setup): {result['campaign_fixed_overhead_s']:.2f} s; "
          f"all launcher time = {result['campaign_overhead_ratio'] * 100:.2f} % of the campaign")  # fmt: skip
    for c in result["configs"]:
        ratio = c["start_wait_over_server_start"]
        print(f"  {c['label']}: start wait {c['startup_wait_s']:.2f} s vs server's own {c['server_log_ready_s']} s "
              f"(ratio {ratio:.3f}), stop {c['stop_s']:.2f} s, launcher {c['launcher_per_cell_s'] * 1000:.1f} ms/cell")  # fmt: skip
    print(
        f"server starts per config: {result['server_starts_per_config']} "
        f"(exactly one each: {result['exactly_one_start_per_config']})"
    )


if __name__ == "__main__":
    main()
