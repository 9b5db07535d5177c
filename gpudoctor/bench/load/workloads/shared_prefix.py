"""``kind = "shared_prefix"``: groups of prompts sharing one system prompt.

As SGLang's bench_serving ``generated-shared-prefix``: ``groups`` system prompts of
``system_prompt_len`` random tokens, ``prompts_per_group`` questions of ``input_len``
random tokens each, every prompt ``system prompt + "\\n\\n" + question``, all of them
shuffled (seeded), each ``output_len`` tokens out. A server with a prefix cache
computes each system prompt once per group.
"""

from __future__ import annotations

import random
from typing import Any

from gpudoctor.bench.cell_spec import WorkloadSpec
from gpudoctor.bench.load.workload import Prompt, clean_token_ids, exact_length_text
from gpudoctor.bench.load.workloads.common import fit_text

DEFAULT_GROUPS = 4
DEFAULT_SYSTEM_PROMPT_LEN = 256


def prompts(spec: WorkloadSpec, tokenizer: Any, count: int, max_total: int | None) -> list[Prompt]:
    """Return ``groups x prompts_per_group`` prompts (default: ``count`` spread over
    ``groups``), shuffled; prompt + output fitted to ``max_total``."""
    groups = spec.groups or DEFAULT_GROUPS
    per_group = spec.prompts_per_group or max(count // groups, 1)
    rng = random.Random(spec.seed)
    allowed = clean_token_ids(tokenizer)
    system_len = spec.system_prompt_len or DEFAULT_SYSTEM_PROMPT_LEN
    systems = [exact_length_text(tokenizer, rng, system_len, allowed) for _ in range(groups)]
    texts = [
        f"{system}\n\n{exact_length_text(tokenizer, rng, spec.input_len, allowed)}"
        for system in systems
        for _ in range(per_group)
    ]
    rng.shuffle(texts)
    chat = spec.api == "chat"
    out = []
    for text in texts:
        fitted, length, output_len, cut_from = fit_text(
            tokenizer, text, spec.output_len, chat, max_total
        )
        out.append(Prompt(fitted, length, output_len, chat, cut_from))
    return out
