"""Write the /metrics texts the loopback tests serve: each engine's own metric
definitions (names, help texts, types, label names copied from its source, file and
commit below) registered with ``prometheus_client`` (what both engines use to serve
/metrics) and exposed with its ``generate_latest``: byte for byte what the engine serves
for these values. Two snapshots per engine (the cell's start and end) so counter deltas
are exercised. Run: ``python -m tests.bench.data.metrics.record_metrics``.

- vLLM: vllm/v1/metrics/loggers.py @ 005a810bc40f (PrometheusStatLogger.__init__),
  vllm/v1/spec_decode/metrics.py @ 016a8587edb0 (SpecDecodingProm); labels
  ``model_name``, ``engine`` (+ ``position``).
- SGLang 0.5.23: python/sglang/srt/observability/metrics_collector.py
  (SchedulerMetricsCollector.__init__; checked against the installed package by
  tests/bench/data/test_recorded_engines.py); labels as its scheduler passes them
  (``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``).
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

HERE = Path(__file__).parent
VLLM_LABELS = ["model_name", "engine"]
SGL_LABELS = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]


def vllm(step: int) -> bytes:
    """vLLM with an EAGLE drafter of 3 tokens, one engine; ``step`` 0 = start, 1 = end."""
    reg = CollectorRegistry()
    lv = ["Qwen/Qwen3-8B", "0"]

    def gauge(name: str, doc: str, value: float) -> None:
        Gauge(name, doc, VLLM_LABELS, registry=reg).labels(*lv).set(value)

    def counter(name: str, doc: str, value: float) -> None:
        Counter(name, doc, VLLM_LABELS, registry=reg).labels(*lv).inc(value)

    gauge(
        "vllm:num_requests_running", "Number of requests in model execution batches.", [0, 7][step]
    )
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", [0, 3][step])
    gauge(
        "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", [0.0, 0.42][step]
    )
    counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        [1000, 9000][step],
    )
    counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        [100, 2100][step],
    )
    counter(
        "vllm:num_preemptions", "Cumulative number of preemption from the engine.", [2, 5][step]
    )
    counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [1000, 9000][step])
    counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", [10, 410][step])
    counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", [30, 1230][step])
    counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", [20, 820][step])
    per_pos = Counter(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Accepted tokens per draft position.",
        [*VLLM_LABELS, "position"],
        registry=reg,
    )
    for pos, (a, b) in enumerate([(9, 369), (7, 287), (4, 164)]):
        per_pos.labels(*lv, str(pos)).inc([a, b][step])
    return generate_latest(reg)


def sglang(step: int) -> bytes:
    """SGLang with EAGLE speculative decoding, TP 1; ``step`` 0 = start, 1 = end."""
    reg = CollectorRegistry()
    lv = ["Qwen/Qwen3-8B", "unified", "0", "0", "0"]

    def gauge(name: str, doc: str, value: float) -> None:
        Gauge(name, doc, SGL_LABELS, registry=reg).labels(*lv).set(value)

    gauge("sglang:num_running_reqs", "The number of running requests.", [0, 12][step])
    gauge("sglang:num_used_tokens", "The number of used tokens.", [0, 20000][step])
    gauge("sglang:token_usage", "The token usage.", [0.0, 0.61][step])
    gauge("sglang:gen_throughput", "The generation throughput (token/s).", [0.0, 950.5][step])
    gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", [0, 4][step])
    gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", [0.0, 0.37][step])
    gauge(
        "sglang:spec_accept_length",
        "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
        [0.0, 3.1][step],
    )
    gauge(
        "sglang:spec_accept_rate",
        "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
        [0.0, 0.7][step],
    )
    Counter(
        "sglang:num_retracted_requests_total",
        "Total number of retracted requests.",
        SGL_LABELS,
        registry=reg,
    ).labels(*lv).inc([1, 4][step])
    return generate_latest(reg)


def main() -> None:
    for engine, make in (("vllm", vllm), ("sglang", sglang)):
        for step, label in enumerate(("start", "end")):
            (HERE / f"{engine}-{label}.prom").write_bytes(make(step))


if __name__ == "__main__":
    main()
