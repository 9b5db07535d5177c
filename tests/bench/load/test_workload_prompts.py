"""gpudoctor/bench/load/workload.py: the prompts of a cell, with a real (small) tokenizer
trained here in milliseconds by the ``tokenizers`` library, BOS added as Llama's is, with a
chat template: exact lengths, seeds, ShareGPT-like files and their refusals, prompts cut to
the context. test_workload.py does the same with the tiny model's own tokenizer."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gpudoctor.bench.cell_spec import WorkloadSpec
from gpudoctor.bench.load.workload import (
    Prompt,
    build_prompts,
    chat_overhead,
    clean_token_ids,
    count_tokens,
    cut_to_fit,
    draw_lengths,
    exact_length_text,
    jsonl_prompts,
    prompts_from_entries,
)

WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "it", "by", "at", "from", "this", "be", "are", "model", "stream", "token", "prompt", "server", "cache", "batch", "queue", "alpha", "beta", "gamma", "delta"]  # fmt: skip
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(vocab: int = 400):
    """Return a BPE tokenizer (Metaspace, as SentencePiece) that adds <s> like Llama's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = [*WORDS, *("".join(rng.choices(letters, k=rng.randint(2, 7))) for _ in range(300))]
    corpus = [" ".join(rng.choice(words) for _ in range(10)) for _ in range(1500)]
    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.decoder = decoders.Metaspace()
    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    raw.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials))
    raw.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", raw.token_to_id("<s>"))]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        additional_special_tokens=specials[3:],
    )  # fmt: skip
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def spec(**kw) -> WorkloadSpec:
    return WorkloadSpec(**{"input_len": 40, "output_len": 16, "num_prompts": 5, **kw})


# ---------------------------------------------------------------------------- request bodies


def test_a_completion_body_sends_the_text_as_prompt():
    assert Prompt("hi", 3, 7).body("m") == {"model": "m", "max_tokens": 7, "prompt": "hi"}


def test_a_chat_body_sends_one_user_message_or_the_whole_conversation():
    assert Prompt("hi", 3, 7, chat=True).body("m") == {
        "model": "m", "max_tokens": 7, "messages": [{"role": "user", "content": "hi"}]
    }  # fmt: skip
    convo = Prompt("again", 9, 4, chat=True, messages=(("system", "be brief"), ("user", "again")))
    assert convo.body("x")["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "again"},
    ]
    rendered = Prompt("<|user|>again", 9, 4, chat=False, messages=(("user", "again"),))
    assert rendered.body("x") == {"model": "x", "max_tokens": 4, "prompt": "<|user|>again"}


# ---------------------------------------------------------------------------- lengths


def test_lengths_are_drawn_between_the_ratio_and_the_length():
    lens = draw_lengths(random.Random(3), 100, 0.25, 2000)
    assert min(lens) == 25 and max(lens) == 100
    assert draw_lengths(random.Random(3), 7, 1.0, 4) == [7, 7, 7, 7]
    assert set(draw_lengths(random.Random(3), 3, 0.0, 200)) == {1, 2, 3}  # never 0 tokens
    assert draw_lengths(random.Random(3), 50, 0.5, 0) == []


def test_a_ratio_that_leaves_no_length_is_refused():
    with pytest.raises(ValueError) as info:
        draw_lengths(random.Random(0), 10, 1.5, 3)
    assert str(info.value) == "range_ratio 1.5 gives an empty range for length 10"
    with pytest.raises(ValueError, match=r"for length 0$"):
        draw_lengths(random.Random(0), 0, 1.0, 1)


def test_tokens_are_counted_as_the_server_sees_them(tok):
    text = "the model stream"
    plain = len(tok.encode(text, add_special_tokens=False))
    assert count_tokens(tok, text, chat=False) == plain + 1  # <s>
    rendered = tok.apply_chat_template([{"role": "user", "content": text}],
                                       add_generation_prompt=True, tokenize=False)  # fmt: skip
    assert count_tokens(tok, text, chat=True) == len(tok.encode(rendered, add_special_tokens=False))
    assert (
        chat_overhead(tok) == count_tokens(tok, "", chat=True) == 3
    )  # <|user|><|end|><|assistant|>


def test_a_chat_template_answering_a_batch_encoding_is_counted(tok):
    class Batch(dict):
        pass

    class Wrapped:
        def apply_chat_template(self, *args, **kwargs):
            return Batch(input_ids=[1, 2, 3, 4], attention_mask=[1, 1, 1, 1])

    assert count_tokens(Wrapped(), "x", chat=True) == 4


