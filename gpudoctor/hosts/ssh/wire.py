"""A strict reader of SSH wire encoding (RFC 4251 section 5: ``byte``, ``uint32``,
``uint64``, ``string``, ``mpint``) for files gpudoctor must not misread: a short or
trailing field raises :class:`WireError` (paramiko's Message pads short reads with
zeros, which is right for a packet and wrong for a revocation list)."""

from __future__ import annotations

import struct


class WireError(ValueError):
    """The bytes are not what the format says (truncated, trailing data, bad length)."""


class Reader:
    """Read SSH wire fields from ``data`` in order; every read checks the length."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def remaining(self) -> int:
        """Return how many bytes are left unread."""
        return len(self.data) - self.pos

    def take(self, count: int) -> bytes:
        """Return the next ``count`` raw bytes (WireError when fewer are left)."""
        if count < 0 or self.remaining() < count:
            raise WireError(f"truncated: {count} bytes wanted, {self.remaining()} left")
        chunk = self.data[self.pos : self.pos + count]
        self.pos += count
        return chunk

    def byte(self) -> int:
        """Return the next ``byte`` (0..255)."""
        return self.take(1)[0]

    def uint32(self) -> int:
        """Return the next big-endian ``uint32``."""
        return int(struct.unpack(">I", self.take(4))[0])

    def uint64(self) -> int:
        """Return the next big-endian ``uint64``."""
        return int(struct.unpack(">Q", self.take(8))[0])

    def string(self) -> bytes:
        """Return the next ``string`` (uint32 length, then that many bytes)."""
        return self.take(self.uint32())

    def text(self) -> str:
        """Return the next ``string`` as UTF-8 text (WireError when it is not)."""
        raw = self.string()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireError(f"a text field is not UTF-8: {exc}") from None

    def cstring(self) -> str:
        """Return the next ``string`` as text the way OpenSSH's ``sshbuf_get_cstring`` reads
        it: a NUL inside raises WireError; bytes that are not UTF-8 are kept (as
        ``surrogateescape`` code points, equal only to themselves), never refused."""
        raw = self.string()
        if b"\0" in raw:
            raise WireError("a NUL byte inside a text field")
        return raw.decode("utf-8", "surrogateescape")

    def end(self, what: str) -> None:
        """Raise WireError when bytes are left after ``what`` was read."""
        if self.remaining():
            raise WireError(f"{self.remaining()} bytes of unparsed data after {what}")


def string(data: bytes) -> bytes:
    """Return ``data`` encoded as an SSH ``string`` (uint32 length + bytes)."""
    return struct.pack(">I", len(data)) + data
