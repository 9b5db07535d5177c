"""The time left in the progress lines (issue 26.11: "~0 min left" with 3 of 6 cells to go)."""

from __future__ import annotations

import io
import os
import re
import sys
from types import SimpleNamespace

import pytest

from gpudoctor.bench.launch import progress
from gpudoctor.bench.launch.progress import PlainReporter, eta_text, make_reporter
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


def test_time_left_in_words_at_each_unit_boundary() -> None:
    assert eta_text(59.4) == "~59 s" and eta_text(59.5) == "~1 min"
    assert eta_text(89 * 60 + 29) == "~89 min" and eta_text(90 * 60) == "~1 h 30 min"
    assert eta_text(0) == "~1 s"


def test_no_time_left_is_guessed_before_a_cell_or_after_the_last() -> None:
    reporter = PlainReporter(io.StringIO())
    reporter.begin(2, 0)
    assert reporter.eta(now=5.0) is None  # nothing measured
    reporter.cell_done("a@tp1", 1, "skipped", "needs 2 GPU(s)")
    assert reporter.eta(now=5.0) is None  # a skipped cell is no measurement
    reporter.cell_start("a@tp1", 2)
    reporter.cell_done("a@tp1", 2, "ok")
    assert reporter.done == reporter.total and reporter.eta() is None  # all done
    reporter = PlainReporter(io.StringIO())
    reporter.begin(3, 0)
    reporter.first_cell = 100.0
    reporter.cell_done("a@tp1", 1, "failed", "2 of 4 requests failed")
    assert reporter.eta(now=130.0) == 60.0  # a failed cell was measured: 30 s, 2 left
    reporter.cell_done("a@tp1", 2, "crashed", "server exited 1")
    assert reporter.eta(now=130.0) == 15.0


def test_each_event_is_one_line_with_the_running_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]  # the reporter's monotonic clock, set by the test
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    reporter = PlainReporter(io.StringIO())
    reporter.begin(5, 1)
    clock[0] = 1010.0  # preflight took 10 s
    reporter.config("a@tp1", "starting server")
    clock[0] = 1030.0
    reporter.cell_start("a@tp1", 2)  # the first cell's time starts with its server's start-up
    reporter.requests(3, 4)
    clock[0] = 1050.0
    reporter.cell_done("a@tp1", 2, "ok")
    reporter.cell_done("a@tp1", 4, "failed", "3 of 4 requests failed")
    reporter.cell_done("a@tp1", 8, "crashed", "server exited 1")
    reporter.cell_done("b@tp2", 1, "skipped")
    reporter.note("GPU 1 out of the pool")
    reporter.end()
    assert reporter.stream.getvalue().splitlines() == [
        "bench: 5 cells, 1 already done",
        "bench: a@tp1: starting server",
        "bench: a@tp1 concurrency 2: measuring",
        "bench: a@tp1 concurrency 2: ok [2/5 done: 1 ok, 0 failed, 0 crashed, 0 skipped; 50 s, ~2 min left]",
        "bench: a@tp1 concurrency 4: FAILED (3 of 4 requests failed) "
        "[3/5 done: 1 ok, 1 failed, 0 crashed, 0 skipped; 50 s, ~40 s left]",
        "bench: a@tp1 concurrency 8: crashed (server exited 1) "
        "[4/5 done: 1 ok, 1 failed, 1 crashed, 0 skipped; 50 s, ~13 s left]",
        "bench: b@tp2 concurrency 1: skipped [5/5 done: 1 ok, 1 failed, 1 crashed, 1 skipped; 50 s]",
        "bench: GPU 1 out of the pool",
        "bench: finished [5/5 done: 1 ok, 1 failed, 1 crashed, 1 skipped; 50 s]",
    ]


def test_every_kind_of_finished_cell_is_counted_each_time() -> None:
    reporter = PlainReporter(io.StringIO())
    reporter.begin(8, 0)
    for status in ("failed", "crashed", "skipped", "not-run", "failed", "crashed", "skipped", "ok"):
        reporter.cell_done("a@tp1", 1, status)
    assert (reporter.ok, reporter.failed, reporter.crashed, reporter.skipped) == (1, 2, 2, 3)
    assert reporter.done == 8


