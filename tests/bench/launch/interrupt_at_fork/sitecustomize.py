"""Loaded by the bench process of tests/bench/launch/test_interrupt_at_fork.py (through
PYTHONPATH): it makes the rare Ctrl-C of issue 34.5 happen every time.

It stands for a person pressing Ctrl-C at the instant bench forks a server: right after
``fork()`` in the parent, inside the ``os.register_at_fork`` callbacks that Python runs
there (whose exceptions it prints as "Exception ignored" and drops), the process sends
itself a real SIGINT, once, when the fork is a server's (ServerProcess in the stack).
"""

import os
import signal
import sys

_done = []


def _after_fork_in_parent() -> None:
    if _done:
        return
    frame = sys._getframe(1)
    while frame is not None and not frame.f_code.co_filename.endswith("launch/server.py"):
        frame = frame.f_back
    if frame is None:
        return
    _done.append(True)
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):  # bytecodes: Python runs the handler here, inside the callback
        pass


os.register_at_fork(after_in_parent=_after_fork_in_parent)
