"""Inference engines behind one small interface (see :mod:`gpudoctor.bench.engines.base`).

:data:`ENGINES` is the one name -> class table: the plan parser accepts exactly its names
(``[engine] name``) and :func:`engine_for` builds the adapter from it. A new engine is one
module here with an :class:`Engine` subclass and one line in the table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpudoctor.bench.engines.base import Engine, EngineError, EngineNotInstalled, FlagProblem
from gpudoctor.bench.engines.command import CommandServer
from gpudoctor.bench.engines.sglang import SGLang
from gpudoctor.bench.engines.transformers import TransformersServe
from gpudoctor.bench.engines.vllm import VLLM

if TYPE_CHECKING:
    from gpudoctor.bench.plan_model import EngineSpec

# The order is the order of the plan parser's "expected one of ..." message.
ENGINES: dict[str, type[Engine]] = {
    "sglang": SGLang,
    "vllm": VLLM,
    "transformers": TransformersServe,
    "command": CommandServer,
}


def engine_for(spec: EngineSpec) -> Engine:
    """Return the adapter for the plan's engine (a name of :data:`ENGINES`)."""
    cls = ENGINES.get(spec.name)
    if cls is None:
        raise EngineError(f"unknown engine {spec.name!r}")
    return cls(spec)


__all__ = ["ENGINES", "Engine", "EngineError", "EngineNotInstalled", "FlagProblem", "engine_for"]