def test_a_terminal_gets_the_live_display_and_a_pipe_plain_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert type(make_reporter()) is PlainReporter  # pytest's stderr is no terminal
    master, replica = os.openpty()  # a real terminal (a pseudo-terminal) as stderr
    with os.fdopen(replica, "w") as tty:
        monkeypatch.setattr(sys, "stderr", tty)
        monkeypatch.delenv("NO_COLOR", raising=False)
        monkeypatch.setenv("TERM", "xterm")
        assert type(make_reporter()) is progress.RichReporter
        assert type(make_reporter(quiet_rich=True)) is PlainReporter
    os.close(master)


def test_the_terminal_display_shows_the_cells_and_the_current_cells_requests(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rich display's two bars, read from its progress model and from the final frame
    it leaves on stderr (not a terminal here: the frame is printed once, when it stops)."""
    monkeypatch.setenv("COLUMNS", "200")
    reporter = progress.RichReporter()
    reporter.begin(5, 1)
    cells, current = reporter.progress.tasks
    assert (cells.total, cells.completed) == (5, 1)
    assert cells.fields["counts"] == "0 ok · 0 failed · 0 crashed · 0 skipped"
    assert not current.visible
    reporter.cell_start("[red]a[/red]@tp1\x1b[2J", 8)
    assert current.visible and current.description == "[red]a[/red]@tp1\\x1b[2J c=8"
    assert (current.completed, current.total, current.fields["counts"]) == (0, 1, "requests")
    reporter.requests(3, 16)
    assert (current.completed, current.total) == (3, 16)
    reporter.requests(0, 0)  # a cell of no request yet: never a bar of 0
    assert current.total == 1
    reporter.requests(16, 16)
    reporter.cell_done("[red]a[/red]@tp1", 8, "crashed", "server exited 1")
    assert not current.visible and (cells.total, cells.completed) == (5, 2)
    assert cells.fields["counts"] == "0 ok · 0 failed · 1 crashed · 0 skipped"
    reporter.cell_start("a@tp1", 16)
    assert (current.completed, current.total) == (0, 1)  # the new cell starts from 0
    reporter.cell_done("a@tp1", 16, "ok")
    reporter.cell_done("a@tp1", 32, "failed", "all 4 requests failed")
    reporter.cell_done("b@tp2", 1, "skipped", "needs 2 GPU(s)")
    reporter.note("[bold]GPU 1[/bold] \x07 left the pool")
    reporter.end()
    assert reporter.progress.live.is_started is False
    out, err = capsys.readouterr()
    assert out == ""  # the display and its lines go to stderr
    lines = err.splitlines()
    assert lines[0] == "bench: 5 cells, 1 already done"
    assert "bench: [red]a[/red]@tp1 concurrency 8: crashed (server exited 1) [2/5 done" in err
    assert "bench: a@tp1 concurrency 16: ok [3/5 done" in err  # no reason: nothing in ()
    assert "bench: [bold]GPU 1[/bold] \\x07 left the pool" in lines
    assert lines[-1].startswith("bench: finished [5/5 done: 1 ok, 1 failed, 1 crashed, 1 skipped;")
    frame = re.compile(r"cells ━+ +5/5 1 ok · 1 failed · 1 crashed · 1 skipped "
                       r"\d+:\d\d:\d\d (\d+:\d\d:\d\d|-:--:--)")  # fmt: skip
    assert [line for line in lines if frame.fullmatch(line.strip())], err
    assert "\x07" not in err


def test_a_client_bound_cell_is_counted_apart_from_ok() -> None:
    """An ok record the load generator limited is no result (exit 3): the progress line says
    so and counts it apart, as the closing table does; the count shows only when non-zero."""
    reporter = PlainReporter(io.StringIO())
    reporter.begin(2, 0)
    reporter.cell_done("a@tp1", 1, "client-bound", "client-bound: schedule delay p99 12.0 ms")
    reporter.cell_done("a@tp1", 2, "ok")
    lines = reporter.stream.getvalue().splitlines()
    assert lines[1].startswith(
        "bench: a@tp1 concurrency 1: no result (client-bound: schedule delay p99 12.0 ms) "
        "[1/2 done: 0 ok, 1 client-bound, 0 failed, 0 crashed, 0 skipped;"
    )
    assert "[2/2 done: 1 ok, 1 client-bound, 0 failed, 0 crashed, 0 skipped;" in lines[2]
    assert reporter.eta() is None and reporter.skipped == 0
