"""LocalHost: the machine gpudoctor runs on (in-process file access, real subprocesses)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

from gpudoctor.hosts.base import CommandResult, DiskUsage, FileStat, Host, OpenResult, kind_of


class LocalHost(Host):
    """This machine. File operations are direct system calls; commands are subprocesses."""

    def __init__(self, name: str = "local", python: str | None = None) -> None:
        self.name = name
        self.python = python or sys.executable

    def read_text(self, path: str, limit: int = 1 << 20) -> str:
        """Return the file's text (``cat PATH``), at most ``limit`` bytes; raise OSError."""
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")

    def read_bytes(self, path: str, length: int, offset: int = 0) -> bytes:
        """Return up to ``length`` bytes of a file from ``offset``; raise OSError."""
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(length)

    def stat(self, path: str) -> FileStat:
        """Return ``stat PATH`` (symlinks followed); raise OSError."""
        return stat_path(path)

    def try_open(self, path: str, write: bool = True) -> OpenResult:
        """Open and close ``path`` (``O_RDWR`` or ``O_RDONLY``, non-blocking); never raise."""
        return try_open_path(path, write)

    def list_dir(self, path: str) -> list[str]:
        """Return the sorted entry names of a directory (``ls -A PATH``); raise OSError."""
        return sorted(os.listdir(path))

    def disk_usage(self, path: str) -> DiskUsage:
        """Return the usage of the filesystem holding ``path`` (``df -B1 PATH``)."""
        usage = shutil.disk_usage(path)
        return DiskUsage(total=usage.total, used=usage.used, free=usage.free)

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        """Run ``argv`` as a subprocess in its own session; kill its group at ``timeout``."""
        return run_local(argv, timeout, input)


def stat_path(path: str) -> FileStat:
    """Return a :class:`FileStat` for ``path`` from ``os.stat`` (raises OSError)."""
    st = os.stat(path)
    kind = kind_of(st.st_mode)
    rdev = st.st_rdev if kind in ("char", "block") else 0
    return FileStat(
        path=path,
        kind=kind,
        mode=st.st_mode & 0o7777,
        major=os.major(rdev),
        minor=os.minor(rdev),
        uid=st.st_uid,
        gid=st.st_gid,
        size=st.st_size,
        mtime=st.st_mtime,
    )


def try_open_path(path: str, write: bool = True) -> OpenResult:
    """Try ``open(path, O_RDWR|O_NONBLOCK)`` (or O_RDONLY), close it, return the errno."""
    flags = os.O_RDWR if write else os.O_RDONLY
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        return OpenResult(path, "O_RDWR" if write else "O_RDONLY", exc.errno or -1)
    os.close(fd)
    return OpenResult(path, "O_RDWR" if write else "O_RDONLY", 0)


def run_local(argv: Sequence[str], timeout: float, input: str | None = None) -> CommandResult:
    """Run a local command with a hard timeout (the whole process group is killed)."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return CommandResult(tuple(argv), 127, "", f"{argv[0]}: {exc.strerror}", False, 0.0)
    try:
        out, err = proc.communicate(input.encode() if input is not None else None, timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        timed_out = True
    return CommandResult(
        argv=tuple(argv),
        returncode=proc.returncode,
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a child started with ``start_new_session=True`` and its whole group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
