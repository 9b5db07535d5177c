"""vLLM: ``vllm serve MODEL`` (flags per vllm's EngineArgs / frontend args).

vLLM's ``vllm serve --help`` prints only a usage line and its config groups ("For full
list: vllm serve --help=all"); the flags are checked against ``--help=all``, which lists
every one with its choices (vllm 0.32.0, checked against the real CLI in the suite:
tests/bench/vllm/).

Readiness is ``GET /health``; the real context length is ``max_model_len`` in
``GET /v1/models``. vLLM configures speculative decoding through one JSON flag,
``--speculative-config '{"method": ..., "model": ..., "num_speculative_tokens": ...}'``
(a TOML inline table in the plan is passed as JSON). No cache-flush endpoint is used
(``/reset_prefix_cache`` exists only in dev mode).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpudoctor.bench.engines.base import Engine

if TYPE_CHECKING:
    from gpudoctor.bench.plan_model import ModelSpec, ServerConfig


class VLLM(Engine):
    """The vLLM OpenAI-compatible server."""

    name = "vllm"
    package = "vllm"
    reserved = ("host", "port", "model", "tensor-parallel-size", "tp")
    ready_path = "/health"

    def launcher(self) -> list[str]:
        """Return ``[vllm, serve]`` (the console script beside the interpreter when present)."""
        script = self.script("vllm")
        return (
            [script, "serve"]
            if script
            else [self.python, "-m", "vllm.entrypoints.cli.main", "serve"]
        )

    def help_argv(self) -> list[str]:
        """Return ``vllm serve --help=all`` (the plain ``--help`` lists no flag)."""
        return [*self.launcher(), "--help=all"]

    def model_args(self, model: ModelSpec, config: ServerConfig) -> list[str]:
        """Return ``MODEL --tensor-parallel-size N`` (+ ``--served-model-name`` when set)."""
        argv = [model.local_dir, "--tensor-parallel-size", str(config.tp)]
        if model.served_name:
            argv += ["--served-model-name", model.served_name]
        return argv
