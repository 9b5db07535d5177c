"""tests/support/signals.py: a child a test signals takes the signal whatever the runner's
disposition (issue 49). The runner here is this pytest process, made to look like a
background job of a shell (SIGINT and SIGQUIT ignored, as ``cmd &`` does; SIGHUP
ignored, as ``nohup`` does; SIGTERM blocked), then put back."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.signals import SENT, default_signals, status_signals


@pytest.fixture
def background_runner() -> Iterator[None]:
    """This process as a shell leaves a background job: SIGINT, SIGQUIT, SIGHUP ignored,
    SIGTERM blocked; everything put back after the test."""
    dispositions = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in dispositions}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def sleeper(**kw: object) -> subprocess.Popen[bytes]:
    """Return a started ``sleep 600`` (killed by the caller)."""
    return subprocess.Popen(["sleep", "600"], **kw)  # type: ignore[call-overload]


@pytest.mark.signals
def test_the_runners_ignore_reaches_a_plain_child(background_runner: None) -> None:
    """The premise: without the helper the child inherits what the runner ignores and blocks."""
    child = sleeper()
    try:
        assert status_signals(child.pid) == {signal.SIGINT, signal.SIGQUIT, signal.SIGHUP}
        assert status_signals(child.pid, "SigBlk") == {signal.SIGTERM}
    finally:
        child.kill()
        child.wait()


@pytest.mark.signals
@pytest.mark.parametrize("sig", SENT)
def test_a_child_started_with_default_signals_dies_of_each_signal_sent(
    background_runner: None, sig: int
) -> None:
    child = sleeper(preexec_fn=default_signals, start_new_session=True)
    try:
        assert (
            status_signals(child.pid) == frozenset()
            and status_signals(child.pid, "SigBlk") == frozenset()
        )
        child.send_signal(sig)
        assert child.wait(60) == -sig
    finally:
        child.kill()
        child.wait()


def test_the_signals_a_background_job_and_nohup_ignore_are_all_restored() -> None:
    assert {signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM} <= set(SENT)
