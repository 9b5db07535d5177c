"""The serial strategy: no GPU pool known (a CPU host, or NVML absent), so one server at a
time, each configuration's sweep in plan order, each after its own preflight."""

from __future__ import annotations

from gpudoctor.bench.launch.cell_runner import CellRunner
from gpudoctor.bench.launch.config_sweep import serve_and_sweep
from gpudoctor.bench.launch.prep import Preflight
from gpudoctor.bench.launch.server_lifecycle import ServerLifecycle
from gpudoctor.bench.plan import Cell, ServerConfig


def run_serial(servers: ServerLifecycle, runner: CellRunner, preflight: Preflight,
               groups: list[tuple[ServerConfig, list[Cell]]]) -> None:  # fmt: skip
    """Run each ``(configuration, cells)`` of ``groups`` on a server of its own, in order."""
    for config, cells in groups:
        preflight(f"config {config.label}")
        serve_and_sweep(servers, runner, config, cells)
