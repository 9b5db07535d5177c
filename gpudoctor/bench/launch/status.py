"""``bench status RUN``: a campaign at a glance, live or finished, from another terminal.

Read-only: it reads ``plan.toml``, ``results.jsonl``, ``preflight.jsonl``, ``run.json``,
``state.json`` (what runs where, written by the launcher) and ``gpus.jsonl``; it never
takes the run's lock and writes nothing. A directory of shards (``RUN/shards/I``, what
``bench submit --slurm`` makes) is shown shard by shard with the Slurm tasks' states
(``squeue``/``scontrol``/``sacct``) and the merged totals; a merged run like any run.

Whoever made the run directory chose its files: each is read as a regular file only
(never through a link, never a FIFO or device: ``fsio.read_regular``), at most
:data:`FILE_LIMIT` (plan, state) or :data:`RECORDS_LIMIT` (jsonl) bytes; one that is not
is listed under ``unreadable`` and shown as ``[!] not read``. Every string shown on a
terminal goes through :func:`gpudoctor.terminal.printable` (a crash reason or a server's
log line cannot write the clipboard, retitle or clear the terminal).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from gpudoctor.bench.plan import Plan, PlanError, parse_plan
from gpudoctor.bench.results.launcher_state import STATE, launcher_alive
from gpudoctor.bench.results.run_dir import PLAN, RESULTS, RunDirError, read_records, read_run_file
from gpudoctor.terminal import printable

FILE_LIMIT = 4 << 20  # plan.toml, run.json, state.json: bytes
RECORDS_LIMIT = 256 << 20  # results.jsonl and the other jsonl files: bytes


def _text(path: Path, unreadable: list[str]) -> str | None:
    try:
        data = read_run_file(path, FILE_LIMIT)
    except (RunDirError, OSError) as exc:
        unreadable.append(str(exc))
        return None
    return None if data is None else data.decode("utf-8", "replace")


def _json(path: Path, unreadable: list[str]) -> dict[str, Any]:
    try:
        data = json.loads(_text(path, unreadable) or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _records(path: Path, unreadable: list[str]) -> list[dict[str, Any]]:
    try:
        return read_records(path, limit=RECORDS_LIMIT)[0]
    except (RunDirError, OSError) as exc:
        unreadable.append(str(exc))
        return []


def _plan(run: Path, facts: dict[str, Any], unreadable: list[str]) -> Plan | None:
    """Return the run's plan with its relative paths resolved as the launcher resolved
    them (against the plan file's directory, ``plan_dir`` in run.json or merge.json), so
    its cell keys are the keys the records carry wherever the run dir now lies."""
    recorded = facts.get("plan_dir") or _json(run / "merge.json", unreadable).get("plan_dir")
    base_dir = Path(recorded) if isinstance(recorded, str) and recorded.startswith("/") else run
    text = _text(run / PLAN, unreadable)
    try:
        return None if text is None else parse_plan(text, str(run / PLAN), base_dir=base_dir)
    except PlanError:
        return None


def run_status(run: Path, shard: tuple[int, int] | None = None) -> dict[str, Any]:
    """Return the status of one run directory: ``preflight`` (last verdict, when),
    ``weights`` (restored from where), ``groups`` (per tp: cells done / running (GPUs,
    since) / pending / failed (reason: its requests failed) / skipped (reason) / crashed
    (last log line)), ``progress`` and
    ``eta_s`` (seconds, from the cells measured so far; None when unknown)."""
    from gpudoctor.bench.launch.schedule import in_shard

    unreadable: list[str] = []
    facts = _json(run / "run.json", unreadable)
    plan = _plan(run, facts, unreadable)
    records = {str(r.get("key")): r for r in _records(run / RESULTS, unreadable) if "key" in r}
    preflight = _records(run / "preflight.jsonl", unreadable)
    state = _json(run / STATE, unreadable)
    alive = launcher_alive(state)
    running = {r.get("label"): r for r in state.get("running", [])} if alive else {}
    if shard is None and isinstance(facts.get("shard"), list) and len(facts["shard"]) == 2:
        shard = (int(facts["shard"][0]), int(facts["shard"][1]))
    cells = [c for c in plan.cells() if in_shard(c.key, shard)] if plan else []
    keys = {c.key for c in cells}
    groups: dict[int, dict[str, Any]] = {}

    def group(tp: int) -> dict[str, Any]:
        return groups.setdefault(tp, {"tp": tp, "total": 0, "done": 0, "running": [], "pending": 0,
                                      "skipped": [], "crashed": [], "failed": [],
                                      "starting": []})  # fmt: skip

    measuring: set[str] = set()  # a server measures one cell at a time: its first unrecorded one
    for cell in cells:
        g = group(cell.config.tp)
        g["total"] += 1
        r = records.get(cell.key)
        label = cell.config.label
        if r is None:
            live = running.get(label)
            if (live is not None and live.get("concurrency") == cell.concurrency
                    and label not in measuring):  # fmt: skip
                measuring.add(label)
                g["running"].append({"config": label, "concurrency": cell.concurrency,
                                     "gpus": live.get("gpus", []), "gpu_indices": live.get("gpu_indices", []),
                                     "slot": live.get("slot"), "since": live.get("cell_since") or live.get("since")})  # fmt: skip
            else:
                g["pending"] += 1
        elif r.get("status") == "ok":
            g["done"] += 1
        elif r.get("status") == "failed":
            g["failed"].append({"config": label, "concurrency": cell.concurrency,
                                "reason": r.get("reason")})  # fmt: skip
        elif r.get("status") == "crashed":
            tail = r.get("server_log_tail") or []
            g["crashed"].append({"config": label, "concurrency": cell.concurrency,
                                 "reason": r.get("reason"), "log_line": tail[-1] if tail else None})  # fmt: skip
        else:
            g["skipped"].append(
                {"config": label, "concurrency": cell.concurrency, "reason": r.get("reason")}
            )
    tps = {c.config.label: c.config.tp for c in cells}
    for label, live in running.items():  # a server still loading: no cell measured yet
        if "concurrency" not in live and label in tps:
            group(tps[label])["starting"].append({"config": label, "slot": live.get("slot"),
                                                  "gpu_indices": live.get("gpu_indices", []),
                                                  "since": live.get("since")})  # fmt: skip
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
            elif r.get("status") == "failed":
                g["failed"].append(row)
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
        "gpus_out": _records(run / "gpus.jsonl", unreadable),
        "groups": [groups[tp] for tp in sorted(groups)],
        "progress": {"recorded": recorded, "total": len(cells) or len(records)},
        "eta_s": _eta(cells, records, gpus),
        "stopped": facts.get("stopped"),
        "unreadable": unreadable,
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

    try:
        subs = read_submissions(run)
    except RunDirError as exc:
        subs, unreadable = [], [str(exc)]
    else:
        unreadable = []
    n = int(subs[-1]["shards"]) if subs else None
    dirs = sorted(
        (p for p in shards_dir.iterdir()
         if p.name.isdigit() and not p.is_symlink() and p.is_dir()),
        key=lambda p: int(p.name),
    )  # fmt: skip
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
            "eta_s": max(etas) if etas else None, "unreadable": unreadable}  # fmt: skip


def render(status: dict[str, Any]) -> str:
    """Return the status as text (the todo-list view), every control character of the
    run's strings shown escaped (:func:`gpudoctor.terminal.printable`)."""
    lines = _render(status).split("\n")  # not splitlines: \x85, \u2028 must be escaped, not lines
    lines += [f"  [!] not read: {why}" for why in status.get("unreadable") or []]
    return "\n".join(printable(line) for line in lines)


def _render(status: dict[str, Any]) -> str:
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
        finished = g["done"] + len(g["failed"]) + len(g["skipped"]) + len(g["crashed"])
        bad = g["failed"] or g["crashed"]  # finished is not fine: issue 47
        mark = ("!" if bad else "x") if finished == g["total"] else (
            ">" if g["running"] or g.get("starting") or finished else " ")  # fmt: skip
        lines.append(f"  [{mark}] TP{g['tp']}: {g['done']} done, {len(g['failed'])} failed, "
                     f"{len(g['running'])} running, {g['pending']} pending, "
                     f"{len(g['skipped'])} skipped, {len(g['crashed'])} crashed (of {g['total']})")  # fmt: skip
        for r in g.get("starting", []):
            lines.append(f"        starting server {r['config']}{_on_gpus(r)} (slot {r['slot']})"
                         f" since {r['since']}")  # fmt: skip
        for r in g["running"]:
            lines.append(f"        running {r['config']} c={r['concurrency']}{_on_gpus(r)}"
                         f" (slot {r['slot']}) since {r['since']}")  # fmt: skip
        for f in g["failed"]:
            lines.append(f"        FAILED {f['config']} c={f['concurrency']}: {f['reason']}")
        for s in g["skipped"]:
            lines.append(f"        skipped {s['config']} c={s['concurrency']}: {s['reason']}")
        for c in g["crashed"]:
            lines.append(f"        crashed {c['config']} c={c['concurrency']}: {c['reason']}"
                         + (f" | {c['log_line']}" if c["log_line"] else ""))  # fmt: skip
    if status.get("stopped") and not status["live"]:
        lines.append(f"  stopped: {status['stopped']}")
    return "\n".join(lines)


def _on_gpus(entry: dict[str, Any]) -> str:
    """Return `` on GPU 0,1`` for a server's GPU indices; "" without any (a CPU machine)."""
    indices = entry.get("gpu_indices") or []
    return f" on GPU {','.join(map(str, indices))}" if indices else ""


def _eta_text(eta: float | None) -> str:
    return f", ~{eta / 60:.1f} min left" if eta is not None else ""
