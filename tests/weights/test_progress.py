"""What ``weights ensure``/``mirror``/``status`` print while bytes move: plain lines when
stderr is a file or a pipe (a log, CI), rich bars on a terminal, nothing with ``-q``.
Real streams (a StringIO, pytest's captured stderr, a real pty for the terminal case)."""

from __future__ import annotations

import io
import os
import pty
import re
import sys

import pytest

from gpudoctor.weights.progress import (
    PlainProgress,
    Progress,
    RichProgress,
    human_bytes,
    make_progress,
)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.0 kB"),
        (1500, "1.5 kB"),
        (-1500, "-1.5 kB"),
        (320_000_000, "320.0 MB"),
        (1_500_000_000, "1.5 GB"),
        (2_000_000_000_000, "2.0 TB"),
        (5_000_000_000_000_000, "5000.0 TB"),
    ],
)
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


def test_the_silent_reporter_is_a_context_manager_that_prints_nothing(capsys) -> None:
    quiet = Progress()
    with quiet.phase("copy", {"a": 1}) as phase:
        assert phase is quiet
        phase.advance("a", 1)
        phase.file_done("a")
        phase.message("hello")
    assert capsys.readouterr() == ("", "")


def test_plain_lines_of_a_phase(monkeypatch) -> None:
    clock = iter([100.0, 100.0, 102.0, 104.0])  # phase, advance, advance, close
    monkeypatch.setattr("gpudoctor.weights.progress.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    plain = PlainProgress(out, interval_s=5.0)
    with plain.phase("download", {"a.bin": 3000, "b.bin": 2000}):
        plain.advance("a.bin", 3000)  # 0 s after the last line: no total yet
        plain.file_done("a.bin")
        plain.advance("b.bin", 1000)  # 2 s: still quiet
        plain.message("resuming b.bin")
    assert out.getvalue().splitlines() == [
        "download: 2 files, 5.0 kB",
        "download: done a.bin",
        "resuming b.bin",
        "download: 4.0 kB / 5.0 kB, 1/2 files, 1.0 kB/s",  # the final total at close
    ]


def test_plain_prints_a_total_once_the_interval_has_passed(monkeypatch) -> None:
    clock = iter([0.0, 4.9, 5.0, 7.0, 10.0])
    monkeypatch.setattr("gpudoctor.weights.progress.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    plain = PlainProgress(out, interval_s=5.0)
    plain.phase("verify sha256", {"a": 10_000})
    plain.advance("a", 1000)  # 4.9 s: not yet
    plain.advance("a", 1000)  # 5.0 s: a total
    plain.advance("a", 1000)  # 2 s after that one: not yet
    plain.advance("a", 1000)  # 5 s after it: a total
    assert out.getvalue().splitlines() == [
        "verify sha256: 1 files, 10.0 kB",
        "verify sha256: 2.0 kB / 10.0 kB, 0/1 files, 400 B/s",
        "verify sha256: 4.0 kB / 10.0 kB, 0/1 files, 400 B/s",
    ]


def test_plain_close_without_a_phase_prints_nothing_and_a_phase_closes_once() -> None:
    out = io.StringIO()
    plain = PlainProgress(out)
    plain.close()
    assert out.getvalue() == ""
    plain.phase("copy", {})
    plain.close()
    plain.close()
    lines = out.getvalue().splitlines()  # the phase line and one final total
    assert lines[0] == "copy: 0 files, 0 B"
    assert lines[1].startswith("copy: 0 B / 0 B, 0/0 files, ") and len(lines) == 2


def test_plain_goes_to_stderr_by_default(capsys) -> None:
    PlainProgress().message("to stderr")
    assert capsys.readouterr() == ("", "to stderr\n")


def test_rich_bars_show_the_files_in_flight_and_the_total(capsys) -> None:
    bars = RichProgress()
    bars.advance("x", 5)  # before any phase: ignored
    bars.file_done("x")
    bars.phase("download", {"a.bin": 100_000, "b.bin": 50_000})
    bars.advance("a.bin", 60_000)
    bars.advance("a.bin", 40_000)
    bars.file_done("a.bin")
    bars.file_done("never-started")
    bars.advance("b.bin", 10_000)
    bars.message("[bold]kept as typed[/]")
    bars.close()
    bars.close()
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == "[bold]kept as typed[/]"
    assert lines[1].startswith("download (2 files)") and "110.0/150.0 kB" in lines[1]
    assert "━" in lines[1] and "/s" in lines[1]  # the bar and the speed
    assert re.search(r" (\d+:\d\d:\d\d|-:--:--)$", lines[1])  # the time left
    assert lines[2].startswith("  b.bin") and "10.0/50.0 kB" in lines[2]
    assert len(lines) == 3  # a.bin's bar went when it was done
    bars.phase("verify", {"c": 10})  # a new phase starts from fresh bars
    bars.advance("c", 10)
    bars.close()
    again = capsys.readouterr().err.splitlines()
    assert again[0].startswith("verify (1 files)") and "b.bin" not in "".join(again)


def test_make_progress_picks_by_stream(monkeypatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert type(make_progress(quiet=True)) is Progress
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert type(make_progress()) is PlainProgress
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as tty:
            monkeypatch.setattr(sys, "stderr", tty)
            assert type(make_progress()) is RichProgress
            assert type(make_progress(quiet=True)) is Progress
            monkeypatch.setenv("NO_COLOR", "1")
            assert type(make_progress()) is PlainProgress
    finally:
        os.close(leader)
        os.close(follower)


def test_the_rate_of_a_phase_shorter_than_a_second(monkeypatch) -> None:
    clock = iter([0.0, 0.2, 0.5])  # phase, advance, close
    monkeypatch.setattr("gpudoctor.weights.progress.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    plain = PlainProgress(out, interval_s=5.0)
    plain.phase("copy", {"a": 1000, "b": 1000})
    plain.advance("a", 1000)
    plain.file_done("a")
    plain.file_done("b")
    plain.close()
    assert out.getvalue().splitlines()[-1] == "copy: 1.0 kB / 2.0 kB, 2/2 files, 2.0 kB/s"


def test_each_line_reaches_a_log_pipe_at_once() -> None:
    """``weights ensure ... 2>&1 | tee log``: a line is in the pipe when it is printed,
    not when a buffer fills (a stuck download must show how far it got)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    with os.fdopen(write_fd, "w", buffering=1 << 16) as pipe:
        PlainProgress(pipe).message("resuming w.bin")
        assert os.read(read_fd, 100) == b"resuming w.bin\n"
    os.close(read_fd)


def test_plain_prints_a_total_every_five_seconds_by_default(monkeypatch) -> None:
    clock = iter([0.0, 4.99, 5.0])
    monkeypatch.setattr("gpudoctor.weights.progress.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    plain = PlainProgress(out)
    plain.phase("download", {"a": 3000})
    plain.advance("a", 1000)
    plain.advance("a", 1000)
    assert out.getvalue().splitlines()[1:] == ["download: 2.0 kB / 3.0 kB, 0/1 files, 400 B/s"]


def test_a_message_on_a_terminal_is_printed_as_is(monkeypatch) -> None:
    """rich would colour numbers and paths of a message (``highlight``) and read ``[...]``
    as markup: a message shows its text as written, without escape sequences."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as tty:
            monkeypatch.setattr(sys, "stderr", tty)
            RichProgress().message("resumed 3 files of /models/[x] at 1.5 GB/s")
        os.set_blocking(leader, False)
        shown = os.read(leader, 4096).decode()
    finally:
        os.close(leader)
        os.close(follower)
    assert shown.replace("\r\n", "\n") == "resumed 3 files of /models/[x] at 1.5 GB/s\n"
