"""What the run directory reads and writes at its limits: a size bound that reads no more
than it must (a planted sparse file of gigabytes costs nothing), a full disk named as the
file that could not be written (never blamed on stdout), and the side files of a campaign
(servers.jsonl, gpus.jsonl) appended where ``bench status`` and the report read them."""

from __future__ import annotations

import json
import os
import subprocess
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor.bench.results.run_dir import (
    RunDir,
    RunDirError,
    read_records,
    read_run_file,
    scan_records,
    write_atomic,
)

MIB = 1 << 20


def test_a_file_of_exactly_the_limit_is_read_whole_and_one_byte_more_is_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"x" * (3 * MIB))
    assert read_run_file(path, limit=3 * MIB) == b"x" * (3 * MIB)
    path.write_bytes(b"x" * (3 * MIB + 1))
    with pytest.raises(RunDirError) as caught:
        read_run_file(path, limit=3 * MIB)
    assert str(caught.value) == (
        f"{path} is larger than 3 MiB: not a file gpudoctor wrote; remove it (rm {path})"
    )
    assert read_run_file(path) == b"x" * (3 * MIB + 1)  # no limit: read whole


def test_a_huge_planted_file_is_refused_after_reading_one_byte_past_the_limit(
    tmp_path: Path,
) -> None:
    """A 1 GiB sparse results file (``truncate -s 1G``) another tool left: refused with the
    bound, and what was read stays within it (no gigabyte in memory)."""
    path = tmp_path / "results.jsonl"
    with open(path, "wb") as fh:
        fh.truncate(1 << 30)
    tracemalloc.start()
    try:
        for read in (
            lambda: read_run_file(path, limit=MIB),
            lambda: scan_records(path, limit=MIB),
            lambda: read_records(path, limit=MIB),
        ):
            with pytest.raises(RunDirError, match="larger than 1 MiB"):
                read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * MIB


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs, filled to the last byte (``mount -t tmpfs -o size=64k``)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mount)],
                   check=True)  # fmt: skip
    try:
        run = mount / "run"
        run.mkdir()
        try:  # fill it: the write, the flush or the close says ENOSPC
            with open(mount / "filler", "wb") as fh:
                while True:
                    fh.write(b"\0" * 4096)
                    fh.flush()
        except OSError:
            pass
        yield run
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_names_the_run_file_and_the_fix(full_disk: Path) -> None:
    """ENOSPC while writing run.json or appending a record: the one line names that file,
    the reason, ``df -h`` of its directory and what to do."""
    fix = (
        "; free space there (df -h {parent}) or choose another --out, then run the same"
        " command again"
    )
    target = full_disk / "run.json"
    with pytest.raises(RunDirError) as caught:
        write_atomic(target, "x" * 65536)
    assert str(caught.value) == (
        f"cannot write {target}: No space left on device" + fix.format(parent=full_disk)
    )
    with RunDir(full_disk) as run, pytest.raises(RunDirError) as appended:
        run.append({"key": "k", "status": "ok", "pad": "x" * 65536})
    assert str(appended.value) == (
        f"cannot write {full_disk / 'results.jsonl'}: No space left on device"
        + fix.format(parent=full_disk)
    )


def test_server_and_gpu_facts_are_appended_to_their_own_files(tmp_path: Path) -> None:
    with RunDir(tmp_path / "run") as run:
        run.append_server({"label": "a@tp1", "exit": 0})
        run.append_server({"label": "b@tp1", "exit": -9})
        run.append_gpu_out({"uuid": "GPU-1", "reason": "cuInit 999"})
    lines = (tmp_path / "run" / "servers.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"label": "a@tp1", "exit": 0},
        {"label": "b@tp1", "exit": -9},
    ]
    assert json.loads((tmp_path / "run" / "gpus.jsonl").read_text()) == {
        "uuid": "GPU-1",
        "reason": "cuInit 999",
    }
