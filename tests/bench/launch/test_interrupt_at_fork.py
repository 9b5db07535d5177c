"""Ctrl-C as bench forks a server is never swallowed (issue 34.5): exit 130, servers
stopped, the campaign does not run on.

The real CLI in a subprocess with the stub server; a real SIGINT delivered at the instant
of the race (tests/bench/launch/interrupt_at_fork/sitecustomize.py: right after the
server's fork, in the at-fork callbacks where Python drops exceptions). Before the fix
the process printed "Exception ignored ... KeyboardInterrupt" and measured every cell,
exit 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import stub_plan, wait_no_leftovers, write
from tests.support.signals import default_signals

HOOK = Path(__file__).parent / "interrupt_at_fork"
IN_POPEN = Path(__file__).parent / "interrupt_in_popen"


@pytest.mark.signals
def test_ctrl_c_landing_in_the_server_fork_stops_the_campaign(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    plan = write(tmp_path, stub_plan(tiny_model_dir, concurrency="[1, 2]"))
    out = tmp_path / "run"
    path = os.pathsep.join(p for p in (str(HOOK), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", str(plan), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, preexec_fn=default_signals,
                          env={**os.environ, "PYTHONPATH": path, "COLUMNS": "200"})  # fmt: skip
    assert done.returncode == 130, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "interrupted; every server is stopped" in done.stderr
    assert "Traceback" not in done.stderr
    assert read_records(out / "results.jsonl")[0] == []  # not one cell measured after it
    assert wait_no_leftovers(out) == []


def test_ctrl_c_while_popen_waits_for_the_servers_exec_stops_it_at_once(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """47.3: a Ctrl-C landing in Popen after the fork (4 of 18 presses at a server's start)
    raised there and lost the Popen object: the launcher never stopped the server; the
    guardian did, then waited 10 + 5 s for it (a zombie, its parent never waited), and bench
    exited 15.2 s after the key. Now the signal is recorded while bench forks, the launcher
    stops its server itself and waits for it: no zombie is left behind."""
    plan = write(tmp_path, stub_plan(tiny_model_dir, concurrency="[1]"))
    out = tmp_path / "run"
    zombies = tmp_path / "zombies"
    path = os.pathsep.join(p for p in (str(IN_POPEN), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "COLUMNS": "200",
        "GPUDOCTOR_TEST_ZOMBIES": str(zombies),
    }
    done = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "bench", str(plan), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        start_new_session=True,
    )  # fmt: skip (its own group: a terminal's)
    assert done.returncode == 130, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "interrupted; every server is stopped" in done.stderr
    assert "Traceback" not in done.stderr
    assert zombies.read_text() == ""  # the server was waited for by its launcher
    assert read_records(out / "results.jsonl")[0] == []
    assert wait_no_leftovers(out) == []
