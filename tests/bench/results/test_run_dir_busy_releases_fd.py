"""A run directory busy with another launcher is refused, and the refusal gives back what
it opened: a process that asks again and again (the service's timer, a retry loop) never
runs out of file descriptors. The other launcher is a real process holding the real lock
(`flock` on RUN/.lock); this process's open descriptors are counted in /proc/self/fd."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.bench.results.run_dir import RunDir, RunDirError

HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_refused_busy_run_dir_leaves_no_descriptor_open(tmp_path: Path) -> None:
    with RunDir(tmp_path):
        pass  # the directory and its lock file exist, as after a first launch
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / ".lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(20):
            with pytest.raises(RunDirError, match="another gpudoctor bench is running"):
                RunDir(tmp_path).__enter__()
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    with RunDir(tmp_path):  # free again once the holder is gone
        pass
