"""Generate a Qwen3-architecture checkpoint with random bf16 weights, as a weights mirror holds it.

For the GPU campaign (tests/gpu/run_campaign.sh), which may download nothing: a real
architecture's config (``Qwen3ForCausalLM``: Qwen3-4B's layer shape with 44 layers and
untied embeddings, 5.2 B parameters, 10.4 GB in bf16), safetensors shards of about 4 GB with
``model.safetensors.index.json`` as the Hub's checkpoints have them, and a tokenizer in the
real format (``tokenizer.json``: a byte-free BPE over printable ASCII with Qwen's 151,643
regular tokens plus its chat special tokens, built with the ``tokenizers`` library). Greedy
decoding never emits a special token (their output rows are zero), so every request runs
to ``max_tokens`` without ``ignore_eos``, which ``transformers serve`` refuses.

The directory is written as ``MIRROR/ORG/NAME`` with the ``.gpudoctor-manifest.json`` that
``gpudoctor weights ensure --mirror MIRROR`` restores from (sha256 of every shard).

Usage: python tests/gpu/make_model.py MIRROR [--repo gpudoctor/qwen3-5b-random]
       [--preset qwen3-5b|tiny] [--device cuda|cpu]
Prints one JSON line: the model's path, parameters, bytes and the seconds it took.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PRESETS = {
    # Qwen3-4B's layers (hidden 2560, MLP 9728, 32 query / 8 KV heads of 128), 44 of them,
    # untied embeddings: 5.22 B parameters, 10.4 GB in bf16.
    "qwen3-5b": {
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 44,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "regular_tokens": 151643,
    },
    # the same code path in seconds on a CPU (the campaign script's local dry run)
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 12288,
        "regular_tokens": 12000,
    },
}
SHARD_BYTES = 4 << 30


def build_tokenizer(regular_tokens: int):  # type: ignore[no-untyped-def]
    """Return a ``tokenizers.Tokenizer``: BPE whose vocabulary is the specials, 96 single
    characters (printable ASCII, the Metaspace mark, newline), every 2-character pair and
    then 3-character tokens (pair + character) up to ``regular_tokens`` regular tokens.
    Every token decodes to text on its own, so streamed chunks are never empty."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    alphabet = [chr(c) for c in range(33, 127)] + ["\u2581", "\n"]
    vocab: dict[str, int] = {}
    for token in SPECIALS + alphabet:
        vocab[token] = len(vocab)
    merges: list[tuple[str, str]] = []
    for a in alphabet:
        for b in alphabet:
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    pairs = [a + b for a in alphabet for b in alphabet]
    target = regular_tokens + len(SPECIALS)
    for c in alphabet:
        for pair in pairs:
            if len(vocab) >= target:
                break
            vocab[pair + c] = len(vocab)
            merges.append((pair, c))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.add_special_tokens(SPECIALS)
    return tok


def save_tokenizer(out: Path, regular_tokens: int, max_len: int):  # type: ignore[no-untyped-def]
    """Write tokenizer.json + tokenizer_config.json (chat template) into ``out``; return the
    transformers tokenizer."""
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(regular_tokens),
        unk_token="<unk>",
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=max_len,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(str(out))
    return hf_tok


def weight_shapes(config) -> dict[str, tuple[int, ...]]:  # type: ignore[no-untyped-def]
    """Return {parameter name: shape} of ``Qwen3ForCausalLM(config)`` (built on the meta device)."""
    import torch
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    return {name: tuple(p.shape) for name, p in model.state_dict().items()}


