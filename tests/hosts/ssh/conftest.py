"""Every test of tests/hosts/ssh reaps what it starts (an ssh-agent, a ProxyCommand, a
command the in-process server ran): a child of the test process still there after the
test, running or a zombie, fails that test. Such a child is reaped later by whoever waits
for any child: mutmut's main process (it runs these tests in-process, then waits for its
forked workers with ``os.waitpid(-1)``) aborts on the unknown pid."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def children_of(pid: int) -> dict[int, str]:
    """Return the processes whose parent is ``pid`` (``ps --ppid PID``): pid -> its
    /proc/PID/stat line up to the command name, e.g. ``"4711 (sh)"``."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        name_end = stat.rindex(")")
        if int(stat[name_end + 2 :].split()[1]) == pid:
            found[int(entry.name)] = stat[: name_end + 1]
    return found


@pytest.fixture(autouse=True)
def no_child_left() -> Iterator[None]:
    """Fail the test when it leaves a child process of this one behind."""
    before = children_of(os.getpid())
    yield
    left = {pid: name for pid, name in children_of(os.getpid()).items() if pid not in before}
    assert not left, f"the test left child processes behind: {sorted(left.values())}"
