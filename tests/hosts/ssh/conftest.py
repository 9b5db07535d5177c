"""Every test of tests/hosts/ssh reaps what it starts (an ssh-agent, a ProxyCommand, a
command the in-process server ran): a child of the test process still there after the
test, running or a zombie, fails that test. Such a child is reaped later by whoever waits
for any child: mutmut's main process (it runs these tests in-process, then waits for its
forked workers with ``os.waitpid(-1)``) aborts on the unknown pid."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator

import pytest

from tests.hosts.ssh.inproc_sshd import process_stats


def children_of(pid: int) -> dict[int, str]:
    """Return the processes whose parent is ``pid`` (``ps --ppid PID``): pid -> its
    /proc/PID/stat line up to the command name, e.g. ``"4711 (sh)"``."""
    return {child: name for child, (name, fields) in process_stats().items()
            if int(fields[1]) == pid}  # fmt: skip


@pytest.fixture(autouse=True)
def no_child_left() -> Iterator[None]:
    """Fail the test when it leaves a child process of this one behind."""
    before = children_of(os.getpid())
    yield
    left = {pid: name for pid, name in children_of(os.getpid()).items() if pid not in before}
    assert not left, f"the test left child processes behind: {sorted(left.values())}"


@pytest.fixture
def passwd_home(monkeypatch: pytest.MonkeyPatch) -> str:
    """Set HOME to this user's home in the password database, and return it: ``ssh``
    expands ``~`` and ``%d`` from there, never from $HOME (which the suite points at a
    folder of its own, tests/support/runner_env.py); gpudoctor's paramiko reader takes
    $HOME. A test comparing the two readers' paths needs them to be the same."""
    home = pwd.getpwuid(os.getuid()).pw_dir
    monkeypatch.setenv("HOME", home)
    return home
