"""What report.md and report.html both state before any number (issue 31, item 7;
issue 34, item 9): the workload and the SLO the run used, the cells that need
attention (failed, suspect, client-bound first, then crashed and skipped) with their
reasons, and the machine as a person reads it (no raw ``null`` / ``[]``).

Pure functions over the run directory's plan.toml text, run.json facts and cells; the
callers escape (``report.md_text`` for markdown, ``html.escape`` for the page).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomllib

from gpudoctor.bench.cell_spec import WorkloadSpec
from gpudoctor.bench.results.reader import CellResult
from gpudoctor.bench.results.run_dir import RunDirError, read_run_file


def _plan_tables(run_dir: Path) -> dict[str, Any]:
    try:
        data = read_run_file(Path(run_dir) / "plan.toml")
        return tomllib.loads(data.decode("utf-8", "replace")) if data else {}
    except (RunDirError, tomllib.TOMLDecodeError, OSError):
        return {}


def _text(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(v) for v in value) if value else "none"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_text(v)}" for k, v in value.items()) if value else "none"
    return str(value)


def workload_rows(run_dir: Path) -> list[tuple[str, str]]:
    """Return the workload as (what, value) rows from the run's plan.toml (defaults where
    the plan is silent): kind and dataset, input/output lengths, prompts, arrival process
    and burstiness, warmup, ignore_eos, repeats; empty when plan.toml is unreadable."""
    tables = _plan_tables(run_dir)
    if not tables:
        return []
    table = tables.get("workload") or {}
    names = {f.name for f in dataclasses.fields(WorkloadSpec)}
    w = (
        WorkloadSpec(**{k: v for k, v in table.items() if k in names})
        if isinstance(table, dict)
        else WorkloadSpec()
    )
    rate = (tables.get("axes") or {}).get("request_rate") or w.request_rate
    if rate is None:
        arrivals = "closed loop (a new request as each one ends, up to the concurrency)"
    else:
        shape = w.burstiness or 1.0
        kind = "Poisson" if shape == 1.0 else f"gamma, burstiness {shape:g}"
        arrivals = f"open loop, {_text(rate)} req/s, {kind} arrivals (capped by the concurrency)"
    lengths = f"{w.input_len} in / {w.output_len} out tokens"
    if w.range_ratio < 1:
        lengths += f" (each drawn in [{w.range_ratio:g} x, 1 x])"
    prompts = (f"{w.prompts_per_concurrency} x concurrency per cell" if w.prompts_per_concurrency
               else f"{w.num_prompts} per cell")  # fmt: skip
    return [
        ("prompts", f"{w.kind}" + (f" from {w.dataset_path}" if w.dataset_path else "")),
        ("lengths", lengths + ("" if w.kind == "random" else " (random kind; a dataset's own lengths otherwise)")),
        ("requests", prompts + f", seed {w.seed}"),
        ("arrivals", arrivals),
        ("warmup", f"{w.warmup} request(s), not measured"),
        ("ignore_eos", "yes: exact output lengths" if w.ignore_eos else "no: replies end at EOS"),
        ("API", f"/v1/{'chat/completions' if w.api == 'chat' else 'completions'}"),
        ("repeats", _text(tables.get("repeats", 1))),
    ]  # fmt: skip


def slo_text(run_dir: Path) -> str:
    """Return the SLO goodput counts against (``TTFT <= 200 ms, TPOT <= 50 ms``), or a
    line saying none was set (then goodput is not computed)."""
    tables = _plan_tables(run_dir)
    slo = tables.get("slo") or ((tables.get("search") or {}).get("slo")) or {}
    names = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2el_ms": "E2E latency"}
    parts = [f"{names.get(k, k)} ≤ {_text(v)} ms" for k, v in slo.items() if isinstance(slo, dict)]
    if not parts:
        return "no SLO set ([slo] in the plan): goodput is not computed"
    return ", ".join(parts) + " (goodput: successful requests meeting all of them, per second)"


def attention(cells: Sequence[CellResult]) -> list[tuple[str, str, str]]:
    """Return the cells a reader must know about, as (cell, what, why): failed, suspect
    and client-bound first, then crashed and skipped; empty when every cell is clean."""
    first: list[tuple[str, str, str]] = []
    later: list[tuple[str, str, str]] = []
    for c in cells:
        label = f"{c.config} (TP{c.tp}) {c.load_label}"
        if c.status == "failed":
            first.append((label, "FAILED", c.reason or "its requests failed"))
        for flag in ("suspect", "client_bound"):
            why = c.flag(flag)
            if why:
                first.append((label, flag.replace("_", "-"), why))
        if c.status in ("crashed", "skipped"):
            later.append((label, c.status, c.reason))
    return first + later


def status_counts(cells: Sequence[CellResult]) -> str:
    """Return ``N cells: a ok, b failed, c crashed, d skipped`` (+ flagged counts)."""
    count = {s: sum(1 for c in cells if c.status == s) for s in ("failed", "crashed", "skipped")}
    ok = sum(1 for c in cells if c.ok)
    flags = [f"{n} {name}" for name in ("suspect", "client_bound")
             if (n := sum(1 for c in cells if c.ok and c.flag(name)))]  # fmt: skip
    tail = f" ({', '.join(flags).replace('_', '-')} among the ok)" if flags else ""
    return (f"{len(cells)} cells: {ok} ok, {count['failed']} failed, {count['crashed']} crashed, "
            f"{count['skipped']} skipped{tail}.")  # fmt: skip


def machine_rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    """Return run.json's facts as (fact, value) rows a person reads: GPUs one per line,
    nothing shown as ``null`` or ``[]`` (``–`` / ``none``), earlier launches left out."""
    rows = []
    for key, value in facts.items():
        if key == "launches":
            continue
        if key == "gpus" and isinstance(value, list) and value:
            for gpu in value:
                g = gpu if isinstance(gpu, dict) else {}
                mem = g.get("memory_bytes")
                size = f", {mem / 2**30:.0f} GiB" if isinstance(mem, (int, float)) else ""
                rows.append((f"GPU {_text(g.get('index'))}",
                             f"{_text(g.get('name'))}{size}, {_text(g.get('uuid'))}"))  # fmt: skip
            continue
        if isinstance(value, dict):
            value = json.dumps(value, default=str, sort_keys=True)[:400]
        rows.append((key.replace("_", " "), _text(value)))
    return rows
