"""``kind = "multi_turn"``: conversations whose every turn sends the whole history.

Turn k of a conversation is sent once turn k-1 is over, with every earlier user turn
and reply in front of the new question, so a server's prefix cache sees each turn's
history again (what multi-turn traffic does to a server). With ``dataset_path`` the
conversations of a ShareGPT file are used (its real replies as the history, up to
``turns`` user turns); without, ``num_prompts // turns`` conversations are generated:
``input_len`` random tokens per question and, as the history's replies, ``output_len``
random tokens (the server's own reply is not fed back, as SGLang's multi-round Mooncake
replay uses a placeholder reply; the history, and so the cache, is the same every run).
"""

from __future__ import annotations

import random
from typing import Any

from gpudoctor.bench.cell_spec import WorkloadSpec
from gpudoctor.bench.load.workload import Prompt, clean_token_ids, exact_length_text
from gpudoctor.bench.load.workloads.common import (
    Messages,
    conversation_prompt,
    read_entries,
    turns_of,
)

DEFAULT_TURNS = 3


def _generated(spec: WorkloadSpec, tokenizer: Any, count: int) -> list[Messages]:
    turns = spec.turns or DEFAULT_TURNS
    rng = random.Random(spec.seed)
    allowed = clean_token_ids(tokenizer)
    conversations = []
    for _ in range(max(count // turns, 1)):
        messages: list[tuple[str, str]] = []
        for _ in range(turns):
            messages.append(("user", exact_length_text(tokenizer, rng, spec.input_len, allowed)))
            messages.append(
                ("assistant", exact_length_text(tokenizer, rng, spec.output_len, allowed))
            )
        conversations.append(tuple(messages))
    return conversations


def _from_file(spec: WorkloadSpec, count: int) -> list[Messages]:
    assert spec.dataset_path
    found = []
    for entry in read_entries(spec.dataset_path):
        turns = turns_of(entry)
        if turns and turns[0][0] == "user":
            found.append(turns)
    if not found:
        raise ValueError(f"{spec.dataset_path}: no conversation starting with a user turn")
    random.Random(spec.seed).shuffle(found)
    per = spec.turns or DEFAULT_TURNS
    wanted = max(count // per, 1)
    return [found[i % len(found)] for i in range(wanted)]


def prompts(spec: WorkloadSpec, tokenizer: Any, count: int, max_total: int | None) -> list[Prompt]:
    """Return the requests of every turn of every conversation, conversation by
    conversation; each turn's ``after`` is its previous turn's index."""
    conversations = (
        _from_file(spec, count) if spec.dataset_path else _generated(spec, tokenizer, count)
    )
    limit = spec.turns or DEFAULT_TURNS
    chat = spec.api == "chat"
    out: list[Prompt] = []
    for messages in conversations:
        previous = None
        users = [i for i, (role, _) in enumerate(messages) if role == "user"][:limit]
        for at in users:
            history = messages[: at + 1]
            reply = (
                messages[at + 1][1]
                if at + 1 < len(messages) and messages[at + 1][0] == "assistant"
                else ""
            )
            output_len = spec.output_len if not reply or not spec.dataset_path else max(
                len(tokenizer.encode(reply, add_special_tokens=False)), 1)  # fmt: skip
            out.append(
                conversation_prompt(tokenizer, history, output_len, chat, max_total, previous)
            )
            previous = len(out) - 1
    return out
