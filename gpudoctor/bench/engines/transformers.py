"""Hugging Face ``transformers serve`` (5.24): the engine that runs on a CPU-only box.

The model directory is passed as ``FORCE_MODEL`` so the weights load before the port
opens: ``GET /health`` answering 200 means ready. The server exposes no context length,
so it is read from the served directory's ``config.json`` (``max_position_embeddings``
and friends) and ``tokenizer_config.json`` (``model_max_length``): the smallest wins.
Requests must name the model exactly as passed (the absolute directory path here).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from gpudoctor.bench.engines.base import Engine

if TYPE_CHECKING:
    from gpudoctor.bench.plan_model import ModelSpec, ServerConfig

_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")


def context_from_model_dir(model_dir: str) -> int | None:
    """Return the smallest context length a HF model directory declares (None if none)."""
    found: list[int] = []
    for name, keys in (
        ("config.json", _CONTEXT_KEYS),
        ("tokenizer_config.json", ("model_max_length",)),
    ):
        try:
            data = json.loads((Path(model_dir) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for section in (data, data.get("text_config") or {}):
            for key in keys:
                value = section.get(key)
                if isinstance(value, int) and 0 < value < 10**8:  # tokenizers use 1e30 for "none"
                    found.append(value)
    return min(found) if found else None


class TransformersServe(Engine):
    """``transformers serve`` with a preloaded local model."""

    name = "transformers"
    # transformers serve 5.24.0 has no /metrics route (cli/serving/server.py): the scrape
    # records the server's own 404 as why every signal is "not available"
    metrics_path = "/metrics"
    package = "transformers"
    reserved = ("host", "port")
    ready_path = "/health"

    def launcher(self) -> list[str]:
        """Return ``[transformers, serve]`` (the console script beside the interpreter)."""
        script = self.script("transformers")
        return (
            [script, "serve"]
            if script
            else [self.python, "-m", "transformers.cli.transformers", "serve"]
        )

    def model_args(self, model: ModelSpec, config: ServerConfig) -> list[str]:
        """Return the model directory as the positional ``FORCE_MODEL``."""
        return [model.local_dir]

    def served_model(self, model: ModelSpec) -> str:
        """Return the model directory: the server pins requests to that exact string."""
        return model.local_dir

    def environment(self, config: ServerConfig) -> dict[str, str]:
        """Return the base environment plus ``HF_HUB_OFFLINE=1`` (a local dir needs no hub)."""
        return {"HF_HUB_OFFLINE": "1", **super().environment(config)}

    def max_context(self, client: httpx.Client, base_url: str, model: ModelSpec) -> int | None:
        """Return the context length declared in the served model directory."""
        return super().max_context(client, base_url, model) or context_from_model_dir(
            model.local_dir
        )
