"""LocalHost: the machine gpudoctor runs on (in-process file access, real subprocesses).

Each operation is the agent's own (:mod:`gpudoctor.hosts.agent.server`), called in-process: the
same code answers here, over SSH and inside a container.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpudoctor.hosts.agent import server as ops
from gpudoctor.hosts.base import CommandResult, DiskUsage, FileStat, Host, OpenResult

if TYPE_CHECKING:
    from gpudoctor.hosts.agent.streams import ProcessStream


class LocalHost(Host):
    """This machine. File operations are direct system calls; commands are subprocesses."""

    def __init__(self, name: str = "local", python: str | None = None) -> None:
        self.name = name
        self.python = python or sys.executable

    def read_text(self, path: str, limit: int = 1 << 20) -> str:
        """Return the file's text (``cat PATH``), at most ``limit`` bytes; raise OSError."""
        return ops.op_read_text(path, limit)

    def read_bytes(self, path: str, length: int, offset: int = 0) -> bytes:
        """Return up to ``length`` bytes of a file from ``offset``; raise OSError."""
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(length)

    def stat(self, path: str) -> FileStat:
        """Return ``stat PATH`` (symlinks followed); raise OSError."""
        return FileStat(**ops.op_stat(path))

    def try_open(self, path: str, write: bool = True) -> OpenResult:
        """Open and close ``path`` (``O_RDWR`` or ``O_RDONLY``, non-blocking); never raise."""
        return OpenResult(**ops.op_try_open(path, write))

    def list_dir(self, path: str) -> list[str]:
        """Return the sorted entry names of a directory (``ls -A PATH``); raise OSError."""
        return ops.op_list_dir(path)

    def disk_usage(self, path: str) -> DiskUsage:
        """Return the usage of the filesystem holding ``path`` (``df -B1 PATH``)."""
        return DiskUsage(**ops.op_disk_usage(path))

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        """Run ``argv`` as a subprocess in its own session; kill its group at ``timeout``."""
        return run_local(argv, timeout, input)

    def open_stream(self, argv: Sequence[str]) -> ProcessStream:
        """Start ``argv`` as a local subprocess and return its pipes."""
        from gpudoctor.hosts.agent.streams import ProcessStream

        return ProcessStream(argv)


def run_local(argv: Sequence[str], timeout: float, input: str | None = None) -> CommandResult:
    """Run a local command with a hard timeout (the whole process group is SIGKILLed);
    returncode 127 when the program is missing."""
    result = ops.op_run(list(argv), timeout, input)
    return CommandResult(**{**result, "argv": tuple(result["argv"])})
