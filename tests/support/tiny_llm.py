"""A tiny, randomly initialised Llama model + locally trained tokenizer (no network).

It stands for a real LLM checkpoint in the bench tests: `transformers serve` loads it on
the CPU and serves real OpenAI-compatible streaming completions. Greedy decoding never
emits EOS (the special tokens' output rows are zeroed), so every request runs to exactly
``max_tokens``. Recipe: docs/recipes/cpu_llm_server.md (section 2).
"""

from __future__ import annotations

import random
from pathlib import Path

MAX_POS = 2048  # context length the model advertises (max_position_embeddings)
VOCAB = 1024


def make_tiny_model(out: str | Path) -> Path:
    """Create the tiny model in ``out`` (config.json, model.safetensors, tokenizer files);
    return its path. Byte-identical on every run (~900 KB, ~7 s with imports)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = str(out)

    # ---- 1. tokenizer: BPE over printable ASCII with a SentencePiece-style Metaspace
    # pre-tokenizer/decoder, so that EVERY token decodes to valid text on its own
    # (byte-level BPE would leave half UTF-8 sequences that stream as nothing).
    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "was",
        "for",
        "on",
        "that",
        "with",
        "as",
        "by",
        "at",
        "from",
        "his",
        "her",
        "it",
        "an",
        "are",
        "were",
        "be",
        "this",
        "which",
        "or",
        "had",
        "not",
        "but",
        "have",
        "one",
        "all",
        "their",
        "they",
        "has",
        "its",
        "been",
        "who",
        "more",
        "when",
        "time",
        "new",
        "will",
        "would",
        "about",
        "can",
        "after",
        "other",
        "over",
        "into",
        "first",
        "two",
        "than",
        "most",
        "also",
        "some",
        "these",
        "only",
        "people",
        "model",
        "token",
        "stream",
        "server",
        "latency",
        "benchmark",
        "request",
        "response",
        "prompt",
        "output",
        "input",
        "fast",
        "slow",
        "test",
        "value",
        "number",
        "system",
        "data",
        "result",
        "first",
        "second",
        "third",
        "world",
        "small",
        "large",
    ]
    rng = random.Random(0)
    corpus = []
    for _ in range(4000):
        s = " ".join(rng.choice(words) for _ in range(rng.randint(5, 20)))
        corpus.append(
            s.capitalize()
            + rng.choice([".", "!", "?", ",", ";", ":"])
            + " "
            + str(rng.randint(0, 9999))
            + "\n"
        )
    specials = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    alphabet = [chr(c) for c in range(33, 127)] + ["\u2581", "\n"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=specials,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    chat_template = (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=MAX_POS,
    )
    hf_tok.chat_template = chat_template
    hf_tok.save_pretrained(out)

    # ---- 2. model: ~0.2 M parameters, random weights (seeded => reproducible)
    torch.manual_seed(0)
    special_ids = [hf_tok.convert_tokens_to_ids(t) for t in specials]
    cfg = LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: the least vLLM's CPU attention supports
        num_key_value_heads=2,
        max_position_embeddings=MAX_POS,
        tie_word_embeddings=False,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        # zero the output rows of special tokens: their logit is 0 while the max over ~1000 random
        # logits is > 0, so greedy decoding never emits EOS / <unk> and runs to max_tokens
        model.lm_head.weight[special_ids] = 0.0
    model.generation_config.do_sample = False  # greedy by default; clients may pass temperature
    model.save_pretrained(out)
    # saved {out}: vocab={len(hf_tok)} params={sum(p.numel() for p in model.parameters())}")
    return Path(out)
