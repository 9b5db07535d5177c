"""One configuration on one server: start it, run its cells in order on it, stop it.

A strategy (serial, packed, search) calls :func:`serving` and :func:`sweep`; they never
call back. When the server does not start, each of its cells is recorded as crashed;
when it dies during a cell, the later cells of the sweep are recorded as skipped
(retryable) and the configuration goes into the local quirks table.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from gpudoctor.bench.launch.cell_runner import CellRunner, RunningServer
from gpudoctor.bench.launch.server_lifecycle import ServerLifecycle, StartFailed
from gpudoctor.bench.launch.slots import Slot
from gpudoctor.bench.plan import Cell, ServerConfig


@contextmanager
def serving(servers: ServerLifecycle, runner: CellRunner, config: ServerConfig,
            cells: list[Cell], slot: Slot | None = None) -> Iterator[RunningServer | StartFailed]:  # fmt: skip
    """Yield ``config``'s ready server (on ``slot``'s GPUs), stopped on leaving; or, when it
    did not start, the StartFailed after recording each of ``cells`` as crashed."""
    try:
        server = servers.start(config, slot)
    except StartFailed as failed:
        for cell in cells:
            runner.record(
                cell, "crashed", reason=failed.reason, server=failed.facts,
                server_log_tail=failed.tail,
            )  # fmt: skip
        if failed.exited:  # a server that only missed its readiness deadline is no quirk
            servers.record_crash(config, failed.reason)
        yield failed
        return
    facts = server.facts
    runner.reporter.config(
        config.label, f"ready in {facts['startup_s']:.1f} s, max context {facts['max_context']}"
    )
    try:
        yield server
    finally:
        servers.stop(server)


def sweep(
    servers: ServerLifecycle, runner: CellRunner, server: RunningServer, cells: list[Cell]
) -> str | None:
    """Run ``cells`` in order on ``server``; return None, or (after a crash: the crashed
    cell recorded, the rest skipped) why the sweep stopped."""
    config = server.config
    for i, cell in enumerate(cells):
        crashed = runner.run(cell, server)
        if crashed is not None:
            servers.record_crash(config, crashed)
            reason = (
                f"not run: the server of {config.label} crashed at concurrency {cell.concurrency}"
            )
            for later in cells[i + 1 :]:
                runner.record(later, "skipped", reason=reason, retryable=True, server=server.facts)
            return reason
    return None


def serve_and_sweep(servers: ServerLifecycle, runner: CellRunner, config: ServerConfig,
                    cells: list[Cell], slot: Slot | None = None) -> None:  # fmt: skip
    """Run ``config``'s sweep of ``cells`` on one server of its own (on ``slot``'s GPUs)."""
    with serving(servers, runner, config, cells, slot) as server:
        if isinstance(server, RunningServer):
            sweep(servers, runner, server, cells)