def test_prompts_are_drawn_from_clean_tokens_only(tok):
    special = set(tok.all_special_ids)
    clean = clean_token_ids(tok)
    assert len(clean) >= 100 and not special & set(clean)
    texts = tok.batch_decode([[i] for i in clean])
    assert all(t.strip() and "\ufffd" not in t for t in texts)
    assert tok(texts, add_special_tokens=False)["input_ids"] == [[i] for i in clean]
    assert len(clean) < len(tok) - len(special)  # some tokens do not round-trip alone


def test_a_small_vocabulary_falls_back_to_every_ordinary_token():
    small = make_tokenizer(vocab=60)
    ids = clean_token_ids(small)
    assert ids == [i for i in range(len(small)) if i not in set(small.all_special_ids)]
    again = small(small.batch_decode([[i] for i in ids]), add_special_tokens=False)["input_ids"]
    assert any(e != [i] for i, e in zip(ids, again, strict=True))  # not all of them are clean


def test_random_text_re_tokenizes_to_exactly_the_target(tok):
    allowed = clean_token_ids(tok)
    for target in (1, 2, 17, 64):
        text = exact_length_text(tok, random.Random(target), target, allowed)
        assert len(tok.encode(text, add_special_tokens=False)) == target


def test_the_closest_text_is_returned_when_no_exact_one_exists():
    class OneMore:
        """Every text re-encodes to one token more than it has characters."""

        def decode(self, ids, skip_special_tokens=True):
            return "a" * len(ids)

        def encode(self, text, add_special_tokens=False):
            return [5] * (len(text) + 1)

    assert exact_length_text(OneMore(), random.Random(0), 3, [5]) == "aaa"  # 4 tokens


# ---------------------------------------------------------------------------- random prompts


def test_random_completion_prompts_have_exactly_the_drawn_lengths(tok):
    s = spec(input_len=40, output_len=16, range_ratio=0.5, seed=11)
    prompts = build_prompts(s, tok, count=6)
    rng = random.Random(11)
    assert [p.prompt_len for p in prompts] == draw_lengths(rng, 40, 0.5, 6)
    assert [p.output_len for p in prompts] == draw_lengths(rng, 16, 0.5, 6)
    for p in prompts:
        assert count_tokens(tok, p.text, chat=False) == p.prompt_len and not p.chat
    assert build_prompts(s, tok, count=6) == prompts  # the same seed, the same prompts
    assert build_prompts(spec(seed=12), tok, count=6) != build_prompts(spec(seed=11), tok, count=6)


def test_random_chat_prompts_count_the_template(tok):
    prompts = build_prompts(spec(api="chat", input_len=30, seed=2), tok)
    assert len(prompts) == 5
    for p in prompts:
        assert p.chat and p.prompt_len == 30 == count_tokens(tok, p.text, chat=True)


def test_a_chat_prompt_shorter_than_its_template_is_one_token_of_text(tok):
    (p,) = build_prompts(spec(api="chat", input_len=2, seed=0), tok, count=1)
    assert len(tok.encode(p.text, add_special_tokens=False)) == 1
    assert p.prompt_len == count_tokens(tok, p.text, chat=True) == 4


# ---------------------------------------------------------------------------- datasets


def write_jsonl(path: Path, *rows: object) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_each_shape_of_line_gives_its_first_user_turn(tok, tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        {"conversations": [{"from": "gpt", "value": "no"}, {"from": "human", "value": "one"}]},
        {"conversation": [{"role": "user", "content": "two"}]},
        {"messages": [{"role": "system", "content": "no"}, {"role": "user", "content": "three"},
                      {"role": "user", "content": "later"}]},
        {"prompt": "four"},
        "",
        {"messages": [{"role": "user", "content": ["not", "text"]}]},
        {"messages": [{"role": "assistant", "content": "no user"}]},
        {"prompt": 5},
        {"conversations": [{"from": "human", "value": ""}]},
    )  # fmt: skip
    prompts = jsonl_prompts(spec(kind="jsonl", dataset_path=path), tok, 4)
    assert sorted(p.text for p in prompts) == ["four", "one", "three", "two"]


