"""Inference engines behind one small interface (see :mod:`gpudoctor.bench.engines.base`)."""

from __future__ import annotations

from gpudoctor.bench.engines.base import Engine, EngineError, FlagProblem
from gpudoctor.bench.plan import EngineSpec


def engine_for(spec: EngineSpec) -> Engine:
    """Return the adapter for the plan's engine (``sglang``, ``vllm`` or ``transformers``)."""
    if spec.name == "sglang":
        from gpudoctor.bench.engines.sglang import SGLang

        return SGLang(spec)
    if spec.name == "vllm":
        from gpudoctor.bench.engines.vllm import VLLM

        return VLLM(spec)
    if spec.name == "transformers":
        from gpudoctor.bench.engines.transformers import TransformersServe

        return TransformersServe(spec)
    if spec.name == "command":
        from gpudoctor.bench.engines.command import CommandServer

        return CommandServer(spec)
    raise EngineError(f"unknown engine {spec.name!r}")


__all__ = ["Engine", "EngineError", "FlagProblem", "engine_for"]
