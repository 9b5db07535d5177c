"""A weights Progress that remembers what it was told (gpudoctor's own Progress is
silent): the bytes per file and the files done, thread-safe, as the copier's, the
verifier's and the Hub download's worker threads report them."""

from __future__ import annotations

import threading

from gpudoctor.weights.progress import Progress


class Recorder(Progress):
    """A Progress that remembers what it was told (the base class is silent)."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self.done: list[str] = []
        self.lock = threading.Lock()

    def advance(self, path: str, nbytes: int) -> None:
        with self.lock:
            self.bytes[path] = self.bytes.get(path, 0) + nbytes

    def file_done(self, path: str) -> None:
        with self.lock:
            self.done.append(path)
