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
