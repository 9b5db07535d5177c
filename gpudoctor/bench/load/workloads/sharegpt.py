"""``kind = "sharegpt"``: a ShareGPT file (``[{"conversations": [{"from": "human",
"value": ...}, {"from": "gpt", "value": ...}]}, ...]``, a JSON array or JSONL).

As SGLang's bench_serving (``--dataset-name sharegpt``): conversations with fewer than
two turns are left out, the first human turn is the prompt and the length of the first
reply (in the model's tokens) the output length; prompts or replies under 2 tokens are
pruned. The order is shuffled by the seed; a file shorter than the cell is cycled.
"""

from __future__ import annotations

from typing import Any

from gpudoctor.bench.cell_spec import WorkloadSpec
from gpudoctor.bench.load.workload import Prompt, prompts_from_entries
from gpudoctor.bench.load.workloads.common import read_entries, turns_of


def prompts(spec: WorkloadSpec, tokenizer: Any, count: int, max_total: int | None) -> list[Prompt]:
    """Return ``count`` prompts from the ShareGPT file ``spec.dataset_path``."""
    if not spec.dataset_path:
        raise ValueError("workload kind 'sharegpt' needs dataset_path")
    entries: list[tuple[str, Any]] = []
    for entry in read_entries(spec.dataset_path):
        turns = turns_of(entry)
        if len(turns) < 2 or turns[0][0] != "user" or turns[1][0] != "assistant":
            continue
        reply = len(tokenizer.encode(turns[1][1], add_special_tokens=False))
        if reply < 2 or len(tokenizer.encode(turns[0][1], add_special_tokens=False)) < 2:
            continue
        entries.append((turns[0][1], reply))
    if not entries:
        raise ValueError(f"{spec.dataset_path}: no conversation with a human turn and a reply")
    return prompts_from_entries(entries, spec, tokenizer, count, max_total)
