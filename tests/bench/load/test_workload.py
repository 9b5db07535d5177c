"""Prompt generation with the tiny model's real tokenizer: exact lengths, seeds, formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.bench.cell_spec import WorkloadSpec
from gpudoctor.bench.load.workload import build_prompts, count_tokens, draw_lengths, load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return load_tokenizer(str(tiny_model_dir))


def test_random_prompts_have_exact_lengths(tokenizer) -> None:
    spec = WorkloadSpec(input_len=100, output_len=20, num_prompts=8, seed=3)
    prompts = build_prompts(spec, tokenizer)
    assert len(prompts) == 8
    for p in prompts:
        assert p.prompt_len == 100
        assert len(tokenizer.encode(p.text, add_special_tokens=True)) == 100
        assert p.output_len == 20 and not p.chat


def test_range_ratio_bounds_and_seed(tokenizer) -> None:
    spec = WorkloadSpec(input_len=80, output_len=40, range_ratio=0.5, num_prompts=20, seed=7)
    first = build_prompts(spec, tokenizer)
    assert [p.text for p in first] == [p.text for p in build_prompts(spec, tokenizer)]
    other = build_prompts(WorkloadSpec(input_len=80, output_len=40, range_ratio=0.5,
                                       num_prompts=20, seed=8), tokenizer)  # fmt: skip
    assert [p.text for p in first] != [p.text for p in other]
    assert all(40 <= p.prompt_len <= 80 for p in first)
    assert all(20 <= p.output_len <= 40 for p in first)
    assert len({p.prompt_len for p in first}) > 1  # lengths really vary


def test_chat_prompt_len_counts_the_template(tokenizer) -> None:
    spec = WorkloadSpec(input_len=60, num_prompts=4, api="chat")
    for p in build_prompts(spec, tokenizer):
        assert p.chat
        assert p.prompt_len == count_tokens(tokenizer, p.text, chat=True)
        assert p.prompt_len > len(tokenizer.encode(p.text, add_special_tokens=False))
        assert p.prompt_len == 60  # adjusted for merges at the template's borders
        assert p.body("m")["messages"] == [{"role": "user", "content": p.text}]


def test_jsonl_sharegpt_like(tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    lines = [
        {"conversations": [{"from": "human", "value": "the model is fast"},
                           {"from": "gpt", "value": "yes"}]},
        {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "slow test"}]},
        {"prompt": "first second third", "output_len": 5},
        {"conversations": [{"from": "gpt", "value": "no user turn"}]},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    spec = WorkloadSpec(kind="jsonl", dataset_path=str(path), num_prompts=6, output_len=9)
    prompts = build_prompts(spec, tokenizer)
    assert len(prompts) == 6  # 3 usable lines, cycled
    assert {p.text for p in prompts} == {"the model is fast", "slow test", "first second third"}
    for p in prompts:
        assert p.output_len == (5 if p.text == "first second third" else 9)
        assert p.prompt_len == len(tokenizer.encode(p.text))


def test_bad_inputs_are_clear_errors(tokenizer, tmp_path: Path) -> None:
    from gpudoctor.bench.load.workloads import build_prompts as build_any

    with pytest.raises(ValueError, match="unknown workload kind"):
        build_any(WorkloadSpec(kind="nonsense"), tokenizer)
    for kind in ("sharegpt", "trace"):
        with pytest.raises(ValueError, match="dataset_path"):
            build_any(WorkloadSpec(kind=kind), tokenizer)
    with pytest.raises(ValueError, match="dataset_path"):
        build_prompts(WorkloadSpec(kind="jsonl"), tokenizer)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON"):
        build_prompts(WorkloadSpec(kind="jsonl", dataset_path=str(bad)), tokenizer)


def test_exact_lengths_with_a_byte_level_bpe_tokenizer() -> None:
    """Byte-level BPE (Llama 3 / Qwen style) holds partial UTF-8 tokens: random draws of
    those never round-trip, so only clean tokens are drawn; lengths must still be exact."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "ünïcödé",
        "日本語",
        "テスト",
        "émoji",
        "🎉",
        "données",
        "model",
        "stream",
    ]
    corpus = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(3000)]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    raw.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=2000, initial_alphabet=alphabet,
                                                        special_tokens=["<s>"]))  # fmt: skip
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw)
    assert any("\ufffd" in tokenizer.decode([i]) for i in range(len(tokenizer)))  # the trap
    spec = WorkloadSpec(input_len=500, num_prompts=12, range_ratio=0.1, seed=4)
    for p in build_prompts(spec, tokenizer):
        assert len(tokenizer.encode(p.text)) == p.prompt_len
        assert "\ufffd" not in p.text
    lens = [p.prompt_len for p in build_prompts(spec, tokenizer)]
    assert lens == draw_lengths(random.Random(4), 500, 0.1, 12)  # exactly the drawn lengths


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_jsonl_prompts_are_cut_to_the_real_context(tokenizer, tmp_path: Path, api: str) -> None:
    """The seed's 30k-context overflow came from real dataset prompts, which the clamp
    did not shorten: now each is tokenized and cut so input + output fit."""
    long_text = " ".join(f"word{i}" for i in range(400))  # thousands of tokens
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": long_text}) + "\n" + json.dumps({"prompt": "short one"})
                    + "\n" + json.dumps({"prompt": long_text, "output_len": 5000}) + "\n")  # fmt: skip
    spec = WorkloadSpec(kind="jsonl", dataset_path=str(data), output_len=64, num_prompts=6,
                        api=api, seed=1)  # fmt: skip
    full = build_prompts(spec, tokenizer)
    assert max(p.prompt_len for p in full) > 2000 and all(p.cut_from is None for p in full)
    prompts = build_prompts(spec, tokenizer, max_total=1000)
    for before, p in zip(full, prompts, strict=True):
        assert p.prompt_len + p.output_len <= 1000
        assert p.prompt_len == count_tokens(tokenizer, p.text, api == "chat")
        if before.prompt_len + before.output_len > 1000:
            assert p.cut_from == before.prompt_len and p.prompt_len >= 1000 - p.output_len - 8
            assert long_text.startswith(p.text.strip()[:50])  # the start of the prompt is kept
        else:
            assert p.cut_from is None and p.text == before.text
    assert sum(p.cut_from is not None for p in prompts) == 4
    shortest = count_tokens(tokenizer, "", api == "chat") + 1
    assert {p.output_len for p in prompts} == {64, 1000 - shortest}  # an output alone too long
