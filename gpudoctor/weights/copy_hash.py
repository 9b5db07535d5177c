"""The sha256 of a file while the copier writes it (issue 34.4: a restore proves the
bytes it wrote).

The copier writes a file's chunks in parallel and in any order. :class:`FrontierHash`
follows the write frontier: when a chunk is in, a drain hashes the part of the file that
has just become contiguous from the start (read back from the destination, ``pread``),
unless a drain of that file is already running (it picks the chunk up before it lets
go). Drains run on their own threads, one per file at most, beside the copy threads
(``hashlib`` releases the GIL), so the copy keeps every read in flight that it had
without hashing. Equivalent shell: ``cp SRC DST && sha256sum DST``.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

READ_BYTES = 8 << 20


class FrontierHash:
    """The running sha256 of one destination file being written in chunks."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self._digest = hashlib.sha256()
        self._lock = threading.Lock()
        self._finished: dict[int, int] = {}
        self._hashed = 0
        self._busy = False
        self._reported = False

    def chunk_done(self, offset: int, length: int) -> bool:
        """Record that bytes ``[offset, offset + length)`` are written; return True when the
        caller must schedule :meth:`drain` (no drain is running for this file now)."""
        with self._lock:
            self._finished[offset] = length
            if self._busy:
                return False  # the running drain takes this chunk before it lets go
            self._busy = True
            return True

    def drain(self) -> bool:
        """Hash every byte that is contiguous from the start; return True exactly once, to
        the drain that hashed the file's last byte."""
        while True:
            with self._lock:
                start = end = self._hashed
                while (length := self._finished.pop(end, None)) is not None:
                    end += length
                if end == start:
                    self._busy = False
                    done = self._hashed == self.size and not self._reported
                    self._reported = self._reported or done
                    return done
            self._hash_range(start, end)
            with self._lock:
                self._hashed = end

    def _hash_range(self, start: int, end: int) -> None:
        buffer = bytearray(min(READ_BYTES, end - start))
        view = memoryview(buffer)
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            while start < end:
                n = os.preadv(fd, [view[: min(len(buffer), end - start)]], start)
                if n == 0:
                    raise OSError(f"{self.path} ended at byte {start} while hashing")
                self._digest.update(view[:n])
                start += n
        finally:
            os.close(fd)

    def hexdigest(self) -> str:
        """Return the hex sha256 of the whole file (once :meth:`chunk_done` returned True)."""
        return self._digest.hexdigest()
