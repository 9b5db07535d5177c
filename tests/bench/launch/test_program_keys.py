"""A configuration's key names the program its server runs (issue 45.2), as a user meets it:
real `gpudoctor bench run` processes, real server programs (``tests/bench/stream_server.py``
and copies of it at other paths, a program that dies at start), a per-test quirks table.

Before, plans that differed only in their server program shared one key: one program's
crash quirk skipped the others (0 server starts, exit 0), ``--resume`` kept another
program's results as done, and a server that only missed its readiness deadline was
written down as a crash quirk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import STREAM_SERVER, stub_plan, write

CONFIGS = '[[configs]]\nname = "a"\n'


def _run(plan: Path, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "run", str(plan), "--out",
                           str(out), "--json", *extra], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError:
        summary = {}
    return proc, summary


def _plan_with(tmp_path: Path, model: Path, program: Path, name: str, extra: str = "") -> Path:
    text = stub_plan(model, configs=CONFIGS, concurrency="[1, 2]")
    return write(tmp_path, text.replace(str(STREAM_SERVER), str(program)) + extra, name)


def _copy_server(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    shutil.copy(STREAM_SERVER, path)
    return path


def test_one_programs_crash_does_not_skip_another_program(
    tmp_path: Path, tiny_model_dir: Path, local_quirks: Path
) -> None:
    dying = tmp_path / "dying.py"
    dying.write_text(  # the same flags (its --help is stream_server's), then it dies
        f"import runpy, sys\nif '--help' in sys.argv:\n    runpy.run_path({str(STREAM_SERVER)!r},"
        " run_name='__main__')\nprint('ValueError: this build is broken')\nsys.exit(1)\n"
    )
    crash_plan = _plan_with(tmp_path, tiny_model_dir, dying, "crash.toml")
    proc, summary = _run(crash_plan, tmp_path / "crash")
    assert proc.returncode == 3 and summary["crashed"] == 2, proc.stderr
    assert "crash-" in local_quirks.read_text()
    good_plan = _plan_with(tmp_path, tiny_model_dir, _copy_server(tmp_path, "good.py"), "good.toml")
    proc, summary = _run(good_plan, tmp_path / "good")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (summary["ok"], summary["skipped"], summary["server_starts"]) == (2, 0, 1)
    # the crashed program's own plan is skipped, saying where the quirk lives: every cell
    # skipped means nothing was measured, exit 3
    proc, summary = _run(crash_plan, tmp_path / "crash-again")
    assert proc.returncode == 3 and summary["skipped"] == 2 and summary["server_starts"] == 0
    records = read_records(tmp_path / "crash-again" / "results.jsonl")[0]
    assert all(
        str(local_quirks) in r["reason"] and "--retry-crashed" in r["reason"] for r in records
    )
    assert "nothing was measured: all 2 cell(s) were skipped" in proc.stderr


def test_resume_keeps_no_other_programs_cells_but_reads_an_old_run_of_this_plan(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    first = _plan_with(tmp_path, tiny_model_dir, _copy_server(tmp_path, "one.py"), "one.toml")
    out = tmp_path / "run"
    proc, summary = _run(first, out)
    assert proc.returncode == 0 and summary["ok"] == 2, proc.stderr
    second = _plan_with(tmp_path, tiny_model_dir, _copy_server(tmp_path, "two.py"), "two.toml")
    proc, summary = _run(second, out, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert (summary["already_done"], summary["ok"], summary["server_starts"]) == (0, 2, 1)

    # a run directory written before the key named the program: its records carry the
    # old keys; the same plan resumes them (nothing runs again)
    old = tmp_path / "old"
    proc, _ = _run(first, old)
    assert proc.returncode == 0, proc.stderr
    plan = load_plan(first)
    legacy = {c.key: plan.legacy_cell_key(c) for c in plan.cells()}
    results = old / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    for row in rows:
        row["config_key"] = plan.configs[0].legacy_key
        row["key"] = row["group"] = legacy[row["key"]]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc, summary = _run(first, old)
    assert proc.returncode == 0, proc.stderr
    assert (summary["already_done"], summary["ok"], summary["server_starts"]) == (2, 0, 0)
    # another program's plan on that old directory does not take them (its keys differ)
    proc, summary = _run(second, old, "--resume")
    assert (summary["already_done"], summary["ok"]) == (0, 2), proc.stderr


def test_a_server_that_misses_its_readiness_deadline_is_no_crash_quirk(
    tmp_path: Path, tiny_model_dir: Path, local_quirks: Path
) -> None:
    text = stub_plan(tiny_model_dir, configs=CONFIGS, concurrency="[1]",
                     server_args="start-delay-s = 30")  # fmt: skip
    plan = write(tmp_path, text.replace("startup_timeout_s = 30", "startup_timeout_s = 1"))
    proc, summary = _run(plan, tmp_path / "slow")
    assert proc.returncode == 3 and summary["crashed"] == 1, proc.stderr
    [record] = read_records(tmp_path / "slow" / "results.jsonl")[0]
    assert "server not ready after 1 s" in record["reason"]
    assert not local_quirks.exists() or "crash-" not in local_quirks.read_text()
