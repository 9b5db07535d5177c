"""``kind = "trace"``: replay a Mooncake-format trace at its own times.

Each line of ``dataset_path`` (JSONL) is one request, as the Mooncake traces SGLang's
bench_serving replays (``--dataset-name mooncake``): ``timestamp`` (ms), ``input_length``
and ``output_length`` (tokens), ``hash_ids`` (one id per ``trace_block_size`` tokens,
512 in Mooncake; equal ids are equal blocks, so requests sharing a prefix of ids share
that prefix of text). Each id becomes a block of random tokens seeded by (seed, id), the
blocks are joined and cut (or padded) to ``input_length``, and the request is sent
``(timestamp - first timestamp) * trace_slowdown`` after the cell's first request (the
concurrency still caps the requests in flight). The first ``num_prompts`` lines by time.
"""

from __future__ import annotations

import random
from typing import Any

from gpudoctor.bench.cell_spec import WorkloadSpec
from gpudoctor.bench.load.workload import (
    Prompt,
    clean_token_ids,
    count_tokens,
    cut_to_fit,
    exact_length_text,
)
from gpudoctor.bench.load.workloads.common import fit_text, read_entries

DEFAULT_BLOCK = 512


def _rows(path: str) -> list[dict[str, Any]]:
    rows = []
    for number, entry in enumerate(read_entries(path), start=1):
        try:
            ids = entry.get("hash_ids") or []
            row = {"timestamp": float(entry["timestamp"]), "input_length": int(entry["input_length"]),
                   "output_length": int(entry["output_length"]),
                   "hash_ids": [int(x) for x in ids]}  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{path}: entry {number}: expected timestamp, input_length, output_length, "
                f"hash_ids ({exc!r})"
            ) from exc
        if row["input_length"] < 1 or row["output_length"] < 1:
            raise ValueError(f"{path}: entry {number}: lengths must be at least 1")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no trace entries")
    return sorted(rows, key=lambda r: r["timestamp"])


def prompts(spec: WorkloadSpec, tokenizer: Any, count: int, max_total: int | None) -> list[Prompt]:
    """Return the trace's first ``count`` requests with their send times (``at_s``)."""
    if not spec.dataset_path:
        raise ValueError("workload kind 'trace' needs dataset_path")
    rows = _rows(spec.dataset_path)[:count]
    block = spec.trace_block_size or DEFAULT_BLOCK
    slowdown = spec.trace_slowdown or 1.0
    allowed = clean_token_ids(tokenizer)
    blocks: dict[int, str] = {}
    chat = spec.api == "chat"
    start = rows[0]["timestamp"]
    out = []
    for index, row in enumerate(rows):
        for hash_id in row["hash_ids"]:
            if hash_id not in blocks:
                rng = random.Random(f"{spec.seed}:{hash_id}")
                blocks[hash_id] = exact_length_text(tokenizer, rng, block, allowed)
        text = "".join(blocks[h] for h in row["hash_ids"])
        length = count_tokens(tokenizer, text, chat) if text else 0
        if length > row["input_length"]:
            text, length = cut_to_fit(tokenizer, text, chat, row["input_length"])
        elif length < row["input_length"]:
            pad = exact_length_text(tokenizer, random.Random(f"{spec.seed}:pad:{index}"),
                                    row["input_length"] - length, allowed)  # fmt: skip
            text += pad
        fitted, length, output_len, cut_from = fit_text(
            tokenizer, text, row["output_length"], chat, max_total
        )
        at_s = (row["timestamp"] - start) / 1000.0 * slowdown
        out.append(Prompt(fitted, length, output_len, chat, cut_from, at_s=at_s))
    return out
