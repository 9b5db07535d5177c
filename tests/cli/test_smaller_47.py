"""Issue 47's smaller ones, each through the real CLI in a subprocess: `--no-resume` leaves
nothing of the earlier launch beside the fresh one, a second launcher is told who holds the
run, a refused `bench submit --slurm` leaves no slurm/ behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.campaign_support import stub_plan, wait_no_leftovers

GD = [sys.executable, "-m", "gpudoctor"]


def run(*args: str, **kw) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    return subprocess.run([*GD, *args], capture_output=True, text=True, timeout=300, **kw)


def test_no_resume_archives_servers_state_and_trace_too(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`--no-resume` left servers.jsonl (the fresh run appended to it), state.json and
    trace/ of the earlier launch."""
    plan = tmp_path / "plan.toml"
    plan.write_text(
        stub_plan(tiny_model_dir, configs='[[configs]]\nname = "a"\n', concurrency="[1]")
    )
    out = tmp_path / "run"
    assert run("bench", str(plan), "--out", str(out)).returncode == 0
    assert (out / "trace").is_dir() and (out / "state.json").is_file()
    again = run("bench", str(plan), "--out", str(out), "--no-resume")
    assert again.returncode == 0, again.stderr
    (previous,) = out.glob("previous-*")
    assert {"servers.jsonl", "state.json", "trace"} <= {p.name for p in previous.iterdir()}
    assert len((out / "servers.jsonl").read_text().splitlines()) == 1  # this launch's server
    assert [p.name for p in (out / "trace").iterdir()] == [
        p.name for p in (previous / "trace").iterdir()
    ]  # the fresh launch's own trace, the earlier one archived


def loading_bench(tmp_path: Path, model: Path) -> tuple[Path, Path, subprocess.Popen]:
    """Start `bench PLAN --out RUN` whose one server takes 120 s to load; return the plan,
    the run directory and the launcher (the caller stops it: SIGINT, then wait)."""
    plan = tmp_path / "plan.toml"
    plan.write_text(stub_plan(model, configs='[[configs]]\nname = "a"\n', concurrency="[1]",
                              server_args="start-delay-s = 120")
                    .replace("startup_timeout_s = 30", "startup_timeout_s = 300"))  # fmt: skip
    out = tmp_path / "run"
    launcher = subprocess.Popen([*GD, "bench", str(plan), "--out", str(out)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return plan, out, launcher


def test_a_second_launcher_is_told_who_holds_the_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A second launcher on a run said only "run it again with --debug for the details"."""
    plan, out, first = loading_bench(tmp_path, tiny_model_dir)
    try:
        deadline = time.monotonic() + 120
        state: dict = {}
        while state.get("pid") != first.pid and time.monotonic() < deadline:
            try:  # the launcher writes state.json once it holds the run
                state = json.loads((out / "state.json").read_text())
            except (OSError, ValueError):
                state = {}
        second = run("bench", str(plan), "--out", str(out))
    finally:
        first.send_signal(2)
        first.wait(120)
    assert second.returncode == 1
    assert second.stderr.strip().splitlines()[-1] == (
        f"gpudoctor: error: {out}: another gpudoctor bench is running on this directory (launcher"
        f" pid {first.pid}); follow it with: gpudoctor bench status {out}, or stop it first"
        f" (kill -INT {first.pid})"
    )
    assert wait_no_leftovers(out) == []


def test_a_refused_slurm_submit_leaves_no_slurm_directory(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`bench submit --slurm` left --out/slurm/ behind when sbatch failed. (sbatch, squeue:
    two-line stand-ins for a cluster that refuses the job, as real sbatch does for an
    unknown account: "Invalid account", exit 1.)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\necho 'sbatch: error: Invalid account' >&2\nexit 1\n"
    )
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 0\n")
    for name in ("sbatch", "squeue"):
        (bin_dir / name).chmod(0o755)
    plan = tmp_path / "plan.toml"
    plan.write_text(
        stub_plan(tiny_model_dir, configs='[[configs]]\nname = "a"\n', concurrency="[1]")
    )
    out = tmp_path / "campaign"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = run("bench", "submit", "--slurm", str(plan), "--out", str(out), env=env)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Invalid account" in done.stderr
    assert not out.exists()


def test_a_concurrency_above_the_prompts_is_said_again_after_the_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Concurrency 65536 with 4 prompts ran "without a word": the warning went by before the
    campaign's progress. It is said again under the results table, after the run."""
    plan = tmp_path / "plan.toml"
    plan.write_text(stub_plan(tiny_model_dir, configs='[[configs]]\nname = "a"\n',
                              concurrency="[65536]"))  # fmt: skip
    done = run("bench", str(plan), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    warned = [
        n for n, ln in enumerate(lines) if "concurrency 65536 is more than the 4 prompts" in ln
    ]
    finished = max(n for n, ln in enumerate(lines) if ln.startswith("bench: finished"))
    assert len(warned) == 2 and warned[0] < finished < warned[1], done.stderr
