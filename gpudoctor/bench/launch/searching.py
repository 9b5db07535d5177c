"""The launcher's side of a ``[search]``: replay the recorded probes, run the missing
ones on the configuration's server, append the search's result to results.jsonl.

The bisection itself is pure (:mod:`gpudoctor.bench.plan.search`); a probe is an
ordinary cell (``Plan.probe``), recorded like any other, so a search killed at any
point resumes from its recorded probes and runs each probe exactly once. The result
line (``"record": "search"``) has its own key: a finished search is never rerun.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from gpudoctor.bench.plan import Plan, ServerConfig
from gpudoctor.bench.plan.model import _digest, workload_identity
from gpudoctor.bench.plan.search import Bisection, passes

if TYPE_CHECKING:
    from gpudoctor.bench.launch.campaign import Campaign
    from gpudoctor.bench.launch.server import ServerProcess

__all__ = ["Bisection", "finish", "pending_search", "run_search", "search_key"]


def search_key(plan: Plan, config: ServerConfig) -> str:
    """Return the key of a configuration's search result line (config + search + workload)."""
    assert plan.search is not None
    return "search-" + _digest(
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
    if record.get("status") == "failed":  # its requests failed: the SLO is not met
        return False
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


def pending_search(campaign: Campaign, config: ServerConfig, decisions: list) -> Bisection | None:
    """Return the configuration's search when it has work left (probes to run, or only
    its result line to write: written here); None when there is no search, it is
    recorded, or its configuration is skipped by a quirk."""
    plan = campaign.plan
    if plan.search is None or search_key(plan, config) in campaign.done:
        return None
    if any(d.action == "skip" for d in decisions):
        finish(campaign, config, Bisection(plan.search), "skipped",
               next(d.reason for d in decisions if d.action == "skip"))  # fmt: skip
        return None
    bisection, needs_server = replay(plan, config, campaign.done)
    if not needs_server:
        finish(campaign, config, bisection)
        return None
    return bisection


def run_search(
    campaign: Campaign, config: ServerConfig, bisection: Bisection | None,
    server: ServerProcess, base_url: str, facts: dict,
) -> None:  # fmt: skip
    """Run the search's missing probes on the running server, then record the result."""
    if bisection is None:
        return
    plan = campaign.plan
    assert plan.search is not None
    bisection, _ = replay(plan, config, campaign.done)  # the matrix cells may be probes too
    while (load := bisection.next_probe()) is not None:
        cell = plan.probe(config, load)
        if cell.key not in campaign.done and not campaign._run_cell(cell, server, base_url, facts):
            finish(campaign, config, bisection, "crashed",
                   f"the server crashed at probe {load:g}")  # fmt: skip
            return
        bisection.record(load, _outcome(campaign.done[cell.key], plan.search.goodput))
    finish(campaign, config, bisection)


def finish(
    campaign: Campaign, config: ServerConfig, bisection: Bisection | None,
    status: str = "done", reason: str = "",
) -> None:  # fmt: skip
    """Append the search's result line to results.jsonl (``record = "search"``)."""
    plan = campaign.plan
    if bisection is None or plan.search is None:
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
    campaign.rundir.append(line)
    campaign.done[line["key"]] = line
    met = "none" if result.met is None else f"{result.met:g}"
    failed = "none" if result.failed is None else f"{result.failed:g}"
    campaign.reporter.note(f"{config.label}: search over {spec.over}: met {met}, first failing "
                           f"{failed} ({len(result.probes)} probes, {status})")  # fmt: skip
