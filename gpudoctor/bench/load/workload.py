"""Prompts for one cell, built with the model's own tokenizer so lengths are exact.

Two kinds (``WorkloadSpec.kind``):

- ``random``: token ids drawn from the vocabulary (special tokens excluded), decoded
  to text and adjusted until the text re-tokenizes to exactly the drawn length.
- ``jsonl``: one prompt per line of a ShareGPT-like file: ``{"conversations": [{"from":
  "human", "value": ...}, ...]}`` (or ``"messages"`` with ``role``/``content``) or
  ``{"prompt": ...}``; an optional ``"output_len"`` per line overrides the spec.

Lengths are drawn uniformly from ``[max(int(len * range_ratio), 1), len]`` for input
and output, as SGLang's ``--random-range-ratio``. The same seed gives the same prompts.
With ``api == "chat"`` the prompt is a one-message conversation and ``prompt_len``
counts the tokens after the chat template, as the server will see them.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.bench.cell_spec import WorkloadSpec

_MAX_ADJUST_ROUNDS = 20


@dataclass(frozen=True)
class Prompt:
    """One request's input.

    Attributes:
        text: the user text (the completion prompt, or the chat message's content).
        prompt_len: tokens the server will see (after the chat template for chat).
        output_len: ``max_tokens`` to request.
        chat: True when ``text`` is sent as a chat message.
        cut_from: the prompt's length before it was cut to fit the context, if it was.
        messages: a whole conversation ``((role, content), ...)`` sent as chat messages
            (multi-turn, shared system prompt); ``text`` is then its last user message,
            or (completions) the conversation rendered by the chat template.
        after: the index of the prompt that must be over before this one is sent (the
            previous turn of a conversation), or None.
        at_s: the send time in seconds after the cell's first request (trace replay).
    """

    text: str
    prompt_len: int
    output_len: int
    chat: bool = False
    cut_from: int | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    after: int | None = None
    at_s: float | None = None

    def body(self, model: str) -> dict[str, Any]:
        """Return the OpenAI request body (without streaming/sampling fields)."""
        body: dict[str, Any] = {"model": model, "max_tokens": self.output_len}
        if self.chat and self.messages:
            body["messages"] = [{"role": r, "content": c} for r, c in self.messages]
        elif self.chat:
            body["messages"] = [{"role": "user", "content": self.text}]
        else:
            body["prompt"] = self.text
        return body


@functools.lru_cache(maxsize=4)
def load_tokenizer(tokenizer_dir: str) -> Any:
    """Return the Hugging Face tokenizer in ``tokenizer_dir`` (local files only; cached,
    since every cell of a sweep uses the same one)."""
    from transformers import AutoTokenizer  # lazy: transformers is heavy

    return AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)


def draw_lengths(rng: random.Random, length: int, range_ratio: float, count: int) -> list[int]:
    """Return ``count`` lengths uniform in ``[max(int(length * range_ratio), 1), length]``."""
    low = max(int(length * range_ratio), 1)
    if low > length:
        raise ValueError(f"range_ratio {range_ratio} gives an empty range for length {length}")
    return [rng.randint(low, length) for _ in range(count)]


def count_tokens(tokenizer: Any, text: str, chat: bool) -> int:
    """Return the tokens the server sees for ``text`` (with the chat template when ``chat``)."""
    if chat:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in newer versions
            ids = ids["input_ids"]
        return len(ids)
    return len(tokenizer.encode(text, add_special_tokens=True))


def chat_overhead(tokenizer: Any) -> int:
    """Return the tokens the chat template adds around an empty user message."""
    return count_tokens(tokenizer, "", chat=True)


def clean_token_ids(tokenizer: Any) -> list[int]:
    """Return the ids of non-special tokens that decode to valid text and re-encode to themselves.

    Byte-level BPE vocabularies (Llama 3, Qwen) hold partial UTF-8 sequences; random draws
    of those decode to replacement characters and never round-trip, so prompts are drawn
    from the tokens that do (most of a real vocabulary). Falls back to every non-special
    id when fewer than 100 qualify.
    """
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    texts = tokenizer.batch_decode([[i] for i in ids])
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    clean = [
        i
        for i, text, again in zip(ids, texts, encoded, strict=True)
        if text.strip() and "\ufffd" not in text and again == [i]
    ]
    return clean if len(clean) >= 100 else ids


def exact_length_text(
    tokenizer: Any, rng: random.Random, target: int, allowed_ids: list[int]
) -> str:
    """Return text of random tokens that re-tokenizes (no special tokens) to ``target`` tokens.

    Decoding then encoding random ids need not round-trip (merges across token borders),
    so the ids are re-encoded, truncated or extended, and decoded again until the length
    is stable. If that never happens the closest text is returned; callers count its
    real length (``count_tokens``), so a record never claims a wrong prompt length.
    """
    ids = [rng.choice(allowed_ids) for _ in range(target)]
    best_text, best_gap = "", None
    for _ in range(_MAX_ADJUST_ROUNDS):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        encoded = tokenizer.encode(text, add_special_tokens=False)
        gap = abs(len(encoded) - target)
        if gap == 0:
            return text
        if best_gap is None or gap < best_gap:
            best_text, best_gap = text, gap
        if len(encoded) > target:
            ids = encoded[:target]
        else:
            ids = encoded + [rng.choice(allowed_ids) for _ in range(target - len(encoded))]
    return best_text


def random_prompts(spec: WorkloadSpec, tokenizer: Any, count: int) -> list[Prompt]:
    """Return ``count`` random-token prompts for ``spec`` (seeded by ``spec.seed``)."""
    rng = random.Random(spec.seed)
    chat = spec.api == "chat"
    input_lens = draw_lengths(rng, spec.input_len, spec.range_ratio, count)
    output_lens = draw_lengths(rng, spec.output_len, spec.range_ratio, count)
    allowed = clean_token_ids(tokenizer)
    overhead = chat_overhead(tokenizer) if chat else 0
    bos_extra = 0 if chat else count_tokens(tokenizer, "", chat=False)
    prompts = []
    for input_len, output_len in zip(input_lens, output_lens, strict=True):
        body_len = max(input_len - overhead - bos_extra, 1)
        text = exact_length_text(tokenizer, rng, body_len, allowed)
        length = count_tokens(tokenizer, text, chat)
        for _ in range(_MAX_ADJUST_ROUNDS if chat else 0):
            if length == input_len:  # the template's borders can merge with the content
                break
            body_len = max(body_len + input_len - length, 1)
            text = exact_length_text(tokenizer, rng, body_len, allowed)
            length = count_tokens(tokenizer, text, chat)
        prompts.append(Prompt(text, length, output_len, chat))
    return prompts


def _jsonl_text(entry: dict[str, Any]) -> str | None:
    """Return the first user turn of a ShareGPT-like entry (None when there is none)."""
    if isinstance(entry.get("prompt"), str):
        return entry["prompt"]
    turns = entry.get("conversations") or entry.get("conversation") or entry.get("messages") or []
    for turn in turns:
        role = turn.get("from", turn.get("role"))
        if role in ("human", "user"):
            text = turn.get("value", turn.get("content"))
            return text if isinstance(text, str) else None
    return None


def cut_to_fit(tokenizer: Any, text: str, chat: bool, budget: int) -> tuple[str, int]:
    """Return ``text`` cut (at a token border, keeping its start) so that the server sees
    at most ``budget`` tokens (after the chat template / BOS), and that count."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    keep = max(budget - count_tokens(tokenizer, "", chat), 1)
    cut, length = text, count_tokens(tokenizer, text, chat)
    for _ in range(_MAX_ADJUST_ROUNDS):
        if length <= budget or keep < 1:
            break
        cut = tokenizer.decode(ids[:keep], skip_special_tokens=True)
        length = count_tokens(tokenizer, cut, chat)
        keep -= max(length - budget, 1)  # a decode/encode round trip may merge differently
    return cut, length


def jsonl_prompts(
    spec: WorkloadSpec, tokenizer: Any, count: int, max_total: int | None = None
) -> list[Prompt]:
    """Return ``count`` prompts from ``spec.dataset_path`` (shuffled by seed, cycled if short).

    ``max_total``: the tokens a request may use (prompt + output, the server's real
    context minus the template overhead); a longer prompt is cut to fit (``cut_from``
    says from what length), and an output_len that alone does not fit is shortened."""
    if not spec.dataset_path:
        raise ValueError("workload kind 'jsonl' needs dataset_path")
    entries = []
    for number, line in enumerate(Path(spec.dataset_path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{spec.dataset_path}:{number}: not JSON ({exc.msg})") from exc
        text = _jsonl_text(entry)
        if text:
            entries.append((text, entry.get("output_len")))
    if not entries:
        raise ValueError(f"{spec.dataset_path}: no prompt with a user turn")
    return prompts_from_entries(entries, spec, tokenizer, count, max_total)


def prompts_from_entries(
    entries: list[tuple[str, Any]], spec: WorkloadSpec, tokenizer: Any, count: int,
    max_total: int | None = None,
) -> list[Prompt]:  # fmt: skip
    """Return ``count`` prompts from ``(text, own output_len or None)`` entries (shuffled
    by seed, cycled if short), each cut to ``max_total`` as :func:`jsonl_prompts`."""
    entries = list(entries)
    rng = random.Random(spec.seed)
    rng.shuffle(entries)
    output_lens = draw_lengths(rng, spec.output_len, spec.range_ratio, count)
    chat = spec.api == "chat"
    shortest = count_tokens(tokenizer, "", chat) + 1  # the template / BOS and one token
    prompts = []
    for i in range(count):
        text, own_output_len = entries[i % len(entries)]
        output_len = int(own_output_len) if own_output_len else output_lens[i]
        length, cut_from = count_tokens(tokenizer, text, chat), None
        if max_total is not None and length + output_len > max_total:
            output_len = max(min(output_len, max_total - shortest), 1)
            if length + output_len > max_total:
                cut_from = length
                text, length = cut_to_fit(tokenizer, text, chat, max_total - output_len)
        prompts.append(Prompt(text, length, output_len, chat, cut_from))
    return prompts


def build_prompts(
    spec: WorkloadSpec, tokenizer: Any, count: int | None = None, max_total: int | None = None
) -> list[Prompt]:
    """Return the cell's prompts (``spec.num_prompts`` unless ``count`` is given);
    ``max_total`` cuts dataset prompts to fit (see :func:`jsonl_prompts`)."""
    if spec.api not in ("completions", "chat"):
        raise ValueError(f"unknown api {spec.api!r} (expected 'completions' or 'chat')")
    count = spec.num_prompts if count is None else count
    if spec.kind == "random":
        return random_prompts(spec, tokenizer, count)
    if spec.kind == "jsonl":
        return jsonl_prompts(spec, tokenizer, count, max_total)
    raise ValueError(
        f"workload kind {spec.kind!r} is built by gpudoctor.bench.load.workloads.build_prompts"
    )
