"""`bench status RUN` on a live packed campaign (from another process, read-only) and on
the finished one: groups by TP, running cells on their GPUs, crashed with the log line,
skipped with the reason, progress and an ETA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.campaign_support import wait_no_leftovers, write
from tests.bench.launch.test_packing import UUIDS, packed_plan, standin_gpus, tp1_configs

__all__ = ["standin_gpus"]


def _snapshot(run: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(run)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in run.rglob("*") if p.is_file()}  # fmt: skip


def _status(run: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "status", str(run), *extra],
                          capture_output=True, text=True, timeout=120, env=os.environ.copy())  # fmt: skip


def test_status_of_a_live_then_finished_campaign(
    tmp_path: Path, tiny_model_dir: Path, standin_gpus: Path
) -> None:
    configs = (tp1_configs(4) + '[[configs]]\nname = "wide"\ntp = [2]\n'
               '[[configs]]\nname = "huge"\ntp = [8]\n'
               '[[configs]]\nname = "crashy"\nargs = { exit-after-requests = 1 }\n')  # fmt: skip
    plan_path = write(tmp_path, packed_plan(tiny_model_dir, configs, delay_ms=60))
    run = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-m", "gpudoctor", "bench", "run", str(plan_path), "--out", str(run)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())  # fmt: skip
    try:
        live = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and launcher.poll() is None:
            if (run / "state.json").exists():
                done = _status(run, "--json")
                assert done.returncode == 0, done.stderr
                doc = json.loads(done.stdout)
                running = [r for g in doc["groups"] for r in g["running"]]
                if doc["live"] and len(running) >= 2:
                    live = doc
                    break
            time.sleep(0.2)
        assert live is not None, "never saw two cells running"
        running = [r for g in live["groups"] for r in g["running"]]
        assert all(set(r["gpus"]) <= set(UUIDS) and r["since"] and r["slot"] for r in running)
        assert live["launcher_pid"] == launcher.pid
        assert launcher.wait(timeout=180) == 3  # "crashy" crashed in this run (issue 45.8)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert wait_no_leftovers(run) == []
    before = _snapshot(run)
    done = _status(run, "--json")
    assert _snapshot(run) == before  # read-only: not one byte, not one mtime changed
    doc = json.loads(done.stdout)
    assert not doc["live"] and doc["progress"] == {"recorded": 14, "total": 14}
    groups = {g["tp"]: g for g in doc["groups"]}
    assert sorted(groups) == [1, 2, 8]
    assert groups[1]["done"] == 8 and len(groups[1]["crashed"]) + len(groups[1]["skipped"]) == 2
    assert groups[1]["crashed"][0]["log_line"]
    assert "needs 8 GPU(s)" in groups[8]["skipped"][0]["reason"]
    text = _status(run, "--watch", "0.2")  # a finished run: --watch prints once and returns
    assert text.returncode == 0
    assert (
        "TP1: 8 done, 0 failed, 0 running, 0 pending" in text.stdout
        and "crashed crashy@tp1 c=1" in text.stdout
    )
    assert "[x] TP2" in text.stdout and "preflight: not run" in text.stdout
