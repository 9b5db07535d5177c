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


def test_a_busy_run_dir_names_its_launcher_and_what_to_do(tmp_path: Path) -> None:
    """Issue 47: a second launcher was told only "run it again with --debug". The holder's
    pid comes from state.json while that process runs (here: this test's own process, as a
    launcher writes it); a stale or unreadable state.json names none."""
    import json

    import psutil

    with RunDir(tmp_path):
        pass
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / ".lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    state = tmp_path / "state.json"
    try:
        assert holder.stdout.readline().strip() == "held"
        started = psutil.Process(holder.pid).create_time()
        state.write_text(json.dumps({"pid": holder.pid, "pid_started": started}))
        with pytest.raises(RunDirError) as named:
            RunDir(tmp_path).__enter__()
        assert str(named.value) == (
            f"{tmp_path}: another gpudoctor bench is running on this directory (launcher pid"
            f" {holder.pid}); follow it with: gpudoctor bench status {tmp_path}, or stop it"
            f" first (kill -INT {holder.pid})"
        )
        for stale in ({"pid": holder.pid, "pid_started": started, "finished": True},
                      {"pid": str(holder.pid)}, [holder.pid]):  # fmt: skip
            state.write_text(json.dumps(stale))
            with pytest.raises(RunDirError) as unnamed:
                RunDir(tmp_path).__enter__()
            assert str(unnamed.value).endswith(
                "is running on this directory; follow it with: gpudoctor bench status"
                f" {tmp_path}, or stop it first (Ctrl-C in its terminal)"
            )
        state.write_text("{not json")
        with pytest.raises(RunDirError, match=r"\(Ctrl-C in its terminal\)$"):
            RunDir(tmp_path).__enter__()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
