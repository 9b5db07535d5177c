"""Workloads beyond ``random`` and ``jsonl``: one module per kind, each a builder
``(spec, tokenizer, count, max_total) -> list[Prompt]`` in :data:`BUILDERS`.

- ``sharegpt``: a ShareGPT file (a JSON array, or JSONL), first human turn as prompt
  and the first reply's length as output length, as SGLang's bench_serving reads it;
- ``multi_turn``: conversations whose every turn carries the whole history;
- ``shared_prefix``: groups of prompts sharing one system prompt;
- ``trace``: a Mooncake-format trace (timestamp, input_length, output_length, hash_ids)
  replayed at its own times.

Every prompt is fitted to the server's real context (``max_total`` tokens of prompt +
output) the same way as dataset prompts: cut at a token border, start kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpudoctor.bench.cell_spec import WorkloadSpec
from gpudoctor.bench.load import workload
from gpudoctor.bench.load.workload import Prompt
from gpudoctor.bench.load.workloads import multi_turn, shared_prefix, sharegpt, trace

Builder = Callable[[WorkloadSpec, Any, int, "int | None"], list[Prompt]]

BUILDERS: dict[str, Builder] = {
    "sharegpt": sharegpt.prompts,
    "multi_turn": multi_turn.prompts,
    "shared_prefix": shared_prefix.prompts,
    "trace": trace.prompts,
}


def build_prompts(
    spec: WorkloadSpec, tokenizer: Any, count: int | None = None, max_total: int | None = None
) -> list[Prompt]:
    """Return the cell's prompts for any workload kind (``spec.num_prompts`` unless
    ``count`` is given), each fitted to ``max_total`` tokens of prompt + output."""
    if spec.kind in ("random", "jsonl"):
        return workload.build_prompts(spec, tokenizer, count, max_total)
    if spec.api not in ("completions", "chat"):
        raise ValueError(f"unknown api {spec.api!r} (expected 'completions' or 'chat')")
    builder = BUILDERS.get(spec.kind)
    if builder is None:
        raise ValueError(f"unknown workload kind {spec.kind!r} (expected random, jsonl, "
                         f"{', '.join(BUILDERS)})")  # fmt: skip
    return builder(spec, tokenizer, spec.num_prompts if count is None else count, max_total)
