"""Loaded by the bench process of tests/bench/launch/test_interrupt_at_fork.py's issue 47.3
case (through PYTHONPATH): it makes the Ctrl-C that held bench for 15 s happen every time.

It stands for a person pressing Ctrl-C while ``subprocess.Popen`` waits for a server's exec:
right after the fork, in the parent, in Popen's own code (where an exception is raised, not
dropped), the process gets a real SIGINT, once, when the Popen is a server's (ServerProcess
in the stack). The terminal's SIGINT goes to the foreground group, which the server has left
(its own session) by the time Popen waits for its exec: so the launcher alone gets it. As it
exits (``os._exit``, what bench does after Ctrl-C) it writes to ``$GPUDOCTOR_TEST_ZOMBIES``
the pids of its children that exited and that nothing waited for (zombies): the trace of
a server whose Popen was lost.
"""

import atexit
import os
import signal
import subprocess
import sys

_done = []
_real = subprocess.Popen._close_pipe_fds


def _wait_exec(pid: int) -> None:
    """Return once ``pid`` runs the server (its environment carries the bench tag)."""
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if b"GPUDOCTOR_BENCH_TAG=" in fh.read():
                    return
        except OSError:
            return
        time.sleep(0.005)


def _close_pipe_fds(self, *args):  # type: ignore[no-untyped-def]
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_qualname != "ServerProcess.__init__":
        frame = frame.f_back
    if frame is not None and not _done:
        _done.append(True)
        _wait_exec(self.pid)  # a server that runs already (4 of 18 presses)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # bytecodes: Python runs the handler here, inside Popen
            pass
    return _real(self, *args)


def _zombies() -> None:
    found = []
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{tid}/children") as fh:
            for pid in fh.read().split():
                with open(f"/proc/{pid}/stat") as st:
                    if st.read().rsplit(")", 1)[1].split()[0] == "Z":
                        found.append(pid)
    with open(os.environ["GPUDOCTOR_TEST_ZOMBIES"], "w") as out:
        out.write(" ".join(found))


_real_exit = os._exit


def _exit(code: int) -> None:
    _zombies()
    _real_exit(code)


subprocess.Popen._close_pipe_fds = _close_pipe_fds
os._exit = _exit
atexit.register(_zombies)
