"""The pieces of the error policy (gpudoctor/errors.py), called directly."""

from __future__ import annotations

import threading

from gpudoctor import errors
from tests.cli.support import ERROR_LINE


def test_error_line_is_one_line_in_the_documented_form():
    line = errors.error_line("cannot read\nthe file.", "check it")
    assert line == "gpudoctor: error: cannot read; the file; check it"
    assert ERROR_LINE.match(line)
    # a message that already says what to do keeps its own advice
    own = errors.error_line("host down; start it", "generic")
    assert own == "gpudoctor: error: host down; start it"
    assert errors.error_line("Error: bad", "fix it") == "gpudoctor: error: bad; fix it"


def test_describe_names_the_path_of_an_os_error():
    what, todo = errors.describe(FileNotFoundError(2, "No such file or directory", "/x/y"))
    assert what == "/x/y: No such file or directory" and "permissions" in todo
    what, todo = errors.describe(RuntimeError("kaput"))
    assert what == "RuntimeError: kaput" and "--debug" in todo


def test_wants_json():
    assert errors.wants_json(["check", "--json"])
    assert errors.wants_json(["check", "--format", "json"])
    assert not errors.wants_json(["check", "--format", "human"])
    assert not errors.wants_json(["bench", "run", "p.toml", "--", "--json"])


def test_a_failing_worker_thread_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("GPUDOCTOR_DEBUG", raising=False)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)  # restored after
    errors.quiet_thread_tracebacks()
    worker = threading.Thread(target=lambda: 1 / 0, name="probe-thread")
    worker.start()
    worker.join()
    err = capsys.readouterr().err
    assert err == "gpudoctor: warning: probe-thread failed: ZeroDivisionError: division by zero\n"
