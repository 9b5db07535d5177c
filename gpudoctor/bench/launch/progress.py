"""Campaign progress on stderr: a rich display on a terminal, plain lines otherwise.

Both reporters take the same calls from the launcher: ``begin`` (cells total / already
done), ``config`` (a server is starting), ``cell_start``, ``requests`` (done/total of
the current cell), ``cell_done`` (status and reason), ``note`` (a line of text), ``end``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from gpudoctor.terminal import printable


def eta_text(seconds: float) -> str:
    """Return a time left in words: ``~12 s`` below a minute (never ``~0 min``), ``~3 min``
    below 90 minutes, else ``~2 h 05 min``."""
    if seconds < 59.5:
        return f"~{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"~{round(seconds / 60)} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"~{hours} h {minutes:02d} min"


class PlainReporter:
    """One line per event, for logs and pipes (``gpudoctor bench ... 2>campaign.log``)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total = self.done = self.ok = self.crashed = self.skipped = self.failed = 0
        self.client_bound = 0  # measured, but no result: the client did not hold its schedule
        self.started = time.monotonic()
        self.first_cell: float | None = None  # when this launch's first cell started
        self._lock = threading.Lock()

    def _line(self, text: str) -> None:
        with self._lock:
            self.stream.write(
                printable(text) + "\n"
            )  # a server's reason: no escape reaches the tty
            self.stream.flush()

    def _counts(self) -> str:
        eta = self.eta()
        tail = f", {eta_text(eta)} left" if eta is not None else ""
        return (
            f"[{self.done}/{self.total} done: {self.ok} ok, {self._bound(', ')}{self.failed} failed,"
            f" {self.crashed} "
            f"crashed, {self.skipped} skipped; {time.monotonic() - self.started:.0f} s{tail}]"
        )

    def _bound(self, sep: str) -> str:
        """Return the client-bound count and ``sep``, or "" while there is none."""
        return f"{self.client_bound} client-bound{sep}" if self.client_bound else ""

    def eta(self, now: float | None = None) -> float | None:
        """Return the estimated seconds left: the mean wall time of the cells measured in
        this launch (from its first cell's start, servers' start-ups included; preflight
        and weights excluded) x the cells left; None before a cell was measured."""
        measured = self.ok + self.client_bound + self.failed + self.crashed
        if not measured or self.done >= self.total or self.first_cell is None:
            return None
        now = time.monotonic() if now is None else now
        return (now - self.first_cell) / measured * (self.total - self.done)

    def begin(self, total: int, already_done: int) -> None:
        """Start the display for ``total`` cells of which ``already_done`` are finished."""
        self.total, self.done = total, already_done
        self._line(f"bench: {total} cells, {already_done} already done")

    def _first_cell(self) -> None:
        if self.first_cell is None:
            self.first_cell = time.monotonic()

    def config(self, label: str, text: str) -> None:
        """Announce a configuration step (``starting server``, ``ready in 9.1 s``)."""
        self._first_cell()  # the first server's start-up is part of the cells' time
        self._line(f"bench: {label}: {text}")

    def cell_start(self, label: str, concurrency: int) -> None:
        """Announce that a cell starts."""
        self._first_cell()
        self._line(f"bench: {label} concurrency {concurrency}: measuring")

    def requests(self, done: int, total: int) -> None:
        """Report request progress inside the current cell (plain mode: silent)."""

    def cell_done(self, label: str, concurrency: int, status: str, reason: str = "") -> None:
        """Count a finished cell and print its verdict; ``status`` is the record's, or
        ``client-bound`` for an ok record the load generator limited (no result: exit 3)."""
        self.done += 1
        if status == "ok":
            self.ok += 1
        elif status == "client-bound":
            self.client_bound += 1
        elif status == "failed":
            self.failed += 1
        elif status == "crashed":
            self.crashed += 1
        else:
            self.skipped += 1
        why = f" ({reason})" if reason else ""
        shown = {"failed": "FAILED", "client-bound": "no result"}.get(status, status)
        self._line(f"bench: {label} concurrency {concurrency}: {shown}{why} {self._counts()}")

    def note(self, text: str) -> None:
        """Print one line of information."""
        self._line(f"bench: {text}")

    def end(self) -> None:
        """Close the display."""
        self._line(f"bench: finished {self._counts()}")


class RichReporter(PlainReporter):
    """A live rich progress bar (cells) plus a line for the current cell's requests."""

    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.cells = self.progress.add_task("cells", total=1, counts="")
        self.current = self.progress.add_task("", total=1, counts="", visible=False)

    def _line(self, text: str) -> None:
        self.console.print(printable(text), highlight=False, markup=False)

    def _refresh(self) -> None:
        counts = (
            f"{self.ok} ok · {self._bound(' · ')}{self.failed} failed"
            f" · {self.crashed} crashed · {self.skipped} skipped"
        )
        self.progress.update(self.cells, total=self.total, completed=self.done, counts=counts)

    def begin(self, total: int, already_done: int) -> None:
        """Start the live display."""
        self.progress.start()
        super().begin(total, already_done)
        self._refresh()

    def cell_start(self, label: str, concurrency: int) -> None:
        """Show the current cell as the second bar."""
        self.progress.update(
            self.current,
            description=printable(f"{label} c={concurrency}"),
            completed=0,
            total=1,
            visible=True,
            counts="requests",
        )

    def requests(self, done: int, total: int) -> None:
        """Advance the current cell's request bar."""
        self.progress.update(self.current, completed=done, total=max(total, 1))

    def cell_done(self, label: str, concurrency: int, status: str, reason: str = "") -> None:
        """Count the cell and refresh the bars."""
        super().cell_done(label, concurrency, status, reason)
        self.progress.update(self.current, visible=False)
        self._refresh()

    def end(self) -> None:
        """Stop the live display and print the final counts."""
        self._refresh()
        self.progress.stop()
        super().end()


def make_reporter(quiet_rich: bool = False) -> PlainReporter:
    """Return a RichReporter when stderr is a terminal, else a PlainReporter."""
    from gpudoctor.terminal import live

    if live(sys.stderr) and not quiet_rich:
        return RichReporter()
    return PlainReporter()
