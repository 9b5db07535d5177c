"""A benchmark plan: TOML -> frozen dataclasses -> the expanded matrix of cells.

A plan names a model, an engine with the server arguments every cell shares, the axes
(tensor parallel sizes, concurrencies), a list of server configurations (each may sweep
one or more arguments), the workload and the SLOs. The classes live in
:mod:`gpudoctor.bench.plan_model`, the TOML parser in :mod:`gpudoctor.bench.plan.parser`;
this module is the entry point and re-exports both (imports go one way:
plan -> plan.parser -> engines -> plan_model). Engine names are those of
:data:`gpudoctor.bench.engines.ENGINES`, the one name -> class table.

Bad input raises :class:`PlanError` whose message names the file, the line and the key.
"""

from __future__ import annotations

from pathlib import Path

from gpudoctor.bench.plan.parser import parse
from gpudoctor.bench.plan_model import (
    ArgValue,
    Cell,
    EngineSpec,
    HardwareSpec,
    Limits,
    ModelSpec,
    Plan,
    PlanError,
    PreflightSpec,
    SearchSpec,
    ServerConfig,
    cell_key,
    config_key,
    load_fields,
)

__all__ = [
    "ArgValue",
    "Cell",
    "EngineSpec",
    "HardwareSpec",
    "Limits",
    "ModelSpec",
    "Plan",
    "PlanError",
    "PreflightSpec",
    "SearchSpec",
    "ServerConfig",
    "cell_key",
    "config_key",
    "load_fields",
    "load_plan",
    "parse_plan",
]


def load_plan(path: str | Path) -> Plan:
    """Read and validate the plan file at ``path``; return the Plan (PlanError if bad)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"{path}: cannot read plan ({exc.strerror or exc})") from exc
    return parse_plan(text, str(path), base_dir=path.resolve().parent)


def parse_plan(text: str, source: str = "plan.toml", base_dir: Path | None = None) -> Plan:
    """Parse plan ``text`` (relative model paths resolve against ``base_dir``); return the Plan."""
    return parse(text, source, base_dir)
