"""The contract between the bench launcher and the load generator.

The launcher (plan, engines, servers, results) and the measuring half (workloads,
client, metrics, telemetry) meet here: "run this workload at this concurrency
against this OpenAI-compatible base URL, return the cell's record".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class WorkloadSpec:
    """What load one cell sends (the plan's ``[workload]`` table).

    Attributes:
        kind: ``random`` (random token prompts) or ``jsonl`` (prompts from a file).
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
        request_rate: requests per second (Poisson, open loop); None = closed loop.
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
    """

    base_url: str
    served_model: str
    tokenizer_dir: str
    flush_cache_path: str | None = None
    raw_path: Path | None = None
