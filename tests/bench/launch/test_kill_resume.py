"""SIGKILL the launcher at random points, resume, and check exactly-once + no orphans.

Most kills hit the small streaming server (stream_server.py, standing for an inference
server: it starts in < 1 s, so 20+ kills fit in CI); test_transformers_e2e.py kills a
few campaigns against the real ``transformers serve``.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.bench.plan import Plan, load_plan
from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import stub_plan, wait_no_leftovers, write

KILLS = int(os.environ.get("GPUDOCTOR_BENCH_KILLS", "20"))


def launch(plan_path: Path, out: Path) -> subprocess.Popen:
    """Start `gpudoctor bench PLAN --out OUT` as its own process."""
    return subprocess.Popen([sys.executable, "-m", "gpudoctor", "bench", str(plan_path), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def check_exactly_once(plan: Plan, out: Path, complete: bool) -> int:
    """Assert no cell twice (and, when ``complete``, every cell once); return the count."""
    records, _ = read_records(out / "results.jsonl")
    counts = collections.Counter(r["key"] for r in records)
    assert all(n == 1 for n in counts.values()), counts.most_common(3)
    assert set(counts) <= {c.key for c in plan.cells()}
    if complete:
        assert set(counts) == {c.key for c in plan.cells()}
        assert all(r["status"] == "ok" for r in records)
    return len(counts)


def calibrate(plan_path: Path, tmp_path: Path) -> float:
    """Return the wall time of one uninterrupted launch (the span kills are drawn from)."""
    started = time.monotonic()
    proc = launch(plan_path, tmp_path / "calibration")
    assert proc.wait(timeout=600) == 0
    return time.monotonic() - started


def _line_count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_for_kill_point(
    proc: subprocess.Popen, out: Path, delay: float | None, records: int | None
) -> bool:
    """Wait until ``delay`` seconds passed or ``records`` lines are in results.jsonl (then a
    further 0-50 ms); return False when the launcher exited first."""
    if records is None:
        try:
            proc.wait(timeout=delay)
            return False
        except subprocess.TimeoutExpired:
            return True
    while proc.poll() is None:
        if _line_count(out / "results.jsonl") >= records:
            time.sleep(random.uniform(0, 0.05))
            return proc.poll() is None
        time.sleep(0.01)
    return False


def kill_and_resume(plan_path: Path, tmp_path: Path, kills_wanted: int, seed: int) -> dict:
    """Kill -9 launches of ``plan_path`` until ``kills_wanted`` kills are done, resuming the
    same run directory (a fresh one once a run completes); finish the last run; return what
    happened, including the cells recorded before and at each kill.

    Kill points alternate: a random delay (uniform over one launch's wall time, so kills
    land in startup, validation, server start, tokenizer load, cells...) and "just after
    the N-th record was appended" (the moment exactly-once is at stake)."""
    plan = load_plan(plan_path)
    total = len(plan.cells())
    span = calibrate(plan_path, tmp_path)
    rng = random.Random(seed)
    kills, rounds, finished_runs, cells_at_kill = 0, 0, 0, []
    out = tmp_path / f"round{rounds}"
    while True:
        done = _line_count(out / "results.jsonl")
        proc = launch(plan_path, out)
        delay, records = None, None
        if kills < kills_wanted:
            if kills % 2 and done < total - 1:
                records = rng.randint(done + 1, total - 1)
            else:
                delay = rng.uniform(0.2, span)
        if wait_for_kill_point(proc, out, delay, records) if kills < kills_wanted else False:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            where = f"{delay:.1f} s" if delay is not None else f"after record {records}"
            assert wait_no_leftovers(out) == [], f"server left behind after kill {kills} ({where})"
            after = check_exactly_once(plan, out, complete=False)
            cells_at_kill.append({"before": done, "after": after, "when": where})
            continue
        code = proc.wait(timeout=600)
        assert code == 0, f"launcher exited {code}"
        finished_runs += 1
        assert wait_no_leftovers(out) == []
        check_exactly_once(plan, out, complete=True)
        if kills >= kills_wanted:
            return {"kills": kills, "rounds": rounds + 1, "finished_runs": finished_runs,
                    "cells_at_kill": cells_at_kill, "span_s": span}  # fmt: skip
        rounds += 1
        out = tmp_path / f"round{rounds}"


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_stub(tmp_path: Path, tiny_model_dir: Path) -> None:
    configs = "".join(
        f'[[configs]]\nname = "{n}"\nargs = {{ token-delay-ms = {d} }}\n'
        for n, d in (("a", 1), ("b", 2), ("c", 3))
    )
    plan_path = write(tmp_path, stub_plan(tiny_model_dir, configs=configs))
    seed = int(os.environ.get("GPUDOCTOR_BENCH_KILL_SEED", "20261202"))
    result = kill_and_resume(plan_path, tmp_path, KILLS, seed=seed)
    assert result["kills"] >= KILLS
    total = len(load_plan(plan_path).cells())
    # the kills landed all over the campaign: before a launch's first record, and between records
    kills = result["cells_at_kill"]
    assert any(k["after"] == k["before"] for k in kills), kills
    assert any(k["before"] < k["after"] < total for k in kills), kills
