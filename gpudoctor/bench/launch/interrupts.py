"""Ctrl-C during a campaign is never lost (issue 34.5).

Python runs a signal's handler between two bytecodes of the main thread; when that
bytecode belongs to code whose exceptions Python discards, the KeyboardInterrupt goes
with it (``Exception ignored in: ... KeyboardInterrupt``). Forking a server is such a
moment: ``fork()`` runs the ``os.register_at_fork`` callbacks (``logging``'s lock
release, ...) in the parent, and an exception there is printed and dropped, so a Ctrl-C
that lands while bench forks a server let the campaign run on to the end, exit 0.

So the handler also records the signal (:func:`handler`), and the launcher asks
(:func:`raise_if_interrupted`) right after it forks a server and before each cell: a
dropped KeyboardInterrupt is raised again there, the servers are stopped, exit 130.
Python's "Exception ignored" report of it is left out (it is not lost; :func:`catching`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

_INTERRUPTED = threading.Event()
_LAST: list[int] = []


def reset() -> None:
    """Forget an earlier interruption (a new campaign starts); return None."""
    _INTERRUPTED.clear()
    _LAST.clear()


def handler(signum: int, frame: object) -> None:
    """The launcher's SIGINT/SIGTERM/SIGHUP handler: record the signal, then raise
    KeyboardInterrupt (the cleanup path)."""
    _LAST[:] = [signum]
    _INTERRUPTED.set()
    raise KeyboardInterrupt(f"signal {signum}")


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt in the main thread when a signal was handled but its
    exception was dropped; return None otherwise (and in any other thread: signals are
    the main thread's)."""
    if _INTERRUPTED.is_set() and threading.current_thread() is threading.main_thread():
        raise KeyboardInterrupt(f"signal {_LAST[0] if _LAST else signal.SIGINT}")


@contextlib.contextmanager
def catching() -> Iterator[None]:
    """While inside: SIGINT, SIGTERM and SIGHUP go to :func:`handler`, and Python's
    report of a KeyboardInterrupt it dropped is left out (every other one is printed as
    before); the earlier handlers and hook are put back after."""
    reset()
    previous_hook = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            return  # recorded by handler(): raised again where the launcher asks
        previous_hook(unraisable)

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, handler) for s in signals}
    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        for s, h in old.items():
            signal.signal(s, h)
