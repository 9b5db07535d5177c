"""Fault injection: kill -9 the config writer at many points; the config must always be
exactly the old or exactly the new bytes, never partial, and the lock must be free after.

The writer is the real host command (``flock ... python3 -I -c HOST_PROGRAM write ...``)
that ``compare_and_swap`` runs, started on this machine against a real file laid out as
in /etc/pve. Kill times are spread evenly from 0 to past the writer's full run time.
"""

from __future__ import annotations

import base64
import os
import signal
import statistics
import subprocess
import time

import pytest

from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve.apply import compare_and_swap, resolve_target, sha1_hex, write_command
from tests.fakes.pvetree import PveTree

RUNS = 120


def big_config(tag: str) -> bytes:
    """Return a ~900 KB config (near pmxcfs's 1 MiB limit) so the write takes a while."""
    line = f"lxc.mount.entry: /dev/{tag}%05d dev/{tag}%05d none bind,optional,create=file\n"
    return ("arch: amd64\n" + "".join(line % (i, i) for i in range(11000))).encode()[:900_000]


@pytest.mark.slow
def test_kill_9_at_many_points_leaves_old_or_new_bytes(tmp_path) -> None:
    tree = PveTree(tmp_path)
    old, new = big_config("old"), big_config("new")
    path = tree.add_ct("200", old.decode())
    host, layout = LocalHost(), tree.layout(python="/usr/bin/python3")
    target = resolve_target(host, "pve", "200", layout)
    tree.lock_dir.mkdir(parents=True, exist_ok=True)
    payload = base64.b64encode(new)

    def start(backup: str) -> subprocess.Popen[bytes]:
        argv = write_command(target, layout, sha1_hex(old), backup)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        assert proc.stdin is not None
        proc.stdin.write(payload)
        proc.stdin.close()
        return proc

    durations = []
    for i in range(5):  # how long an uninterrupted write takes here
        path.write_bytes(old)
        began = time.monotonic()
        assert start(f"{tree.backup_dir}/full{i}.conf").wait() == 0
        durations.append(time.monotonic() - began)
        assert path.read_bytes() == new
    full = statistics.median(durations)

    outcomes = {"old": 0, "new": 0}
    for i in range(RUNS):
        path.write_bytes(old)
        proc = start(f"{tree.backup_dir}/run{i}.conf")
        time.sleep(full * 1.2 * i / RUNS)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        data = path.read_bytes()
        assert data in (old, new), f"run {i}: partial config ({len(data)} bytes)"
        outcomes["old" if data == old else "new"] += 1
        # the lock dies with the writer (once the kernel has reaped it): the next one gets it
        assert subprocess.run(["flock", "-w", "10", target.lock_path, "true"]).returncode == 0

    assert outcomes["old"] > 0 and outcomes["new"] > 0, outcomes  # kills landed on both sides
    # a later complete write clears the temp files the killed writers left behind
    path.write_bytes(old)
    compare_and_swap(host, target, layout, sha1_hex(old), new)
    assert path.read_bytes() == new
    assert not list(path.parent.glob("200.conf.tmp.*"))
    finished = [b for b in tree.backups() if b.suffix == ".conf"]
    assert len(finished) >= 5
    for backup in finished:  # a backup is complete or absent (``.part`` + rename)
        assert backup.read_bytes() == old
    print(f"kill -9 outcomes over {RUNS} runs: {outcomes}; full write {full * 1000:.0f} ms")


def test_a_read_back_that_differs_puts_the_old_bytes_back(tmp_path) -> None:
    """Fault injected at the read-back (tests/fakes/faulty_python.py: the file is mangled
    between the rename and the verification read): the writer restores the old bytes,
    the caller gets a ``verify`` error saying nothing changed, the host backup is whole."""
    from pathlib import Path

    from gpudoctor.pve.apply import ApplyError

    tree = PveTree(tmp_path)
    old = b"arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
    path = tree.add_ct("200", old.decode())
    faulty = str(Path(__file__).resolve().parents[1] / "fakes" / "faulty_python.py")
    host, layout = LocalHost(), tree.layout(python=faulty)
    target = resolve_target(host, "pve", "200", layout)
    backup = f"{tree.backup_dir}/ct-200/x.conf"
    new = old + b"lxc.cgroup2.devices.allow: c 238:* rwm\n"
    with pytest.raises(ApplyError, match="old bytes were put back") as info:
        compare_and_swap(host, target, layout, sha1_hex(old), new, backup)
    assert info.value.code == "verify"
    assert path.read_bytes() == old
    assert Path(backup).read_bytes() == old
    assert not list(path.parent.glob("200.conf.tmp.*"))
