"""gpudoctor's own config locks (``/run/gpudoctor/lxc-CT.lock``, the host-prep lock) are
removed when released (issue 34 item 8: one file per target was kept forever), without the
unlink race: a writer that locked a file its holder has just removed sees that the path
no longer names it, and takes the path's new file. Real processes: the CLI, the host
program (apply.write_command's argv) and a holder process."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from pathlib import Path

from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve.apply import Layout, resolve_target, sha1_hex, write_command
from tests.pve.support import fix

CONF = "lxc.uts.name = ct1\n"
HOLDER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
os.unlink(sys.argv[1])  # released as gpudoctor releases it: removed while still held...
print("unlinked", flush=True)
sys.stdin.readline()
os.close(fd)  # ...then let go
"""


def _lxc_tree(tmp_path: Path) -> tuple[Path, Path]:
    lxcpath = tmp_path / "lxc"
    (lxcpath / "ct1").mkdir(parents=True)
    (lxcpath / "ct1" / "config").write_text(CONF)
    return lxcpath, tmp_path / "locks"


def test_fix_leaves_no_lock_file_behind(tmp_path: Path) -> None:
    lxcpath, locks = _lxc_tree(tmp_path)
    env = {"GPUDOCTOR_LOCK_DIR": str(locks), "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "cb"),
           "GPUDOCTOR_HOST_BACKUP_DIR": str(tmp_path / "hb")}  # fmt: skip
    args = ["--flavor", "lxc", "--lxcpath", str(lxcpath), "--ct", "ct1", "--device", "/dev/null"]

    run = fix([*args, "--yes", "--no-restart"], env)

    assert run.returncode == 0, run.stdout + run.stderr
    assert "/dev/null dev/null none bind" in (lxcpath / "ct1" / "config").read_text()
    assert locks.is_dir() and os.listdir(locks) == []  # the directory stays, the file goes


def _opened(pid: int, path: Path) -> bool:
    """Return whether process ``pid`` has ``path`` open (its /proc/PID/fd links)."""
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        try:
            if os.readlink(fd_dir / fd) == str(path):
                return True
        except OSError:
            continue
    return False


def _holder(lock: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _tell(proc: subprocess.Popen[str], answer: str | None) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    if answer is not None:
        assert proc.stdout.readline() == answer


def test_a_writer_that_locked_a_removed_file_takes_the_new_one(tmp_path: Path) -> None:
    """The race: the writer waits on file A; A's holder removes it (still held), a third
    process creates and locks B at the same path, then A is let go. The writer gets A,
    sees the path names B, and waits for B: it never writes while B is held."""
    lxcpath, locks = _lxc_tree(tmp_path)
    locks.mkdir(mode=0o700)
    layout = Layout(lxcpath=str(lxcpath), own_lock_dir=str(locks), python=sys.executable)
    target = resolve_target(LocalHost(), "lxc", "ct1", layout)
    lock = Path(target.lock_path)
    config = lxcpath / "ct1" / "config"
    first = _holder(lock)
    argv = write_command(target, layout, sha1_hex(CONF.encode()), "")
    writer = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdin is not None and writer.stdout is not None
    writer.stdin.write(base64.b64encode(b"lxc.uts.name = ct1\n# new\n").decode())
    writer.stdin.close()
    second = None
    try:
        while not _opened(writer.pid, lock):  # it waits on A
            assert writer.poll() is None, "the writer ended before it opened the lock"
            time.sleep(0.02)
        _tell(first, "unlinked\n")
        second = _holder(lock)  # B, at the same path
        _tell(first, None)  # A let go: the writer gets it, and must see B
        first.wait(timeout=10)
        while not _opened(writer.pid, lock):  # its fd on A reads "(deleted)": now on B
            assert writer.poll() is None, "the writer went on with the removed file"
            time.sleep(0.02)
        assert config.read_text() == CONF  # nothing written while B is held
        _tell(second, "unlinked\n")
        _tell(second, None)
        out = writer.stdout.read()
        writer.wait(timeout=30)
    finally:
        for proc in (first, second, writer):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert writer.returncode == 0, out
    assert config.read_text() == "lxc.uts.name = ct1\n# new\n"
    assert os.listdir(locks) == []
