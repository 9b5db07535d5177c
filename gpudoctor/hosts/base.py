"""The Host protocol: the only door through which checks touch a machine.

A check never calls ``os``, ``subprocess`` or paramiko itself; it asks a Host. So the
same check runs on this machine (:class:`~gpudoctor.hosts.local.LocalHost`), on a
remote host over SSH, or inside a container seen from its host, and tests can feed
it recorded facts.

Errors follow Python's conventions: file operations raise :class:`OSError` with the
real ``errno`` (``FileNotFoundError``, ``PermissionError``, ...) whatever the
transport; :meth:`Host.try_open` and :meth:`Host.run` never raise for a failure of
the thing they try, only :class:`HostError` when the host itself cannot be reached.
"""

from __future__ import annotations

import abc
import base64
import errno as errno_mod
import os
import stat as stat_mod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpudoctor.hosts.byte_stream import ByteStream


class HostError(RuntimeError):
    """The host could not be reached or the transport broke (not a failed operation)."""


@dataclass(frozen=True)
class FileStat:
    """What ``stat PATH`` says of a path (symlinks followed).

    Attributes:
        path: the path asked about.
        kind: ``char``, ``block``, ``dir``, ``file``, ``link``, ``fifo``, ``socket`` or
            ``other`` (:func:`gpudoctor.facts.nodes.a_kind` says it in words).
        mode: permission bits (``0o666``).
        major: device major number (char/block nodes; 0 otherwise).
        minor: device minor number.
        uid: owner uid.
        gid: owner gid.
        size: size in bytes.
        mtime: modification time, seconds since the epoch.
    """

    path: str
    kind: str
    mode: int
    major: int = 0
    minor: int = 0
    uid: int = 0
    gid: int = 0
    size: int = 0
    mtime: float = 0.0

    @property
    def mode_text(self) -> str:
        """Return the permission bits as ``ls -l`` shows them (``rw-rw-rw-``)."""
        return stat_mod.filemode(self.mode)[1:]

    @property
    def world_accessible(self) -> bool:
        """Return True when the mode lets anybody read and write the node (``0o006``)."""
        return self.mode & 0o006 == 0o006


@dataclass(frozen=True)
class OpenResult:
    """The outcome of one ``open(path, flags)`` attempt (the fd is closed at once).

    Attributes:
        path: the path tried.
        flags: ``O_RDWR`` or ``O_RDONLY``: the mode that was tried last.
        errno: 0 on success, else the errno of the failure.
    """

    path: str
    flags: str
    errno: int = 0

    @property
    def ok(self) -> bool:
        """Return True when the open succeeded."""
        return self.errno == 0

    @property
    def errname(self) -> str:
        """Return the errno's symbolic name (``EPERM``), or ``OK``."""
        return errno_mod.errorcode.get(self.errno, str(self.errno)) if self.errno else "OK"


