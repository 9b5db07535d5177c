"""The contract between the bench launcher and the load generator.

The launcher (plan, engines, servers, results) and the measuring half (workloads,
client, metrics, telemetry) meet here: "run this workload at this concurrency
against this OpenAI-compatible base URL, return the cell's record".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

INF = float("inf")
# Engine extensions of the OpenAI request a plan can make the client send (which engine
# accepts which: gpudoctor.bench.engines.request_fields).
EXTENSION_FIELDS = ("ignore_eos", "min_tokens")


@dataclass(frozen=True)
class WorkloadSpec:
    """What load one cell sends (the plan's ``[workload]`` table).

    Attributes:
        kind: ``random`` (random token prompts), ``jsonl`` (prompts from a file),
            ``sharegpt`` (a ShareGPT JSON/JSONL file), ``multi_turn``, ``shared_prefix``
            or ``trace`` (a Mooncake-format JSONL trace); see docs/bench-metrics.md.
        input_len: prompt length in tokens (random), before ``range_ratio``.
        output_len: ``max_tokens`` of every request.
        range_ratio: lengths drawn uniformly in ``[len * range_ratio, len]`` (1.0 = fixed).
        num_prompts: measured requests per cell (warmup excluded).
        prompts_per_concurrency: when set, a cell at concurrency N sends N x this many
            measured requests instead of ``num_prompts`` (the same number of waves in every
            cell: 64 requests at concurrency 64 without 64 one-at-a-time requests at 1).
        seed: seed for prompt sampling; the same seed gives the same prompts.
        dataset_path: the JSONL file for ``kind = "jsonl"``.
        ignore_eos: ask the server to ignore EOS (exact output lengths; biases
            speculative acceptance, see docs).
        api: ``completions`` (/v1/completions) or ``chat`` (/v1/chat/completions).
        warmup: warmup requests sent before measuring, excluded from metrics.
        request_rate: requests per second (open loop, seeded arrivals); None = closed
            loop; ``inf`` = every request at once (capped by the concurrency). The plan's
            ``[axes] request_rate`` sets it per cell.
        burstiness: the shape of the gamma-distributed inter-arrival times (SGLang's and
            vLLM's bench_serving ``--burstiness``): 1 (the default, None) = Poisson
            arrivals, below 1 burstier, above 1 more regular; the mean rate is unchanged.
        turns: ``multi_turn``: user turns per conversation (each carries the history).
        groups, prompts_per_group, system_prompt_len: ``shared_prefix``: groups of
            prompts sharing one system prompt of ``system_prompt_len`` tokens, each
            followed by its own ``input_len``-token question.
        trace_slowdown: ``trace``: multiply the trace's time gaps by this (2 = half speed).
        trace_block_size: ``trace``: tokens per ``hash_ids`` block (512, as Mooncake).
    """

    kind: str = "random"
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 1.0
    num_prompts: int = 64
    seed: int = 0
    dataset_path: str | None = None
    ignore_eos: bool = True
    api: str = "completions"
    warmup: int = 2
    request_rate: float | None = None
    prompts_per_concurrency: int | None = None
    burstiness: float | None = None
    turns: int | None = None
    groups: int | None = None
    prompts_per_group: int | None = None
    system_prompt_len: int | None = None
    trace_slowdown: float | None = None
    trace_block_size: int | None = None

    def for_concurrency(self, concurrency: int) -> WorkloadSpec:
        """Return the workload of one cell at ``concurrency``: ``num_prompts`` =
        ``prompts_per_concurrency`` x ``concurrency`` when that is set, else unchanged."""
        if self.prompts_per_concurrency is None:
            return self
        return replace(self, num_prompts=self.prompts_per_concurrency * concurrency)


@dataclass(frozen=True)
class SLO:
    """Service-level objectives for goodput, in milliseconds (None = not set)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None


@dataclass(frozen=True)
class CellTarget:
    """Where one cell's load goes.

    Attributes:
        base_url: the server's root URL (``http://127.0.0.1:30000``), no ``/v1``.
        served_model: the ``model`` field to send.
        tokenizer_dir: a local directory with the model's tokenizer (exact lengths).
        flush_cache_path: an endpoint to POST before the cell (SGLang ``/flush_cache``),
            or None when the engine has none.
        raw_path: where to write the per-request raw records (JSONL), or None.
        metrics_url: the server's Prometheus ``/metrics`` URL to scrape during the cell
            (the server signals), or None.
        metrics_note: why there is no ``metrics_url`` (shown as "not available (...)").
        trace_path: where to write the cell's request timeline (``RUN/trace/<cell>.json``,
            a Chrome/Perfetto trace), or None.
        label: the cell's name in its trace.
    """

    base_url: str
    served_model: str
    tokenizer_dir: str
    flush_cache_path: str | None = None
    raw_path: Path | None = None
    metrics_url: str | None = None
    metrics_note: str = ""
    trace_path: Path | None = None
    label: str = ""


def rate_to_json(rate: float | None) -> float | str | None:
    """Return a request rate as stored in JSON: a number, ``"inf"`` or None (closed loop)."""
    if rate is None:
        return None
    return "inf" if math.isinf(rate) else rate


def rate_from_json(value: object) -> float | None:
    """Return the request rate of a JSON value (a number, ``"inf"``; else None)."""
    if value == "inf":
        return INF
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def rate_label(rate: float | None) -> str:
    """Return a request rate for tables: ``2``, ``0.5``, ``inf`` (``-`` = closed loop)."""
    if rate is None:
        return "-"
    return "inf" if math.isinf(rate) else f"{rate:g}"
