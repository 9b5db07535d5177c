"""What scraping the engine's /metrics costs the client (the load generator's process).

One run, side by side: the same cell twice against a real loopback server
(tests/bench/stream_server.py) that serves a vLLM-sized /metrics (the recorded vLLM
gauges and counters of tests/bench/data/metrics plus vLLM's request histograms, names
and buckets from vllm/v1/metrics/loggers.py @ 005a810bc40f): once without the scraper,
once with it at the campaign's interval (loadgen.SCRAPE_INTERVAL_S). Reports:

- CPU per scrape (GET + prometheus_client parse + reduce), ms: the scraper thread's
  ``thread_time``;
- CPU per cell: the scraper's, the load generator's (the client's process CPU minus the
  scraper's), and their ratio (goal: < 1 %);
- the client's process CPU with vs without the scraper (the same cell), as a ratio.

    .venv/bin/python benchmarks/scrape_overhead.py [--json] [--prompts N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gpudoctor.bench.cell_spec import CellTarget, WorkloadSpec
from gpudoctor.bench.load.loadgen import SCRAPE_INTERVAL_S, measure_cell
from tests.bench.metrics_server import DATA

LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
HISTOGRAMS = {  # vLLM's request histograms (loggers.py @ 005a810bc40f): name -> buckets
    "vllm:time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                         0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
                                         160.0, 640.0, 2560.0],
    "vllm:time_per_output_token_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                                           0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
    "vllm:e2e_request_latency_seconds": LATENCY,
    "vllm:request_queue_time_seconds": LATENCY,
    "vllm:request_inference_time_seconds": LATENCY,
    "vllm:request_prefill_time_seconds": LATENCY,
    "vllm:request_decode_time_seconds": LATENCY,
    "vllm:request_prompt_tokens": [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000],
    "vllm:request_generation_tokens": [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000],
    "vllm:iteration_tokens_total": [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
    "vllm:request_params_n": [1, 2, 5, 10, 20],
}  # fmt: skip


def full_exposition(step: str) -> bytes:
    """Return a vLLM-sized /metrics text: the recorded ``step`` file plus the histograms."""
    reg = CollectorRegistry()
    for name, buckets in HISTOGRAMS.items():
        h = Histogram(name, f"Histogram of {name}.", ["model_name", "engine"], buckets=buckets,
                      registry=reg).labels("Qwen/Qwen3-8B", "0")  # fmt: skip
        for i in range(50):
            h.observe(buckets[i % len(buckets)] * 0.9)
    return (DATA / f"vllm-{step}.prom").read_bytes() + generate_latest(reg)


def one_cell(base: str, model: Path, prompts: int, concurrency: int, metrics: bool) -> dict:
    target = CellTarget(base_url=base, served_model=str(model), tokenizer_dir=str(model),
                        metrics_url=f"{base}/metrics" if metrics else None)  # fmt: skip
    workload = WorkloadSpec(input_len=64, output_len=64, num_prompts=prompts, warmup=0)
    return measure_cell(target, workload, concurrency, telemetry=False)


def measure(work: Path, prompts: int, concurrency: int) -> dict:
    """Run both cells in ``work``; return the figures (seconds, ms, ratios)."""
    from tests.support.tiny_llm import make_tiny_model

    model = make_tiny_model(work / "tiny-llm")
    files = []
    for step in ("start", "end"):
        path = work / f"full-{step}.prom"
        path.write_bytes(full_exposition(step))
        files += ["--metrics-file", str(path)]
    port = 18000 + (int(time.time()) % 1000)
    log = work / "server.log"
    with open(log, "w") as out:  # a file, not a pipe: a pipe nobody reads fills and blocks it
        server = subprocess.Popen([sys.executable, "tests/bench/stream_server.py", "--model",
                                   str(model), "--port", str(port), "--token-delay-ms", "2", *files],
                                  stdout=out, stderr=subprocess.STDOUT,
                                  cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    try:
        while "running on" not in log.read_text():
            if server.poll() is not None:
                raise SystemExit(f"stream_server exited: {log.read_text()[-500:]}")
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        without = one_cell(base, model, prompts, concurrency, metrics=False)
        with_ = one_cell(base, model, prompts, concurrency, metrics=True)
    finally:
        server.terminate()
        server.wait(10)
    sig = with_["server_signals"]
    scraper_cpu = sig["cpu_s"]
    loadgen_cpu = with_["client"]["cpu_s"] - scraper_cpu
    return {
        "metrics_bytes": len(full_exposition("end")),
        "interval_s": SCRAPE_INTERVAL_S,
        "cell_s": round(with_["duration_s"], 3),
        "scrapes": sig["scrapes"],
        "scrape_failures": sig["failed"],
        "cpu_per_scrape_ms": round(scraper_cpu / max(sig["scrapes"], 1) * 1e3, 3),
        "scraper_cpu_per_cell_s": round(scraper_cpu, 4),
        "loadgen_cpu_per_cell_s": round(loadgen_cpu, 4),
        "scraper_over_loadgen": round(scraper_cpu / loadgen_cpu, 5),
        "client_cpu_without_s": round(without["client"]["cpu_s"], 4),
        "client_cpu_with_s": round(with_["client"]["cpu_s"], 4),
        "client_cpu_with_over_without": round(with_["client"]["cpu_s"] / without["client"]["cpu_s"], 4),
        "signals_read": sorted(k for k, v in sig["signals"].items() if v["available"]),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(Path(tmp), args.prompts, args.concurrency)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:32} {value}")
        verdict = "under" if result["scraper_over_loadgen"] < 0.01 else "OVER"
        print(f"scraper CPU is {result['scraper_over_loadgen']:.3%} of the load generator's "
              f"({verdict} the 1 % goal)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