@dataclass(frozen=True)
class CommandResult:
    """The outcome of running one command on a host.

    Attributes:
        argv: the command run.
        returncode: its exit status (127: not found; -N: killed by signal N).
        stdout: its standard output, decoded as UTF-8 with replacement.
        stderr: its standard error, likewise.
        timed_out: True when it was killed at the timeout.
        duration_s: wall time in seconds.
    """

    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Return True when the command exited 0 in time."""
        return self.returncode == 0 and not self.timed_out


@dataclass(frozen=True)
class DiskUsage:
    """What ``df -B1 PATH`` says: sizes in bytes of the filesystem holding a path."""

    total: int
    used: int
    free: int


class Host(abc.ABC):
    """A machine (or container) that checks can read facts from.

    Attributes:
        name: how reports name this target (``local``, ``root@pve1``, ``pve1/ct200``).
        python: the Python interpreter to use for probes on this host.
        has_python: False when the host says it has no ``python`` (a CT served by the
            POSIX-sh agent): the CUDA/NVML probe cannot run there.
        run_opens_session: True when every :meth:`run` pays for a fresh session (an SSH
            exec channel, a namespace entry): a caller with many commands starts one agent
            over :meth:`open_stream` instead.

    Capabilities a transport may add have defaults here (:meth:`connect`,
    :meth:`open_stream`, :meth:`prefetch`), so callers never probe with ``getattr``.
    """

    name: str = "host"
    python: str = "python3"
    has_python: bool = True
    run_opens_session: bool = False

    @abc.abstractmethod
    def read_text(self, path: str, limit: int = 1 << 20) -> str:
        """Return the file's text (``cat PATH``), at most ``limit`` bytes; raise OSError."""

    @abc.abstractmethod
    def stat(self, path: str) -> FileStat:
        """Return ``stat PATH`` (symlinks followed); raise OSError (ENOENT when missing)."""

    @abc.abstractmethod
    def try_open(self, path: str, write: bool = True) -> OpenResult:
        """Open and close ``path`` (O_RDWR when ``write``, else O_RDONLY); never raise."""

    @abc.abstractmethod
    def list_dir(self, path: str) -> list[str]:
        """Return the sorted entry names of a directory (``ls -A PATH``); raise OSError."""

    @abc.abstractmethod
    def disk_usage(self, path: str) -> DiskUsage:
        """Return the usage of the filesystem holding ``path`` (``df -B1``); raise OSError."""

    @abc.abstractmethod
    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        """Run a command, wait at most ``timeout`` seconds, return its result; never raise
        for the command's own failure (a missing program gives returncode 127)."""

    def read_bytes(self, path: str, length: int, offset: int = 0) -> bytes:
        """Return up to ``length`` bytes of a file from ``offset`` (``dd bs=1 skip=O count=L``);
        raise OSError. This default runs a small Python snippet on the host; hosts with direct
        file access override it."""
        code = (
            "import base64,sys\n"
            "try:\n"
            " f=open(sys.argv[1],'rb');f.seek(int(sys.argv[2]));"
            "sys.stdout.write(base64.b64encode(f.read(int(sys.argv[3]))).decode())\n"
            "except OSError as e:\n sys.stderr.write(str(e.errno));sys.exit(3)"
        )
        result = self.run([self.python, "-I", "-S", "-c", code, path, str(offset), str(length)], 30)
        if result.returncode == 3:
            err = int(result.stderr.strip() or errno_mod.EIO)
            raise OSError(err, os.strerror(err), path)
        if not result.ok:
            raise HostError(f"{self.name}: reading {path} failed: {result.stderr.strip()[-200:]}")
        return base64.b64decode(result.stdout)

    def exists(self, path: str) -> bool:
        """Return True when ``stat PATH`` succeeds (``test -e PATH``)."""
        try:
            self.stat(path)
        except OSError:
            return False
        return True

    def connect(self) -> Host:
        """Open the host's connection now (``ssh HOST true``), so an unreachable host fails
        here with one HostError line; return the host. No-op for hosts that need none."""
        return self

    def open_stream(self, argv: Sequence[str]) -> ByteStream:
        """Start ``argv`` on the host and return its pipes (a long-lived process, such as an
        agent or ``pct exec``); raise HostError where this kind of host cannot."""
        raise HostError(f"{self.name}: cannot start a command stream on this kind of host")

    def prefetch(
        self, requests: Sequence[tuple[str, dict[str, Any]]], timeout: float | None = None
    ) -> int:
        """Ask for every ``(op, args)`` ahead, in one round trip, and keep the answers for
        this run; return how many were kept (0 here: nothing is prefetched)."""
        return 0

    def close(self) -> None:
        """Release the host's connections (no-op for hosts without any)."""

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ForwardingHost(Host):
    """A Host whose file operations are another Host's (``self.files``); subclasses
    provide ``run`` (and whatever else they add). SSHHost forwards to its agent, the
    fleet's NodeHost to the node's SSHHost."""

    files: Host

    def read_text(self, path: str, limit: int = 1 << 20) -> str:
        """Return the file's text (``cat PATH``), at most ``limit`` bytes; raise OSError."""
        return self.files.read_text(path, limit)

    def read_bytes(self, path: str, length: int, offset: int = 0) -> bytes:
        """Return up to ``length`` bytes of a file from ``offset``; raise OSError."""
        return self.files.read_bytes(path, length, offset)

    def stat(self, path: str) -> FileStat:
        """Return ``stat PATH`` (symlinks followed); raise OSError."""
        return self.files.stat(path)

    def try_open(self, path: str, write: bool = True) -> OpenResult:
        """Open and close ``path``; never raise for the open itself."""
        return self.files.try_open(path, write)

    def list_dir(self, path: str) -> list[str]:
        """Return the sorted entry names of a directory (``ls -A PATH``)."""
        return self.files.list_dir(path)

    def disk_usage(self, path: str) -> DiskUsage:
        """Return the usage in bytes of the filesystem holding ``path`` (``df -B1``)."""
        return self.files.disk_usage(path)
