"""Byte progress for copy, download and verify: rich bars on a tty, plain lines otherwise.

All reporters share one small interface (:class:`Progress`) and are thread-safe: worker
threads call :meth:`Progress.advance` as bytes move. Output goes to stderr; stdout is
kept for the result (``--json``).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO


def human_bytes(n: float) -> str:
    """Return ``n`` bytes as a short decimal string (``1.5 GB``, ``320 MB``, ``12 B``)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


class Progress:
    """Silent reporter; the base of the others.

    Use as ``with reporter.phase("download", files): ... advance(path, n) ...``.
    """

    def phase(self, name: str, files: dict[str, int]) -> Progress:
        """Start a phase that moves ``files`` ({path: bytes}); return self (a context manager)."""
        self._name = name
        return self

    def advance(self, path: str, nbytes: int) -> None:
        """Record ``nbytes`` more bytes done for ``path`` (negative rolls back)."""

    def file_done(self, path: str) -> None:
        """Record that ``path`` is finished."""

    def message(self, text: str) -> None:
        """Show one informational line."""

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the current phase."""


class PlainProgress(Progress):
    """Plain lines on a stream: one per finished file and a total every ``interval_s``."""

    def __init__(self, stream: TextIO | None = None, interval_s: float = 5.0) -> None:
        self._stream = stream or sys.stderr
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._name = ""
        self._total = 0
        self._done = 0
        self._files_total = 0
        self._files_done = 0
        self._started = 0.0
        self._last_line = 0.0

    def _line(self, text: str) -> None:
        print(text, file=self._stream, flush=True)

    def phase(self, name: str, files: dict[str, int]) -> Progress:
        """Start a phase; prints ``NAME: N files, SIZE``."""
        with self._lock:
            self._name, self._total, self._done = name, sum(files.values()), 0
            self._files_total, self._files_done = len(files), 0
            self._started = self._last_line = time.monotonic()
        self._line(f"{name}: {len(files)} files, {human_bytes(self._total)}")
        return self

    def advance(self, path: str, nbytes: int) -> None:
        """Count bytes; print a total line at most every ``interval_s``."""
        with self._lock:
            self._done += nbytes
            now = time.monotonic()
            if now - self._last_line < self._interval_s:
                return
            self._last_line = now
            text = self._summary(now)
        self._line(text)

    def _summary(self, now: float) -> str:
        rate = self._done / max(now - self._started, 1e-9)
        return (
            f"{self._name}: {human_bytes(self._done)} / {human_bytes(self._total)}, "
            f"{self._files_done}/{self._files_total} files, {human_bytes(rate)}/s"
        )

    def file_done(self, path: str) -> None:
        """Print ``NAME: done PATH``."""
        with self._lock:
            self._files_done += 1
        self._line(f"{self._name}: done {path}")

    def message(self, text: str) -> None:
        """Print ``text``."""
        self._line(text)

    def close(self) -> None:
        """Print the phase's final total line."""
        if self._name:
            with self._lock:
                text = self._summary(time.monotonic())
                self._name = ""
            self._line(text)


class RichProgress(Progress):
    """rich bars on stderr: one overall byte bar plus one bar per file in flight."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.progress import Progress as RichBars

        self._console = Console(stderr=True)
        self._bars = RichBars(
            TextColumn("{task.description}", justify="left"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self._console,
            transient=False,
        )
        self._lock = threading.Lock()
        self._overall: int | None = None
        self._per_file: dict[str, int] = {}
        self._sizes: dict[str, int] = {}

    def phase(self, name: str, files: dict[str, int]) -> Progress:
        """Start a phase: show the overall bar (per-file bars appear as files start)."""
        with self._lock:
            self._sizes = dict(files)
            self._per_file = {}
            self._bars.start()
            self._overall = self._bars.add_task(
                f"{name} ({len(files)} files)", total=sum(files.values())
            )
        return self

    def advance(self, path: str, nbytes: int) -> None:
        """Advance the overall bar and ``path``'s own bar."""
        with self._lock:
            if self._overall is None:
                return
            task = self._per_file.get(path)
            if task is None:
                task = self._bars.add_task(f"  {path}", total=self._sizes.get(path))
                self._per_file[path] = task
            self._bars.advance(task, nbytes)
            self._bars.advance(self._overall, nbytes)

    def file_done(self, path: str) -> None:
        """Remove ``path``'s bar (the overall bar keeps its bytes)."""
        with self._lock:
            task = self._per_file.pop(path, None)
            if task is not None:
                self._bars.remove_task(task)

    def message(self, text: str) -> None:
        """Print ``text`` above the bars."""
        self._console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        """Stop the bars."""
        with self._lock:
            if self._overall is not None:
                self._bars.stop()
                for task in list(self._bars.task_ids):
                    self._bars.remove_task(task)
                self._overall = None


def make_progress(quiet: bool = False) -> Progress:
    """Return rich bars when stderr is a tty, plain lines otherwise, nothing when ``quiet``."""
    if quiet:
        return Progress()
    from gpudoctor.terminal import live

    if live(sys.stderr):
        return RichProgress()
    return PlainProgress()