def test_a_lines_own_output_len_wins(tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", {"prompt": "the model", "output_len": "9"})
    (p,) = jsonl_prompts(spec(kind="jsonl", dataset_path=path, output_len=50), tok, 1)
    assert p == Prompt("the model", count_tokens(tok, "the model", False), 9, False, None)


def test_dataset_prompts_are_shuffled_by_the_seed_and_cycled(tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", *({"prompt": w} for w in WORDS[:6]))
    s = spec(kind="jsonl", dataset_path=path, seed=5)
    texts = [p.text for p in jsonl_prompts(s, tok, 13)]
    order = list(WORDS[:6])
    random.Random(5).shuffle(order)
    assert texts == [order[i % 6] for i in range(13)]


def test_a_dataset_without_a_path_a_bad_line_or_no_prompt_is_refused(tok, tmp_path):
    with pytest.raises(ValueError, match=r"^workload kind .jsonl. needs dataset_path$"):
        jsonl_prompts(spec(kind="jsonl"), tok, 1)
    bad = write_jsonl(tmp_path / "bad.jsonl", {"prompt": "ok"}, "", "{nope")
    with pytest.raises(ValueError) as info:
        jsonl_prompts(spec(kind="jsonl", dataset_path=bad), tok, 1)
    assert (
        str(info.value) == f"{bad}:3: not JSON (Expecting property name enclosed in double quotes)"
    )
    empty = write_jsonl(tmp_path / "empty.jsonl", {"messages": []}, {"x": 1})
    with pytest.raises(ValueError) as info:
        jsonl_prompts(spec(kind="jsonl", dataset_path=empty), tok, 1)
    assert str(info.value) == f"{empty}: no prompt with a user turn"


# ---------------------------------------------------------------------------- the context


LONG = " ".join(WORDS * 3)


@pytest.mark.parametrize("chat", [False, True])
def test_a_prompt_is_cut_at_a_token_border_to_fit_its_budget(tok, chat):
    full = count_tokens(tok, LONG, chat)
    text, length = cut_to_fit(tok, LONG, chat, 25)
    assert length == count_tokens(tok, text, chat) and length <= 25
    assert length >= 20 and LONG.startswith(text)
    assert full > 25
    assert cut_to_fit(tok, "the model", chat, 25) == (
        "the model",
        count_tokens(tok, "the model", chat),
    )


def test_a_prompt_over_the_context_is_cut_and_says_from_what_length(tok):
    s = spec(output_len=10)
    full = count_tokens(tok, LONG, False)
    (p,) = prompts_from_entries([(LONG, None)], s, tok, 1, max_total=40)
    assert p.cut_from == full and p.output_len == 10
    assert p.prompt_len + p.output_len <= 40 and p.prompt_len == count_tokens(tok, p.text, False)
    (fits,) = prompts_from_entries([(LONG, None)], s, tok, 1, max_total=full + 10)
    assert fits.cut_from is None and fits.text == LONG  # exactly at the context: kept whole


def test_an_output_len_that_alone_overflows_is_shortened_first(tok):
    s = spec(output_len=100)
    (p,) = prompts_from_entries([("the", None)], s, tok, 1, max_total=20)
    shortest = count_tokens(tok, "", False) + 1
    assert p.output_len == 20 - shortest and p.cut_from is None and p.text == "the"
    (tiny,) = prompts_from_entries([("the", None)], s, tok, 1, max_total=1)
    assert tiny.output_len == 1


def test_without_a_context_nothing_is_cut(tok):
    (p,) = prompts_from_entries([(LONG, 5)], spec(), tok, 1)
    assert (p.text, p.output_len, p.cut_from) == (LONG, 5, None)


# ---------------------------------------------------------------------------- build_prompts


def test_an_unknown_api_or_kind_is_refused(tok):
    with pytest.raises(ValueError) as info:
        build_prompts(spec(api="responses"), tok)
    assert str(info.value) == "unknown api 'responses' (expected 'completions' or 'chat')"
    with pytest.raises(ValueError) as info:
        build_prompts(spec(kind="trace"), tok)
    assert str(info.value) == (
        "workload kind 'trace' is built by gpudoctor.bench.load.workloads.build_prompts"
    )


def test_the_spec_gives_the_count_unless_one_is_asked_for(tok, tmp_path):
    assert len(build_prompts(spec(num_prompts=3), tok)) == 3
    path = write_jsonl(tmp_path / "d.jsonl", {"prompt": LONG})
    s = spec(kind="jsonl", dataset_path=path, num_prompts=2, output_len=10)
    prompts = build_prompts(s, tok, max_total=30)
    assert len(prompts) == 2 and all(p.cut_from for p in prompts)


def test_exactly_100_clean_tokens_are_enough_to_draw_from():
    class Vocab:
        """101 ordinary tokens, of which 100 decode to text that re-encodes to themselves."""

        all_special_ids = (0,)

        def __len__(self) -> int:
            return 102

        def batch_decode(self, batches):
            return [f"w{i}" if i <= 100 else "\ufffd" for (i,) in batches]

        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [[int(t[1:])] if t.startswith("w") else [0] for t in texts]}

    assert clean_token_ids(Vocab()) == list(range(1, 101))


def test_a_prompt_exactly_at_its_budget_is_kept_and_a_budget_of_two_keeps_one_token(tok):
    full = count_tokens(tok, LONG, False)
    assert cut_to_fit(tok, LONG, False, full) == (LONG, full)
    text, length = cut_to_fit(tok, LONG, False, 2)  # <s> and one token
    assert length == 2 == count_tokens(tok, text, False) and LONG.startswith(text)