def plan_shards(shapes: dict[str, tuple[int, ...]]) -> list[list[str]]:
    """Return the parameter names grouped into shards of about SHARD_BYTES (bf16)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = 2
        for d in shape:
            nbytes *= d
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def write_shard(path: Path, names: list[str], shapes: dict, device: str, zero_rows: list[int], seed: int) -> tuple[int, str]:  # type: ignore[type-arg]  # fmt: skip
    """Generate and write one shard (random normal * 0.02; norms 1; the zero output rows);
    return (bytes, sha256)."""
    import torch
    from safetensors.torch import save

    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name in names:
        shape = shapes[name]
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.bfloat16, device=device)
        else:
            t = torch.randn(shape, generator=gen, dtype=torch.bfloat16, device=device) * 0.02
        if name == "lm_head.weight":
            t[zero_rows] = 0
        tensors[name] = t.cpu()
    data = save(tensors, metadata={"format": "pt"})
    digest = hashlib.sha256(data).hexdigest()
    with open(path, "wb") as fh:
        fh.write(data)
    return len(data), digest


def make_model(mirror: Path, repo: str, preset: str, device: str) -> dict:
    """Write the model under ``mirror/repo`` with its manifest; return facts about it."""
    from transformers import GenerationConfig, Qwen3Config

    from gpudoctor.weights.manifest import Manifest, ManifestFile, utc_now_iso

    started = time.monotonic()
    p = PRESETS[preset]
    out = mirror.joinpath(*repo.split("/"))
    out.mkdir(parents=True, exist_ok=True)
    hf_tok = save_tokenizer(out, p["regular_tokens"], 40960)
    special_ids = [hf_tok.convert_tokens_to_ids(t) for t in SPECIALS]
    config = Qwen3Config(
        vocab_size=p["vocab_size"],
        hidden_size=p["hidden_size"],
        intermediate_size=p["intermediate_size"],
        num_hidden_layers=p["num_hidden_layers"],
        num_attention_heads=p["num_attention_heads"],
        num_key_value_heads=p["num_key_value_heads"],
        head_dim=p["head_dim"],
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=hf_tok.pad_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        dtype="bfloat16",
    )
    config.architectures = ["Qwen3ForCausalLM"]
    config.save_pretrained(str(out))
    GenerationConfig(do_sample=False, eos_token_id=hf_tok.eos_token_id,
                     pad_token_id=hf_tok.pad_token_id).save_pretrained(str(out))  # fmt: skip
    shapes = weight_shapes(config)
    params = 0
    for shape in shapes.values():
        n = 1
        for d in shape:
            n *= d
        params += n
    # output rows that greedy decoding must never pick: the specials and the padding ids
    zero_rows = special_ids + list(range(len(hf_tok), p["vocab_size"]))
    shards = plan_shards(shapes)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    with ThreadPoolExecutor(max_workers=min(4, len(shards))) as pool:
        written = list(pool.map(
            lambda i: write_shard(out / names[i], shards[i], shapes, device, zero_rows, i),
            range(len(shards)),
        ))  # fmt: skip
    index = {
        "metadata": {"total_size": sum(n for n, _ in written) - 0},
        "weight_map": {param: names[i] for i, group in enumerate(shards) for param in group},
    }
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    files = [ManifestFile(names[i], written[i][0], written[i][1]) for i in range(len(shards))]
    for path in sorted(out.iterdir()):
        if path.is_file() and path.name not in names and not path.name.startswith("."):
            files.append(ManifestFile(path.name, path.stat().st_size, None))
    files.sort(key=lambda f: f.path)
    manifest = Manifest(repo, hashlib.sha1(repo.encode()).hexdigest(), tuple(files), utc_now_iso())
    (out / ".gpudoctor-manifest.json").write_text(manifest.to_json())
    os.sync()
    return {
        "path": str(out),
        "repo": repo,
        "preset": preset,
        "parameters": params,
        "bytes": sum(f.size for f in files),
        "shards": len(shards),
        "vocab": len(hf_tok),
        "seconds": round(time.monotonic() - started, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mirror", type=Path)
    parser.add_argument("--repo", default="gpudoctor/qwen3-5b-random")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="qwen3-5b")
    parser.add_argument(
        "--device", default=None, help="where to draw the weights (default: cuda if present)"
    )
    args = parser.parse_args()
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    print(json.dumps(make_model(args.mirror, args.repo, args.preset, device)))


if __name__ == "__main__":
    main()
