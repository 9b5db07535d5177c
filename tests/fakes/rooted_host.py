"""RootedHost: this machine, with every absolute path read under a root directory.

It stands for a container's root filesystem as gpudoctor's agent inside it sees it: a real
directory tree (``ROOT/dev`` with real device nodes made by ``mknod``, ``ROOT/proc/devices``
as a file) on this machine's filesystem. Commands run for real, on this machine; the GPU
probe is the real one, against the fake driver (tests/unit/fake_libcuda.c) on
LD_LIBRARY_PATH, which acts on the tree's real nodes. What cannot exist here is only the
CT's mount namespace, so paths are mapped by hand.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from gpudoctor.hosts.agent import server as ops
from gpudoctor.hosts.base import CommandResult, DiskUsage, FileStat, Host, OpenResult
from gpudoctor.hosts.local import run_local


class RootedHost(Host):
    """A Host whose ``/x`` is ``ROOT/x`` on this machine (commands are not re-rooted)."""

    def __init__(self, root: str, name: str = "rooted") -> None:
        self.root = root
        self.name = name
        self.python = sys.executable

    def inside(self, path: str) -> str:
        """Return the real path on this machine of the host's ``path``."""
        return os.path.join(self.root, path.lstrip("/"))

    def read_text(self, path: str, limit: int = 1 << 20) -> str:
        return ops.op_read_text(self.inside(path), limit)

    def read_bytes(self, path: str, length: int, offset: int = 0) -> bytes:
        with open(self.inside(path), "rb") as fh:
            fh.seek(offset)
            return fh.read(length)

    def stat(self, path: str) -> FileStat:
        return FileStat(**{**ops.op_stat(self.inside(path)), "path": path})

    def try_open(self, path: str, write: bool = True) -> OpenResult:
        return OpenResult(**{**ops.op_try_open(self.inside(path), write), "path": path})

    def list_dir(self, path: str) -> list[str]:
        return ops.op_list_dir(self.inside(path))

    def disk_usage(self, path: str) -> DiskUsage:
        return DiskUsage(**ops.op_disk_usage(self.inside(path)))

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        return run_local(argv, timeout, input)
