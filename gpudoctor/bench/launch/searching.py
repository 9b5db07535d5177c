"""The search strategy: a ``[search]`` runs its configuration's sweep, then bisects on the
same server: replay the recorded probes, run the missing ones (each an ordinary cell, run
by the cell runner), append the search's result to results.jsonl.

The bisection itself is pure (:mod:`gpudoctor.bench.plan.search`); a probe is an
ordinary cell (``Plan.probe``), recorded like any other, so a search killed at any
point resumes from its recorded probes and runs each probe exactly once. The result
line (``"record": "search"``) has its own key: a finished search is never rerun.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from gpudoctor.bench.launch.cell_runner import CellRunner, RunningServer
from gpudoctor.bench.launch.config_sweep import serving, sweep
from gpudoctor.bench.launch.server_lifecycle import ServerLifecycle
from gpudoctor.bench.plan import Cell, Plan, ServerConfig
from gpudoctor.bench.plan.search import Bisection, passes
from gpudoctor.bench.plan_model import digest, workload_identity

__all__ = ["Bisection", "SearchRun", "replay", "search_key"]


def search_key(plan: Plan, config: ServerConfig) -> str:
    """Return the key of a configuration's search result line (config + search + workload)."""
    assert plan.search is not None
    return "search-" + digest(
        {
            "config": config.key,
            "search": dataclasses.asdict(plan.search),
            "workload": workload_identity(plan.workload),
            "rates": config.request_rates[:1],
            "concurrency": max(config.concurrencies),
        },
        16,
    )


def _outcome(record: dict[str, Any], goodput: float) -> bool | None:
    if record.get("status") != "ok":
        return None
    return passes(record.get("measurement"), goodput)


def replay(plan: Plan, config: ServerConfig, done: dict[str, dict]) -> tuple[Bisection, bool]:
    """Return the bisection advanced through every recorded probe, and whether it needs
    another probe (a server)."""
    assert plan.search is not None
    bisection = Bisection(plan.search)
    while (load := bisection.next_probe()) is not None:
        record = done.get(plan.probe(config, load).key)
        if record is None:
            return bisection, True
        bisection.record(load, _outcome(record, plan.search.goodput))
    return bisection, False


class SearchRun:
    """The searches of one launch: which still have work, running them, their result lines."""

    def __init__(self, plan: Plan, servers: ServerLifecycle, runner: CellRunner) -> None:
        self.plan = plan
        self.servers = servers
        self.runner = runner
        self.writer = runner.writer

    def pending(self, config: ServerConfig, decisions: list) -> Bisection | None:
        """Return the configuration's search when it has work left (probes to run, or only
        its result line to write: written here); None when there is no search, it is
        recorded, or its configuration is skipped by a quirk."""
        plan = self.plan
        if plan.search is None or search_key(plan, config) in self.writer.done:
            return None
        if any(d.action == "skip" for d in decisions):
            self.finish(config, Bisection(plan.search), "skipped",
                        next(d.reason for d in decisions if d.action == "skip"))  # fmt: skip
            return None
        bisection, needs_server = replay(plan, config, self.writer.done)
        if not needs_server:
            self.finish(config, bisection)
            return None
        return bisection

    def run(self, config: ServerConfig, cells: list[Cell], bisection: Bisection) -> None:
        """Run ``config``'s sweep of ``cells`` on one server, then its search's missing
        probes on the same server; append the search's result line."""
        with serving(self.servers, self.runner, config, cells) as server:
            if not isinstance(server, RunningServer):
                self.finish(config, bisection, "crashed", server.reason)
                return
            crashed = sweep(self.servers, self.runner, server, cells)
            if crashed is not None:
                self.finish(config, bisection, "crashed", crashed)
                return
            self._probe(config, server)

    def _probe(self, config: ServerConfig, server: RunningServer) -> None:
        """Run the search's missing probes on the running server, then record the result."""
        plan = self.plan
        assert plan.search is not None
        done = self.writer.done
        bisection, _ = replay(plan, config, done)  # the matrix cells may be probes too
        while (load := bisection.next_probe()) is not None:
            cell = plan.probe(config, load)
            if cell.key not in done:
                crashed = self.runner.run(cell, server)
                if crashed is not None:
                    self.servers.record_crash(config, crashed)
                    self.finish(config, bisection, "crashed",
                                f"the server crashed at probe {load:g}")  # fmt: skip
                    return
            bisection.record(load, _outcome(done[cell.key], plan.search.goodput))
        self.finish(config, bisection)

    def finish(
        self, config: ServerConfig, bisection: Bisection, status: str = "done", reason: str = ""
    ) -> None:
        """Append the search's result line to results.jsonl (``record = "search"``)."""
        plan = self.plan
        if plan.search is None:
            return
        result = bisection.result()
        if status == "done" and any(ok is None for _, ok in result.probes):
            status, reason = "crashed", "a probe was not measured (crashed or skipped)"
        spec = plan.search
        line = {
            "key": search_key(plan, config),
            "record": "search",
            "config": config.name,
            "tp": config.tp,
            "label": config.label,
            "config_key": config.key,
            "status": status,
            "reason": reason,
            "search": {
                **dataclasses.asdict(spec),
                "slo": dataclasses.asdict(spec.slo or plan.slo) if (spec.slo or plan.slo) else None,
                "concurrency": max(config.concurrencies) if spec.over == "request_rate" else None,
                "met": result.met,
                "failed": result.failed,
                "probes": [
                    {"load": load, "passed": ok, "key": plan.probe(config, load).key}
                    for load, ok in result.probes
                ],
            },
            "plan": plan.name,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        self.writer.append_result_line(line)
        met = "none" if result.met is None else f"{result.met:g}"
        failed = "none" if result.failed is None else f"{result.failed:g}"
        self.runner.reporter.note(f"{config.label}: search over {spec.over}: met {met}, "
                                  f"first failing {failed} ({len(result.probes)} probes, "
                                  f"{status})")  # fmt: skip
