"""A configuration the engine refuses at start, run as a user runs it (issue 45.8).

The server is ``tests/bench/stream_server.py --refuse-max-model-len 4096``: it dies at start
with the traceback that vLLM 0.32.0 prints for a max_model_len over the model's (the real
pydantic wrapping vLLM's own ValueError). Its reason must name vLLM's cause everywhere a
cell's reason is shown, and the run must exit 3; the next run skips the known crash (a
quirk) and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import stub_plan, write

CAUSE = "User-specified max_model_len (4096) is greater than the derived max_model_len"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip


def test_a_refused_start_is_named_by_the_engine_and_fails_the_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    configs = (
        '[[configs]]\nname = "fine"\n'
        '[[configs]]\nname = "long"\nargs = { refuse-max-model-len = 4096 }\n'
    )
    plan = write(tmp_path, stub_plan(tiny_model_dir, configs=configs, concurrency="[1, 2]"))
    out = tmp_path / "run"
    proc = _cli("run", str(plan), "--out", str(out))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr.replace("Traceback (most recent call last)", "")
    crashed = [r for r in read_records(out / "results.jsonl")[0] if r.get("status") == "crashed"]
    assert len(crashed) == 2
    for record in crashed:  # the record's reason
        assert "exited with code 1 during startup: ValidationError" in record["reason"]
        assert CAUSE in record["reason"]
    ok = [r for r in read_records(out / "results.jsonl")[0] if r.get("status") == "ok"]
    assert len(ok) == 2
    progress = [line for line in proc.stderr.splitlines() if "long" in line and "crashed" in line]
    assert progress and all(CAUSE in line for line in progress), proc.stderr  # progress lines
    why = [line for line in proc.stdout.splitlines() if line.startswith("why long (TP1) c=1, c=2")]
    assert len(why) == 1 and "crashed: server failed to start" in why[0], proc.stdout
    assert CAUSE in why[0]  # the closing table's reasons
    assert "gpudoctor: CRASHED: long (TP1) c=1:" in proc.stderr and "--retry-crashed" in proc.stderr
    report = _cli("report", str(out))
    assert report.returncode == 0, report.stderr
    assert CAUSE in (out / "report.md").read_text(encoding="utf-8").replace("\\_", "_")
    html = (out / "report.html").read_text(encoding="utf-8")
    assert CAUSE in html

    again = tmp_path / "again"  # a new run directory: the crash is a known quirk, skipped
    second = _cli("run", str(plan), "--out", str(again), "--json")
    assert second.returncode == 0, second.stdout + second.stderr
    summary = json.loads(second.stdout)
    assert summary["crashed"] == 0 and summary["skipped"] == 2 and summary["ok"] == 2
