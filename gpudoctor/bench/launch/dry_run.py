"""``bench --dry-run``: the campaign's first steps without a server -- the flags checked
(or not: ``--no-validate``), every cell's decision (run / done / skip), each
configuration's exact server command and the schedule the packed strategy would follow."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from gpudoctor.bench.engines import engine_for
from gpudoctor.bench.launch import prep
from gpudoctor.bench.launch.schedule import (
    Estimates,
    ideal_s,
    in_shard,
    learn_estimates,
    make_jobs,
    makespan,
    simulate,
)
from gpudoctor.bench.launch.slots import GpuPool
from gpudoctor.bench.launch.steps import (
    CampaignError,
    Decision,
    EngineMissing,
    LaunchOptions,
    decide,
    load_generator_problems,
    model_problems,
    retried,
)
from gpudoctor.bench.plan import Cell, Plan, ServerConfig, load_fields
from gpudoctor.bench.plan import quirks as quirks_mod
from gpudoctor.bench.results.run_dir import RunDirError, check_run_dir, read_records

__all__ = ["dry_run", "dumps", "schedule_preview"]


def dry_run(plan: Plan, options: LaunchOptions, validate: bool = True) -> dict[str, Any]:
    """Return the expanded matrix without starting a server: every cell with its action
    (run / done / skip + reason), every configuration's exact server command, and
    ``problems`` (e.g. a model path that does not exist).

    ``validate`` runs the engine's ``--help`` and its interpreter (``engine.python``) to
    check flags and learn the version: a plan is code, and those are programs it names.
    ``validate=False`` is a pure expansion: no program of the plan runs."""
    engine = engine_for(plan.engine)
    quirks_path = options.quirks_path or quirks_mod.default_local_path()
    notes = []
    if not validate:
        notes.append("flags not validated (--no-validate): no program of the plan was run")
        version, arch = plan.engine.version, quirks_mod.detect_arch()
        quirk_list = quirks_mod.load_quirks(quirks_path)
    else:
        try:
            found = prep.inspect_engine(plan, engine, options.help_cache, quirks_path)
            version, arch, quirk_list = found.version, found.arch, found.quirks
        except EngineMissing as exc:
            notes.append(f"flags not validated: {exc}")
            version, arch = None, quirks_mod.detect_arch()
            quirk_list = quirks_mod.load_quirks(quirks_path)

    records: list[dict[str, Any]] = []
    try:  # the same trust as a run: another user's --out is refused, links never followed
        if options.out and check_run_dir(Path(options.out)):
            records, _ = read_records(Path(options.out) / "results.jsonl")
    except RunDirError as exc:
        raise CampaignError(str(exc)) from exc
    done = {str(r["key"]): r for r in records if "key" in r} if options.resume is not False else {}
    done = {k: r for k, r in done.items() if not retried(r, options)}  # --retry-*: run again
    decisions = [
        d
        for d in decide(plan, done, quirk_list, arch, version, options.retry_crashed)
        if in_shard(d.cell.key, options.shard)
    ]
    pool, source = None, None
    try:
        pool, source = prep.gpu_pool(plan)
    except CampaignError as exc:  # e.g. [hardware] on a machine without the GPUs
        notes.append(f"no GPU pool: {exc}")
    servers = read_records(Path(options.out) / "servers.jsonl")[0] if options.out else []
    schedule = schedule_preview(
        pool, source, decisions, learn_estimates(list(done.values()), servers)
    )
    configs = []
    if plan.engine.port_range:
        low, high = plan.engine.port_range
        notes.append(f"each server listens on a free port of {low}-{high} (engine.port_range)")
    if plan.engine.server_url:
        notes.append(f"no server is started: every cell is measured against the running"
                     f" server at {plan.engine.server_url} (engine.server_url)")  # fmt: skip
    for config in plan.configs:
        external = plan.engine.server_url is not None
        argv = [] if external else engine.command(config, plan.model, 0)
        env = {} if external else engine.environment(config)
        configs.append({"label": config.label, "key": config.key, "command": argv, "env": env,
                        "concurrencies": list(config.concurrencies)})  # fmt: skip
    cells = [{"key": d.cell.key, "label": d.cell.config.label, "concurrency": d.cell.concurrency,
              **load_fields(d.cell), "action": d.action, "reason": d.reason}
             for d in decisions]  # fmt: skip
    return {"plan": plan.name, "engine": plan.engine.name, "engine_version": version,
            "validated": validate, "gpu_arch": arch, "configs": configs, "cells": cells,
            "notes": notes,
            "problems": model_problems(plan) + load_generator_problems(), "schedule": schedule,
            "shard": list(options.shard) if options.shard else None,
            "search": dataclasses.asdict(plan.search) if plan.search else None,
            "repeats": plan.repeats,
            "workload": dataclasses.asdict(plan.workload)}  # fmt: skip


def schedule_preview(
    pool: GpuPool | None, source: str | None, decisions: list[Decision], est: Estimates
) -> dict[str, Any]:
    """Return the dry run's schedule: each job's GPUs and wave, the expected length (s)."""
    groups: dict[str, tuple[ServerConfig, list[Cell]]] = {}
    for d in decisions:
        if d.action == "run":
            groups.setdefault(d.cell.config.label, (d.cell.config, []))[1].append(d.cell)
    jobs = make_jobs(list(groups.values()), est)
    serial_s = sum(j.estimate_s for j in jobs)
    if pool is None:  # no GPU known: one server at a time, in plan order
        t, rows = 0.0, []
        for wave, (config, cells) in enumerate(groups.values(), start=1):
            job = make_jobs([(config, cells)], est)[0]
            rows.append({"label": config.label, "gpus": [], "wave": wave, "start_s": t,
                         "end_s": t + job.estimate_s, "cells": len(cells)})  # fmt: skip
            t += job.estimate_s
        return {"gpus": [], "source": None, "placements": rows, "expected_s": t,
                "ideal_s": t, "serial_s": serial_s, "packed": False}  # fmt: skip
    by_index = {g.index: g for g in pool.gpus}
    placements = simulate(jobs, [g.index for g in pool.gpus])
    too_big = [j.config.label for j in jobs if j.gpus > len(pool.gpus)]
    return {
        "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name} for g in pool.gpus],
        "source": source,
        "placements": [
            {
                "label": p.label,
                "gpus": [by_index[i].uuid for i in p.gpus],
                "gpu_indices": list(p.gpus),
                "wave": p.wave,
                "start_s": p.start_s,
                "end_s": p.end_s,
                "cells": p.cells,
            }
            for p in placements
        ],
        "not_runnable": too_big,
        "expected_s": makespan(placements),
        "ideal_s": ideal_s([j for j in jobs if j.gpus <= len(pool.gpus)], len(pool.gpus)),
        "serial_s": serial_s,
        "packed": True,
    }


def dumps(obj: Any) -> str:
    """Return ``obj`` as indented JSON (for ``--json``)."""
    return json.dumps(obj, indent=2, default=str)
