"""What the workload modules share: reading a dataset file, chat conversations as the
server sees them, fitting a prompt into the context."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpudoctor.bench.load.workload import Prompt, count_tokens, cut_to_fit

Messages = tuple[tuple[str, str], ...]


def read_entries(path: str) -> list[dict[str, Any]]:
    """Return the objects of a JSON array file or a JSONL file (one object a line);
    raises ValueError naming the line of a bad one."""
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from exc
        return [e for e in data if isinstance(e, dict)]
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from exc
        if isinstance(entry, dict):
            out.append(entry)
    return out


def turns_of(entry: dict[str, Any]) -> Messages:
    """Return a ShareGPT entry's turns as ``(role, text)``, roles ``user`` / ``assistant``
    (``conversations`` with ``from``/``value``, or ``messages`` with ``role``/``content``)."""
    raw = entry.get("conversations") or entry.get("conversation") or entry.get("messages") or []
    out = []
    for turn in raw if isinstance(raw, list) else []:
        if not isinstance(turn, dict):
            continue
        role = turn.get("from", turn.get("role"))
        text = turn.get("value", turn.get("content"))
        if not isinstance(text, str):
            continue
        if role in ("human", "user"):
            out.append(("user", text))
        elif role in ("gpt", "assistant", "bot", "chatgpt"):
            out.append(("assistant", text))
    return tuple(out)


def count_messages(tokenizer: Any, messages: Messages) -> int:
    """Return the tokens the server sees for a chat conversation (its template applied)."""
    ids = tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in messages], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return len(ids)


def render(tokenizer: Any, messages: Messages) -> str:
    """Return a conversation rendered by the chat template as one completion prompt."""
    return str(tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in messages], add_generation_prompt=True, tokenize=False
    ))  # fmt: skip


def conversation_prompt(
    tokenizer: Any, messages: Messages, output_len: int, chat: bool, max_total: int | None,
    after: int | None = None,
) -> Prompt:  # fmt: skip
    """Return the request of a conversation's last turn (the whole history sent): chat
    messages, or (completions) the template-rendered text. When prompt + output would
    not fit ``max_total``, the oldest turns are dropped first, then the last message is
    cut; ``cut_from`` says from what length."""

    def length(msgs: Messages) -> int:
        return (
            count_messages(tokenizer, msgs)
            if chat
            else count_tokens(tokenizer, render(tokenizer, msgs), False)
        )

    full = length(messages)
    kept, cut_from = messages, None
    if max_total is not None and full + output_len > max_total:
        cut_from = full
        output_len = max(min(output_len, max_total // 2), 1)
        while len(kept) > 1 and length(kept) + output_len > max_total:
            kept = kept[2:] if len(kept) > 2 else kept[1:]  # a user + assistant pair at a time
        if length(kept) + output_len > max_total:
            role, text = kept[-1]
            budget = max_total - output_len - (length(kept) - count_tokens(tokenizer, text, False))
            text, _ = cut_to_fit(tokenizer, text, False, max(budget, 2))
            kept = (*kept[:-1], (role, text))
    size = length(kept)
    if chat:
        return Prompt(kept[-1][1], size, output_len, True, cut_from, kept, after)
    return Prompt(render(tokenizer, kept), size, output_len, False, cut_from, None, after)


def fit_text(
    tokenizer: Any, text: str, output_len: int, chat: bool, max_total: int | None
) -> tuple[str, int, int, int | None]:
    """Return ``(text, prompt_len, output_len, cut_from)`` with prompt + output within
    ``max_total`` (the output shortened only when it alone does not fit)."""
    length, cut_from = count_tokens(tokenizer, text, chat), None
    if max_total is not None and length + output_len > max_total:
        shortest = count_tokens(tokenizer, "", chat) + 1
        output_len = max(min(output_len, max_total - shortest), 1)
        if length + output_len > max_total:
            cut_from = length
            text, length = cut_to_fit(tokenizer, text, chat, max_total - output_len)
    return text, length, output_len, cut_from
