"""The cell runner: one cell on one running server -> one record in results.jsonl.

This is the one place a cell's record is produced (:meth:`CellRunner.record`): measured
(``ok``, or ``failed`` when its requests failed: :mod:`gpudoctor.bench.launch.outcome`),
crashed, or skipped, whoever decided it (a quirk, a crash earlier in the sweep,
a pool too small). A new field of every cell record goes in :meth:`CellRunner.record`; a
new outcome of a measured cell in :meth:`CellRunner.run`. The runner knows nothing of
scheduling: a strategy (serial, packed, search) decides what runs where and asks it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpudoctor.bench.cell_spec import CellTarget
from gpudoctor.bench.engines import Engine
from gpudoctor.bench.launch import interrupts
from gpudoctor.bench.launch.engine_error import with_engine_error
from gpudoctor.bench.launch.live_state import LiveState
from gpudoctor.bench.launch.outcome import cell_outcome
from gpudoctor.bench.launch.progress import PlainReporter
from gpudoctor.bench.launch.run_writer import RunWriter
from gpudoctor.bench.launch.server import ExternalServer, ServerProcess
from gpudoctor.bench.launch.steps import clamp_workload, keeps_text
from gpudoctor.bench.plan import Cell, Plan, ServerConfig, load_fields
from gpudoctor.bench.results.trace import cell_label, trace_path

MeasureFn = Callable[..., dict[str, Any]]
EXIT_GRACE_S = 2.0  # a failed cell's server: how long its exit may take to be seen (s)


@dataclass
class RunningServer:
    """A configuration's server that answered its readiness check: its process, its URL
    and its facts (argv, port, slot, GPUs, startup_s, max_context...), which go into every
    record of a cell it ran."""

    config: ServerConfig
    process: ServerProcess | ExternalServer
    base_url: str
    facts: dict[str, Any]
    started: float  # time.monotonic() when its configuration began (first start attempt)


@dataclass(frozen=True)
class EngineFacts:
    """What every record says of the engine: its version and the GPU architecture."""

    version: str | None
    arch: str


class CellRunner:
    """Measure cells and record them (see the module docstring)."""

    def __init__(self, plan: Plan, engine: Engine, writer: RunWriter, reporter: PlainReporter,
                 state: LiveState, facts: EngineFacts, shard: tuple[int, int] | None = None,
                 measure: MeasureFn | None = None) -> None:  # fmt: skip
        self.plan = plan
        self.engine = engine
        self.writer = writer
        self.reporter = reporter
        self.state = state
        self.facts = facts
        self.shard = shard
        self.measure = measure

    def record(self, cell: Cell, status: str, **extra: Any) -> None:
        """Append ``cell``'s record with ``status`` (ok, failed, crashed, skipped) and ``extra``
        fields (reason, measurement, server facts...); nothing once the launch is stopping."""
        if self.writer.stopping.is_set():
            return  # interrupted: the cell was not finished; a resume runs it
        server = extra.get("server") if isinstance(extra.get("server"), dict) else {}
        placed = {k: server[k] for k in ("gpus", "slot") if k in server}
        if self.shard is not None:
            placed["shard"] = "{}/{}".format(*self.shard)
        record = {
            "key": cell.key,
            "config": cell.config.name,
            "tp": cell.config.tp,
            "concurrency": cell.concurrency,
            **load_fields(cell),
            "status": status,
            "measurement": extra.pop("measurement", None),
            "config_key": cell.config.key,
            "label": cell.config.label,
            "plan": self.plan.name,
            "engine": {"name": self.plan.engine.name, "version": self.facts.version},
            "gpu_arch": self.facts.arch,
            "args": dict(cell.config.args),
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **placed,
            **extra,
        }
        if not self.writer.append_cell(record):
            return
        shown = "client-bound" if status == "ok" and extra.get("client_bound") else status
        self.reporter.cell_done(
            cell.config.label, cell.concurrency, shown, extra.get("reason") or ""
        )

    def _signal_fields(self, cell: Cell, base_url: str, run_dir: Any) -> dict[str, Any]:
        """Return the CellTarget fields of the server signals and the request timeline:
        the engine's /metrics URL (or why none) and ``RUN/trace/<cell>.json``."""
        url, note = self.engine.metrics_url(base_url)
        label = cell_label(cell.config.label, cell.concurrency, cell.request_rate, cell.repeat)
        return {"metrics_url": url, "metrics_note": note, "label": label,
                "trace_path": trace_path(run_dir, label)}  # fmt: skip

    def run(self, cell: Cell, server: RunningServer) -> str | None:
        """Measure ``cell`` on ``server`` and record it; return None, or why the server
        crashed during the cell (the cell is then recorded as crashed)."""
        interrupts.raise_if_interrupted()  # a Ctrl-C Python dropped stops here
        started = time.monotonic()
        plan = self.plan
        workload, clamp = clamp_workload(
            plan.workload, server.facts.get("max_context"), plan.limits
        )
        if workload is None:
            self.record(
                cell, "skipped", reason=f"cannot fit: {clamp['note']}", clamp=clamp, retryable=False
            )
            return None
        rundir = self.writer.rundir
        raw = rundir.raw_path(cell.key)
        raw.unlink(missing_ok=True)  # an unfinished earlier attempt; this cell reruns from scratch
        target = CellTarget(
            base_url=server.base_url,
            served_model=self.engine.served_model(plan.model),
            tokenizer_dir=plan.model.tokenizer or plan.model.local_dir,
            flush_cache_path=self.engine.flush_cache_path,
            raw_path=raw,
            **self._signal_fields(cell, server.base_url, rundir.path),
        )
        self.reporter.cell_start(cell.config.label, cell.concurrency)
        self.state.cell(str(server.facts.get("slot", 0)), cell.concurrency)
        t_measure = time.monotonic()
        workload = workload.for_concurrency(cell.concurrency)
        if cell.request_rate is not None:
            workload = dataclasses.replace(workload, request_rate=cell.request_rate)
        slo = (plan.search.slo or plan.slo) if cell.search and plan.search else plan.slo
        measurement = self._measure()(target, workload, cell.concurrency, slo,
                                      telemetry=self.facts.arch != "cpu",
                                      progress=self.reporter.requests,
                                      timeout_s=plan.limits.request_timeout_s,
                                      cell_timeout_s=plan.limits.cell_timeout_s,
                                      keep_text=keeps_text(plan.limits, cell.config),
                                      max_total_tokens=clamp.get("max_total_tokens"),
                                      telemetry_gpus=server.facts.get("gpus"))  # fmt: skip
        if "max_total_tokens" in clamp:
            clamp["prompts_cut"] = measurement.get("prompts_cut", 0)
        measure_s = time.monotonic() - t_measure
        timings = {"measure_s": round(measure_s, 4), "cell_s": round(time.monotonic() - started, 4)}
        common = {"measurement": measurement, "clamp": clamp, "server": server.facts,
                  "timings": timings, "raw": str(raw.relative_to(rundir.path))}  # fmt: skip
        process = server.process
        outcome = cell_outcome(measurement, plan.limits)
        if outcome["status"] == "failed" and _connections_broke(measurement) and process.alive():
            # a server dying as the requests failed: the kernel closes its sockets (the
            # requests fail) before its exit can be reaped; give the exit a moment to land
            # (a server that answered, 4xx or 5xx, is alive: no wait for it)
            process.wait_exit(EXIT_GRACE_S)
        if not process.alive():
            tail = process.tail()
            reason = with_engine_error(
                f"server exited with code {process.returncode} during the cell", tail
            )
            self.record(cell, "crashed", reason=reason, server_log_tail=tail, **common)
            return reason
        self.record(cell, **outcome, **common)
        return None

    def _measure(self) -> MeasureFn:
        if self.measure is None:
            from gpudoctor.bench.load.loadgen import measure_cell

            self.measure = measure_cell
        return self.measure


def _connections_broke(measurement: dict[str, Any]) -> bool:
    """Return whether any request failed for a broken or refused connection (the errors
    of a server that is dying), rather than for an answer the server gave."""
    errors = measurement.get("errors") or {}
    return bool(errors.get("disconnect") or errors.get("connect"))
