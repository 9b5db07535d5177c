"""The time left in the progress lines (issue 26.11: "~0 min left" with 3 of 6 cells to go)."""

from __future__ import annotations

import io

from gpudoctor.bench.launch.progress import PlainReporter, eta_text
from gpudoctor.terminal import printable


def test_time_left_comes_from_the_measured_cells_and_reads_in_seconds() -> None:
    reporter = PlainReporter(io.StringIO())
    reporter.begin(6, 0)
    reporter.started -= 600  # preflight and weights took 10 minutes: not a cell's time
    reporter.first_cell = 1000.0
    for concurrency in (1, 2, 4):
        reporter.cell_done("a@tp1", concurrency, "ok")
    assert reporter.eta(now=1010.0) == 10.0  # 3 cells in 10 s, 3 left
    assert eta_text(10.0) == "~10 s" and eta_text(0.2) == "~1 s"
    assert eta_text(125) == "~2 min" and eta_text(2 * 3600 + 300) == "~2 h 05 min"
    assert "~0 min" not in reporter.stream.getvalue()


def test_a_servers_reason_reaches_the_log_with_its_escapes_shown_escaped() -> None:
    """Issue 33.6: a crash reason (a server's last log line) and a note carrying OSC 52,
    a title and a clear-screen sequence were written raw to the terminal."""
    reporter = PlainReporter(io.StringIO())
    reporter.begin(1, 0)
    hostile = "died\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;x\x07\x1b[2J\u2028next"
    reporter.cell_done("a@tp1", 1, "crashed", hostile)
    reporter.note(hostile)
    out = reporter.stream.getvalue()
    assert not any(c in out for c in "\x1b\x07\u2028"), repr(out)
    assert out.count(printable(hostile)) == 2
