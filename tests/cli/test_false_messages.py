"""Messages that said something false (issue 34.7), each through the real CLI in a
subprocess: `check | head -1`, `bench status` of a directory that is no run, `bench
report` of a launch that has measured nothing yet. (A full run dir: tests/bench/launch/
test_full_run_dir.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GD = [sys.executable, "-m", "gpudoctor"]


def test_check_piped_into_head_keeps_its_verdict(tmp_path: Path) -> None:
    """`check | head -1` exited 1 with nothing on stderr (rich ends a broken pipe with
    SystemExit(1)); the verdict is the one `check > FILE` gives, side by side."""
    whole = subprocess.run([*GD, "check"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, timeout=120)  # fmt: skip
    line = " ".join(GD) + " check | head -1; exit ${PIPESTATUS[0]}"
    piped = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120)
    assert piped.returncode == whole.returncode, (piped.returncode, whole.returncode, piped.stderr)
    assert piped.returncode in (0, 3, 4)
    assert len(piped.stdout.splitlines()) == 1 and "Traceback" not in piped.stderr


def test_status_of_a_directory_that_is_no_run(tmp_path: Path) -> None:
    """`bench status /tmp` exited 0 showing "plan None"."""
    done = subprocess.run([*GD, "bench", "status", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 1, (done.returncode, done.stdout)
    assert "plan None" not in done.stdout
    assert f"{tmp_path} is not a bench run directory" in done.stderr


def test_report_of_a_launch_that_has_measured_nothing_yet(tmp_path: Path) -> None:
    """`bench report` of a live run before its first cell asked "is X a bench run
    directory?"; it says no cell has finished yet, and where to follow it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.toml").write_text('name = "x"\n')
    done = subprocess.run([*GD, "bench", "report", str(run)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert done.returncode == 1
    assert "bench run directory?" not in done.stderr
    assert f"{run}: no cell has finished yet" in done.stderr
    assert f"gpudoctor bench status {run}" in done.stderr


def test_an_empty_host_is_refused_not_taken_for_this_machine() -> None:
    """`--host ''` (an unset shell variable) silently checked the local machine."""
    for command in (["check"], ["fix", "--ct", "200", "--dry-run"]):
        done = subprocess.run([*GD, *command, "--host", ""], capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert done.returncode == 2, (command, done.returncode, done.stdout[-500:])
        assert "'--host': is empty" in done.stderr and done.stdout == ""
