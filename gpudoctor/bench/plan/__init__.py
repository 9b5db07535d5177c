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
    "decode_plan",
    "load_fields",
    "load_plan",
    "parse_plan",
]


def load_plan(path: str | Path) -> Plan:
    """Read and validate the plan file at ``path``; return the Plan (PlanError if bad)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PlanError(f"{path}: cannot read plan ({exc.strerror or exc})") from exc
    return parse_plan(decode_plan(data, str(path)), str(path), base_dir=path.resolve().parent)


_BOM = b"\xef\xbb\xbf"


def decode_plan(data: bytes, source: str) -> str:
    """Return the plan file's bytes as text; PlanError naming ``source`` and the fix for a
    UTF-8 byte order mark (TOML has none: tomllib says only "Invalid statement") or a
    byte that is not UTF-8 (its line, column and value), issue 47."""
    if data.startswith(_BOM):
        raise PlanError(
            f"{source}: starts with a UTF-8 byte order mark (BOM), which TOML does not allow;"
            f" save it as UTF-8 without a BOM (sed -i '1s/^\\xEF\\xBB\\xBF//' {source})"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise PlanError(
            f"{source}: not UTF-8: byte 0x{data[exc.start]:02x} at line {line}, column"
            f" {column}; save the plan as UTF-8 (iconv -f LATIN1 -t UTF-8)"
        ) from None


def parse_plan(text: str, source: str = "plan.toml", base_dir: Path | None = None) -> Plan:
    """Parse plan ``text`` (relative model paths resolve against ``base_dir``); return the Plan."""
    return parse(text, source, base_dir)
