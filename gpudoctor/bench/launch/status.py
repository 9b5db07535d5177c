"""``bench status RUN``: a campaign at a glance, live or finished, from another terminal.

Read-only: it reads ``plan.toml``, ``results.jsonl``, ``preflight.jsonl``, ``run.json``,
``state.json`` (what runs where, written by the launcher) and ``gpus.jsonl``; it never
takes the run's lock and writes nothing. A directory of shards (``RUN/shards/I``, what
``bench submit --slurm`` makes) is shown shard by shard with the Slurm tasks' states
(``squeue``/``scontrol``/``sacct``) and the merged totals; a merged run like any run.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from gpudoctor.bench.launch.live_state import STATE, launcher_alive
from gpudoctor.bench.plan import Plan, PlanError, parse_plan
from gpudoctor.bench.results.run_dir import PLAN, RESULTS, read_records


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _plan(run: Path) -> Plan | None:
    try:
        return parse_plan((run / PLAN).read_text(encoding="utf-8"), str(run / PLAN), base_dir=run)
    except (OSError, PlanError):
        return None


def run_status(run: Path, shard: tuple[int, int] | None = None) -> dict[str, Any]:
    """Return the status of one run directory: ``preflight`` (last verdict, when),
    ``weights`` (restored from where), ``groups`` (per tp: cells done / running (GPUs,
    since) / pending / skipped (reason) / crashed (last log line)), ``progress`` and
    ``eta_s`` (seconds, from the cells measured so far; None when unknown)."""
    from gpudoctor.bench.launch.schedule import in_shard

    plan = _plan(run)
    records = {str(r.get("key")): r for r in read_records(run / RESULTS)[0] if "key" in r}
    preflight = read_records(run / "preflight.jsonl")[0]
    facts = _json(run / "run.json")
    state = _json(run / STATE)
    alive = launcher_alive(state)
    running = {r.get("label"): r for r in state.get("running", [])} if alive else {}
    if shard is None and isinstance(facts.get("shard"), list) and len(facts["shard"]) == 2:
        shard = (int(facts["shard"][0]), int(facts["shard"][1]))
    cells = [c for c in plan.cells() if in_shard(c.key, shard)] if plan else []
    keys = {c.key for c in cells}
    groups: dict[int, dict[str, Any]] = {}

    def group(tp: int) -> dict[str, Any]:
        return groups.setdefault(tp, {"tp": tp, "total": 0, "done": 0, "running": [], "pending": 0,
                                      "skipped": [], "crashed": []})  # fmt: skip

    for cell in cells:
        g = group(cell.config.tp)
        g["total"] += 1
        r = records.get(cell.key)
        label = cell.config.label
        if r is None:
            live = running.get(label)
            if live is not None and live.get("concurrency") == cell.concurrency:
                g["running"].append({"config": label, "concurrency": cell.concurrency,
                                     "gpus": live.get("gpus", []), "gpu_indices": live.get("gpu_indices", []),
                                     "slot": live.get("slot"), "since": live.get("cell_since") or live.get("since")})  # fmt: skip
            else:
                g["pending"] += 1
        elif r.get("status") == "ok":
            g["done"] += 1
        elif r.get("status") == "crashed":
            tail = r.get("server_log_tail") or []
            g["crashed"].append({"config": label, "concurrency": cell.concurrency,
                                 "reason": r.get("reason"), "log_line": tail[-1] if tail else None})  # fmt: skip
        else:
            g["skipped"].append(
                {"config": label, "concurrency": cell.concurrency, "reason": r.get("reason")}
            )
    if plan is None:  # plan.toml unreadable: the records alone
        for r in records.values():
            g = group(int(r.get("tp") or 1))
            g["total"] += 1
            row = {
                "config": r.get("config"),
                "concurrency": r.get("concurrency"),
                "reason": r.get("reason"),
            }
            if r.get("status") == "ok":
                g["done"] += 1
            elif r.get("status") == "crashed":
                g["crashed"].append({**row, "log_line": (r.get("server_log_tail") or [None])[-1]})
            else:
                g["skipped"].append(row)
    recorded = sum(1 for k in keys if k in records) if plan else len(records)
    pool = state.get("pool") or {}
    gpus = max(len(pool.get("gpus", [])) - len(pool.get("out", {})), 1)
    return {
        "run": str(run),
        "plan": plan.name if plan else facts.get("plan"),
        "live": alive,
        "launcher_pid": state.get("pid") if alive else None,
        "updated_at": state.get("updated_at"),
        "shard": list(shard) if shard else None,
        "preflight": _preflight(preflight),
        "weights": facts.get("weights"),
        "gpus_out": read_records(run / "gpus.jsonl")[0],
        "groups": [groups[tp] for tp in sorted(groups)],
        "progress": {"recorded": recorded, "total": len(cells) or len(records)},
        "eta_s": _eta(cells, records, gpus),
        "stopped": facts.get("stopped"),
    }


def _preflight(lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not lines:
        return None
    last = lines[-1]
    return {"status": last.get("status"), "when": last.get("when"), "at": last.get("at"),
            "checks": len(lines)}  # fmt: skip


def _eta(cells: list, records: dict[str, dict[str, Any]], gpus: int) -> float | None:
    """Return the expected seconds left: each pending cell at the median measured time of
    its tp (else of all), times its tp, over the usable GPUs; None before any measurement."""
    by_tp: dict[int, list[float]] = {}
    for r in records.values():
        cell_s = (r.get("timings") or {}).get("cell_s")
        if isinstance(cell_s, (int, float)):
            by_tp.setdefault(int(r.get("tp") or 1), []).append(float(cell_s))
    if not by_tp:
        return None
    overall = statistics.median([v for vs in by_tp.values() for v in vs])
    pending = [c for c in cells if c.key not in records]
    gpu_s = sum((statistics.median(by_tp[c.config.tp]) if c.config.tp in by_tp else overall) * c.config.tp
                for c in pending)  # fmt: skip
    return gpu_s / gpus


def campaign_status(run: Path) -> dict[str, Any]:
    """Return the status of ``run``: one run directory, or a directory of shards (with
    its Slurm tasks and merged totals) as ``{"shards": [...], "slurm": ..., "merged": ...}``."""
    shards_dir = run / "shards"
    if not shards_dir.is_dir():
        return run_status(run)
    from gpudoctor.bench.launch.slurm import SlurmError, read_submissions, task_states

    subs = read_submissions(run)
    n = int(subs[-1]["shards"]) if subs else None
    dirs = sorted(
        (p for p in shards_dir.iterdir() if p.is_dir() and p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    shards = [run_status(d, (int(d.name), n) if n else None) for d in dirs]
    slurm: dict[str, Any] | None = None
    if subs:
        try:
            states = task_states([str(s["array_job"]) for s in subs])
            slurm = {"submissions": subs, "tasks": {job: {str(t): s for t, s in sorted(ts.items())}
                                                    for job, ts in states.items()}}  # fmt: skip
        except SlurmError as exc:
            slurm = {"submissions": subs, "error": str(exc)}
    total = sum(s["progress"]["total"] for s in shards)
    recorded = sum(s["progress"]["recorded"] for s in shards)
    merged = run_status(run / "merged") if (run / "merged" / RESULTS).is_file() else None
    etas = [s["eta_s"] for s in shards if s["eta_s"] is not None]
    return {"run": str(run), "shards": shards, "slurm": slurm, "merged": merged,
            "progress": {"recorded": recorded, "total": total},
            "eta_s": max(etas) if etas else None}  # fmt: skip


def render(status: dict[str, Any]) -> str:
    """Return the status as text (the todo-list view)."""
    if "shards" in status:
        p = status["progress"]
        lines = [f"{status['run']}: {len(status['shards'])} shard(s), {p['recorded']}/{p['total']} cells recorded"
                 + _eta_text(status["eta_s"])]  # fmt: skip
        slurm = status.get("slurm") or {}
        if slurm.get("error"):
            lines.append(f"slurm: {slurm['error']}")
        for job, tasks in (slurm.get("tasks") or {}).items():
            shown = (
                ", ".join(f"{t}={s}" for t, s in tasks.items()) or "no task known to Slurm any more"
            )
            lines.append(f"slurm array {job}: {shown}")
        for shard in status["shards"]:
            lines += ["", *render(shard).splitlines()]
        if status.get("merged"):
            m = status["merged"]["progress"]
            lines += ["", f"merged: {m['recorded']} cells in {status['run']}/merged"]
        return "\n".join(lines)
    p = status["progress"]
    where = f" (shard {status['shard'][0]}/{status['shard'][1]})" if status.get("shard") else ""
    live = f"running, launcher pid {status['launcher_pid']}" if status["live"] else "not running"
    lines = [f"{status['run']}{where}: plan {status['plan']}, {live}; {p['recorded']}/{p['total']} cells"
             + _eta_text(status["eta_s"] if status["live"] else None)]  # fmt: skip
    pf = status["preflight"]
    lines.append(f"  [{'x' if pf and pf['status'] in ('PASS', 'WARN') else ' '}] preflight: "
                 + (f"{pf['status']} ({pf['when']}, {pf['at']})" if pf else "not run"))  # fmt: skip
    w = status["weights"]
    lines.append(f"  [{'x' if w else '-'}] weights: " + (f"{w['action']} from {w['source']} into {w['dir']} ({w['at']})"
                                                         if w else "none to restore (a local model path)"))  # fmt: skip
    for gpu in status["gpus_out"]:
        lines.append(
            f"  [!] GPU {gpu.get('index')} {gpu.get('uuid')} out of the pool: {gpu.get('reason')}"
        )
    for g in status["groups"]:
        finished = g["done"] + len(g["skipped"]) + len(g["crashed"])
        mark = "x" if finished == g["total"] else ">" if g["running"] or finished else " "
        lines.append(f"  [{mark}] TP{g['tp']}: {g['done']} done, {len(g['running'])} running, {g['pending']} pending, "
                     f"{len(g['skipped'])} skipped, {len(g['crashed'])} crashed (of {g['total']})")  # fmt: skip
        for r in g["running"]:
            lines.append(f"        running {r['config']} c={r['concurrency']} on GPU "
                         f"{','.join(map(str, r['gpu_indices'])) or '-'} (slot {r['slot']}) since {r['since']}")  # fmt: skip
        for s in g["skipped"]:
            lines.append(f"        skipped {s['config']} c={s['concurrency']}: {s['reason']}")
        for c in g["crashed"]:
            lines.append(f"        crashed {c['config']} c={c['concurrency']}: {c['reason']}"
                         + (f" | {c['log_line']}" if c["log_line"] else ""))  # fmt: skip
    if status.get("stopped") and not status["live"]:
        lines.append(f"  stopped: {status['stopped']}")
    return "\n".join(lines)


def _eta_text(eta: float | None) -> str:
    return f", ~{eta / 60:.1f} min left" if eta is not None else ""
