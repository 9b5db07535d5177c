"""Byte streams to an agent process: its stdin/stdout pipes and its stderr.

:class:`ByteStream` is what the agent clients (:mod:`gpudoctor.hosts.agent.client`,
:mod:`gpudoctor.hosts.agent.shell`) talk through; :class:`ProcessStream` is a local
subprocess (``lxc-attach ...``, ``python3 -I -c ...``); the SSH exec channel's is
:class:`gpudoctor.hosts.ssh.host.ChannelStream`.
"""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Sequence

from gpudoctor.hosts.base import HostError


class ByteStream(abc.ABC):
    """Two pipes to a process: write requests, read reply lines, read its stderr."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """Write and flush ``data``; raise OSError (or similar) when the stream broke."""

    @abc.abstractmethod
    def readline(self, limit: int) -> bytes:
        """Return the next line (with its newline), at most ``limit`` bytes (a longer line
        comes back cut, without newline), or ``b""`` at EOF."""

    def read_some(self, limit: int) -> bytes:
        """Return what is available now (at least one byte, at most ``limit``; blocks until
        then), or ``b""`` at EOF. Default: one line."""
        return self.readline(limit)

    @abc.abstractmethod
    def stderr_text(self) -> str:
        """Return what the process wrote on stderr so far (best effort, for errors)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the pipes and end the process."""

    def abort(self) -> None:
        """End the process NOW (it overran a deadline or sent too much), close the pipes."""
        self.close()


class ProcessStream(ByteStream):
    """A local subprocess's stdin/stdout (``argv`` is run, e.g. ``lxc-attach ...``)."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise HostError(f"cannot start {self.argv[0]}: {exc.strerror}") from exc
        self._stderr = bytearray()
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            for chunk in iter(lambda: self.proc.stderr.read1(4096), b""):  # type: ignore[union-attr]
                if len(self._stderr) < 65536:
                    self._stderr += chunk
        except (ValueError, OSError):  # close() closed the pipe: nothing more to keep
            return

    def write(self, data: bytes) -> None:
        """Write and flush ``data`` to the process's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def readline(self, limit: int) -> bytes:
        """Return the next line of the process's stdout, at most ``limit`` bytes (``b""``
        at EOF)."""
        assert self.proc.stdout is not None
        return self.proc.stdout.readline(limit)

    def read_some(self, limit: int) -> bytes:
        """Return up to ``limit`` bytes of stdout as they come (``b""`` at EOF)."""
        assert self.proc.stdout is not None
        return self.proc.stdout.read1(limit)

    def stderr_text(self) -> str:
        """Return the process's stderr so far (after a short wait if it has exited)."""
        if self.proc.poll() is not None:
            self._stderr_thread.join(1.0)
        return self._stderr.decode("utf-8", "replace")

    def close(self) -> None:
        """Close stdin (the agent exits at EOF), then make sure the process is gone."""
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(2)  # a real agent exits at once on EOF
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stderr_thread.join(1.0)  # it ends at EOF; never close the pipe under it
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe:
                pipe.close()

    def abort(self) -> None:
        """SIGKILL the process's whole group (it runs in its own session), then close."""
        if self.proc.returncode is None:  # not reaped yet: the pid is still ours
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.close()
