"""The pipes of a long-lived process on a host (an agent, ``pct exec``): the type
:meth:`gpudoctor.hosts.base.Host.open_stream` returns, declared here, below both the Host
base class and the streams that implement it (:mod:`gpudoctor.hosts.agent.streams`'s
``ProcessStream``, :mod:`gpudoctor.hosts.ssh.host`'s ``ChannelStream``)."""

from __future__ import annotations

import abc


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
