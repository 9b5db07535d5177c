"""A file replaced by gpudoctor's one write module (gpudoctor/fsio.py) survives a power cut
as the old bytes or the new ones, never as an empty file: the new bytes are fsync'ed
before the rename makes them the file, and the directory after it.

Seen on a real process with strace (Debian's ``strace``; tests/run.sh installs it): the
system calls of ``atomic_replace`` in the order the kernel received them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _syscalls(tmp_path: Path, code: str) -> list[str]:
    strace = shutil.which("strace")
    if strace is None:
        if os.environ.get("GPUDOCTOR_REQUIRE_LAB"):
            pytest.fail("strace is not installed (tests/run.sh installs it)")
        pytest.skip("strace is not installed (apt-get install strace; tests/run.sh does)")
    log = tmp_path / "strace.log"
    argv = [strace, "-f", "-qq", "-y", "-e", "signal=none", "-o", str(log),
            "-e", "trace=fsync,fdatasync,rename,renameat,renameat2", sys.executable, "-c", code]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return [re.sub(r"^\d+\s+", "", line) for line in log.read_text().splitlines()]


def test_the_new_bytes_are_on_disk_before_the_rename_and_the_rename_after(tmp_path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    calls = _syscalls(
        tmp_path,
        f"from gpudoctor.fsio import atomic_replace; atomic_replace({str(target)!r}, b'new')",
    )
    renames = [i for i, c in enumerate(calls) if c.startswith("rename")]
    assert len(renames) == 1 and f'"{target.name}"' in calls[renames[0]], calls
    tmp_name = re.search(r'"(\.state\.json\.[^"]+)"', calls[renames[0]])
    assert tmp_name, calls
    synced = [i for i, c in enumerate(calls)
              if c.startswith(("fsync(", "fdatasync(")) and f"/{tmp_name.group(1)}>" in c]  # fmt: skip
    assert synced and synced[0] < renames[0], calls  # the data first, then the name
    dir_synced = [i for i, c in enumerate(calls) if c.startswith("fsync(") and f"<{tmp_path}>" in c]
    assert dir_synced and dir_synced[-1] > renames[0], calls  # the rename made durable
    assert target.read_text() == "new"
