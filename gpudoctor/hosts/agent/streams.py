"""Byte streams to an agent process: its stdin/stdout pipes and its stderr.

:class:`~gpudoctor.hosts.byte_stream.ByteStream` is what the agent clients
(:mod:`gpudoctor.hosts.agent.client`, :mod:`gpudoctor.hosts.agent.shell`) talk through;
:class:`ProcessStream` is a local subprocess (``lxc-attach ...``, ``python3 -I -c ...``); the SSH exec channel's is
:class:`gpudoctor.hosts.ssh.host.ChannelStream`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Sequence

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.byte_stream import ByteStream


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
            if isinstance(exc, FileNotFoundError) and self.argv[0] == "pct":
                raise HostError(  # issue 47: check said only "No such file or directory"
                    "cannot start pct: this machine has no pct, it is not a Proxmox VE node;"
                    " for a plain LXC container add --flavor lxc"
                ) from exc
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
