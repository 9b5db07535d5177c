"""A full run directory is reported as such, never as "cannot write to stdout" (issue
34.7): a real tmpfs filled to the last page, the real CLI in a subprocess."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.campaign_support import stub_plan, write


@pytest.fixture
def full_tmpfs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real 256 KiB tmpfs (mount -t tmpfs), unmounted after the test."""
    point = tmp_path / "mnt"
    point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(point)]).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)


def _fill(directory: Path) -> None:
    """Write a filler file until the file system says ENOSPC."""
    with open(directory / "filler", "wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"x" * 4096)
    with pytest.raises(OSError) as caught:
        (directory / "probe").write_bytes(b"y" * 4096)
    assert caught.value.errno == errno.ENOSPC
    with contextlib.suppress(FileNotFoundError):
        (directory / "probe").unlink()


def test_a_full_run_dir_names_the_file_not_stdout(
    full_tmpfs: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    plan = write(tmp_path, stub_plan(tiny_model_dir, concurrency="[1]"))
    run = full_tmpfs / "run"
    run.mkdir(mode=0o755)
    (run / "plan.toml").write_text(plan.read_text())  # resumed: the plan needs no write
    _fill(full_tmpfs)
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", str(plan), "--out", str(run)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert "stdout" not in done.stderr and "redirect the output" not in done.stderr, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("gpudoctor: error: ")]
    assert len(error) == 1, done.stderr
    assert f"cannot write {run}/" in error[0] and "No space left on device" in error[0]
    assert f"df -h {run}" in error[0]
