"""Do gpudoctor's numbers agree with SGLang's own bench_serving on the same server and load?

Starts a real ``transformers serve`` with the tiny test model, builds one workload with
gpudoctor (random prompts of exact length), and runs, alternating, R rounds of

  A. gpudoctor: ``measure_cell`` on those prompts (JSONL workload);
  B. SGLang:    ``bench_serving.py`` from the sglang wheel, unmodified, on the same
                prompts (as a local ShareGPT file, ``--sharegpt-output-len``), backend
                ``vllm`` (= ``sglang-oai``'s request function), same concurrency.

It prints both side by side (mean over rounds, and each round), and a definitions check:
gpudoctor's raw request records fed to bench_serving's own ``calculate_metrics`` must give
gpudoctor's metrics to float precision. Goal: output throughput, mean TTFT and mean TPOT
within 3 % (the live runs are also subject to this 2-core machine's run-to-run noise).

Setup of the SGLang side (its imports: aiohttp, pybase64, requests, datasets):
  pip download sglang==0.5.5 --no-deps -d /tmp/sgl && unzip -q /tmp/sgl/sglang-*.whl \
      'sglang/bench_serving.py' -d /tmp/sgl/ex
  python -m venv build/sglang-bench-venv
  echo $PWD/.venv/lib/python3.11/site-packages > \
      build/sglang-bench-venv/lib/python3.11/site-packages/gpudoctor-venv.pth
  build/sglang-bench-venv/bin/pip install aiohttp pybase64 requests datasets
Run:
  .venv/bin/python benchmarks/metrics_agreement.py \
      --sglang-python build/sglang-bench-venv/bin/python \
      --bench-serving /tmp/sgl/ex/sglang/bench_serving.py --out build/agreement.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpudoctor.bench.cell_spec import CellTarget, WorkloadSpec
from gpudoctor.bench.load.loadgen import measure_cell
from gpudoctor.bench.load.workload import build_prompts, load_tokenizer
from tests.bench.llm_server import start_llm_server
from tests.support.tiny_llm import make_tiny_model

DRIVER = Path(__file__).with_name("sglang_bench_driver.py")
HEADLINE = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")
SHOWN = (*HEADLINE, "request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
         "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms", "concurrency")  # fmt: skip
# gpudoctor key for each bench_serving key where the names differ
OUR_NAME = {"mean_e2e_latency_ms": "mean_e2e_ms", "median_e2e_latency_ms": "median_e2e_ms",
            "p99_e2e_latency_ms": "p99_e2e_ms", "std_e2e_latency_ms": "std_e2e_ms",
            "total_output": "total_output_tokens", "total_input": "total_input_tokens"}  # fmt: skip


def run_sglang(args: argparse.Namespace, server, data: Path, out: Path) -> dict:  # type: ignore[no-untyped-def]
    """Run bench_serving once; return its result line (metrics + details)."""
    out.unlink(missing_ok=True)
    cmd = [
        args.sglang_python, str(DRIVER), "run", args.bench_serving, "--",
        "--backend", "vllm", "--base-url", server.base_url,
        "--model", str(server.model_dir), "--served-model-name", server.model,
        "--tokenizer", str(server.model_dir), "--dataset-name", "sharegpt",
        "--dataset-path", str(data), "--sharegpt-output-len", str(args.output_len),
        "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency),
        "--request-rate", "inf", "--warmup-requests", "1", "--disable-tqdm",
        "--output-file", str(out), "--output-details", "--seed", "0",
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"bench_serving failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                           f"\n{proc.stderr[-3000:]}")  # fmt: skip
    return json.loads(out.read_text().splitlines()[-1])


def sglang_metrics_on_raw(args: argparse.Namespace, raw: Path, duration: float, tok: str) -> dict:
    """Return bench_serving's calculate_metrics on gpudoctor's raw records."""
    proc = subprocess.run(
        [args.sglang_python, str(DRIVER), "metrics", args.bench_serving, str(raw),
         repr(duration), tok],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error"),
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"calculate_metrics failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ours(metrics: dict, key: str) -> float:
    return metrics[OUR_NAME.get(key, key)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang-python", required=True)
    parser.add_argument("--bench-serving", required=True, help="path to sglang/bench_serving.py")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--server-args", default="", help="extra `transformers serve` flags")
    parser.add_argument("--server-device", default="cpu", help="transformers serve --device")
    parser.add_argument("--out", type=Path, help="write every number here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (raw records)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gpudoctor-agreement-"))
    model_dir = make_tiny_model(work / "tiny-llm")
    tokenizer = load_tokenizer(str(model_dir))
    spec = WorkloadSpec(input_len=args.input_len, output_len=args.output_len,
                        num_prompts=args.num_prompts, seed=0)  # fmt: skip
    prompts = build_prompts(spec, tokenizer)
    sharegpt, jsonl = work / "sharegpt.json", work / "prompts.jsonl"
    sharegpt.write_text(json.dumps([{"conversations": [{"from": "human", "value": p.text},
                                                       {"from": "gpt", "value": "ok ok"}]}
                                    for p in prompts]))  # fmt: skip
    jsonl.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in prompts))
    ours_spec = WorkloadSpec(kind="jsonl", dataset_path=str(jsonl), output_len=args.output_len,
                             num_prompts=args.num_prompts, ignore_eos=False, warmup=1)  # fmt: skip
    server = start_llm_server(
        model_dir, work / "serve.log", tuple(args.server_args.split()), device=args.server_device
    )
    rounds = []
    try:
        for r in range(args.rounds):
            order = ("gpudoctor", "sglang") if r % 2 == 0 else ("sglang", "gpudoctor")
            result: dict = {"order": order}
            for who in order:
                if who == "gpudoctor":
                    raw = work / f"raw{r}.jsonl"
                    target = CellTarget(server.base_url, server.model, str(model_dir),
                                        raw_path=raw)  # fmt: skip
                    # keep_text: bench_serving's calculate_metrics re-reads the text
                    cell = measure_cell(target, ours_spec, args.concurrency, keep_text=True)
                    assert cell["completed"] == args.num_prompts, cell["errors"]
                    result["gpudoctor"] = cell["metrics"]
                    result["definitions"] = sglang_metrics_on_raw(
                        args, raw, cell["duration_s"], str(model_dir)
                    )
                else:
                    sg = run_sglang(args, server, sharegpt, work / f"sglang{r}.jsonl")
                    assert sg["completed"] == args.num_prompts, sg.get("errors")
                    result["sglang"] = {k: v for k, v in sg.items() if not isinstance(v, list)}
            rounds.append(result)
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{k}: gpudoctor {ours(result['gpudoctor'], k):.2f} / sglang "
                f"{result['sglang'][k]:.2f}" for k in HEADLINE), flush=True)  # fmt: skip
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\nworkload: {args.num_prompts} prompts x {args.input_len} in / {args.output_len} out "
          f"tokens, concurrency {args.concurrency}, {args.rounds} rounds alternating\n")  # fmt: skip
    print(f"{'metric':<22}{'gpudoctor':>12}{'sglang':>12}{'ratio':>8}")
    summary = {}
    for key in SHOWN:
        a = statistics.mean(ours(x["gpudoctor"], key) for x in rounds)
        b = statistics.mean(x["sglang"][key] for x in rounds)
        summary[key] = {"gpudoctor": a, "sglang": b, "ratio": a / b if b else None}
        print(f"{key:<22}{a:>12.2f}{b:>12.2f}{a / b if b else float('nan'):>8.3f}")
    worst = 0.0
    for x in rounds:
        for key, value in x["definitions"].items():
            mine = x["gpudoctor"].get(OUR_NAME.get(key, key))
            if isinstance(mine, (int, float)) and key not in ("total_output_retokenized",):
                worst = max(worst, abs(mine - value) / max(abs(value), 1e-12))
    print(f"\ndefinitions check (bench_serving's calculate_metrics on gpudoctor's raw records): "
          f"largest relative difference {worst:.2e} over every shared metric and round")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"rounds": rounds, "summary": summary,
                                        "definitions_max_rel_diff": worst,
                                        "args": {k: str(v) for k, v in vars(args).items()}},
                                       indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
