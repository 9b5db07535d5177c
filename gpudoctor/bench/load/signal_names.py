"""The server-side signals a cell records, and the engines' Prometheus names for them.

Every name below is copied from the engine's own source (file and commit noted beside
it); the sample names are what ``prometheus_client`` exposes (a Counter ``x`` is
served as ``x_total``). A dialect is chosen from the names a server actually serves
(``vllm:`` or ``sglang:``), so the ``command`` engine with ``[engine] metrics_path``
is read the same way when it serves either engine's names.

Sources:
- vLLM ``vllm/v1/metrics/loggers.py`` @ 005a810bc40f (vLLM 0.10 line):
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (Gauges),
  ``vllm:kv_cache_usage_perc`` (Gauge, 1 = 100 %), ``vllm:num_preemptions``,
  ``vllm:prefix_cache_queries``, ``vllm:prefix_cache_hits`` (Counters, tokens);
  ``vllm/v1/spec_decode/metrics.py`` @ 016a8587edb0: ``vllm:spec_decode_num_drafts``,
  ``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens``,
  ``vllm:spec_decode_num_accepted_tokens_per_pos`` (Counters, label ``position``); the
  mean acceptance length is ``1 + accepted / drafts`` (SpecDecodingProm's docstring).
- SGLang ``python/sglang/srt/metrics/collector.py`` @ 00ae9c1590d2 (SGLang 0.5 line):
  ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage`` (KV
  pool usage, 0-1), ``sglang:cache_hit_rate``, ``sglang:spec_accept_length``,
  ``sglang:spec_accept_rate`` (Gauges), ``sglang:num_retracted_requests_total``
  (Counter: SGLang's preemption is a retraction). SGLang exports no acceptance
  histogram: that signal reads "not available" there. SGLang serves ``/metrics`` only
  with ``--enable-metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass

# signal -> what a reader sees (label, unit)
SIGNALS: dict[str, tuple[str, str]] = {
    "kv_cache_usage": ("KV-cache usage", "fraction 0-1"),
    "running": ("running requests", "requests"),
    "waiting": ("waiting requests (queue depth)", "requests"),
    "preemptions": ("preemptions during the cell", "count"),
    "prefix_cache_hit_rate": ("prefix-cache hit rate", "fraction 0-1"),
    "spec_accept_length": ("mean acceptance length", "tokens per step"),
    "spec_accept_histogram": ("acceptance per draft position", "fraction per position"),
}


@dataclass(frozen=True)
class Source:
    """How one signal is read from one dialect.

    Attributes:
        kind: ``gauge`` (mean/max of the samples), ``counter_delta`` (last - first),
            ``ratio_delta`` (delta of ``name`` / delta of ``denominator``), ``accept_len``
            (``1 + delta accepted / delta drafts``), ``per_position`` (delta per
            ``position`` label / delta drafts).
        name: the sample name served.
        denominator: the second sample name of a ratio.
    """

    kind: str
    name: str
    denominator: str = ""


DIALECTS: dict[str, dict[str, Source]] = {
    "vllm": {
        "kv_cache_usage": Source("gauge", "vllm:kv_cache_usage_perc"),
        "running": Source("gauge", "vllm:num_requests_running"),
        "waiting": Source("gauge", "vllm:num_requests_waiting"),
        "preemptions": Source("counter_delta", "vllm:num_preemptions_total"),
        "prefix_cache_hit_rate": Source(
            "ratio_delta", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
        ),
        "spec_accept_length": Source(
            "accept_len",
            "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:spec_decode_num_drafts_total",
        ),
        "spec_accept_histogram": Source(
            "per_position",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            "vllm:spec_decode_num_drafts_total",
        ),
    },
    "sglang": {
        "kv_cache_usage": Source("gauge", "sglang:token_usage"),
        "running": Source("gauge", "sglang:num_running_reqs"),
        "waiting": Source("gauge", "sglang:num_queue_reqs"),
        "preemptions": Source("counter_delta", "sglang:num_retracted_requests_total"),
        "prefix_cache_hit_rate": Source("gauge", "sglang:cache_hit_rate"),
        "spec_accept_length": Source("gauge", "sglang:spec_accept_length"),
    },
}


def dialect_of_text(text: str) -> str | None:
    """Return the dialect (``vllm``, ``sglang``) whose samples a /metrics text serves (a
    line starting ``vllm:`` / ``sglang:``), or None."""
    lines = "\n" + text
    for dialect in DIALECTS:
        if f"\n{dialect}:" in lines:
            return dialect
    return None


def wanted_names(dialect: str) -> frozenset[str]:
    """Return every sample name a dialect's signals read (what a scrape keeps)."""
    return frozenset(n for s in DIALECTS[dialect].values() for n in (s.name, s.denominator) if n)
