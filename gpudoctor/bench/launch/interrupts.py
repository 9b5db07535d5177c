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

While the launcher starts a server (:func:`deferred`) a signal is only recorded: a
KeyboardInterrupt raised inside ``subprocess.Popen`` after its fork would lose the
``Popen`` object, leaving the server to the guardian (issue 47.3).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

_INTERRUPTED = threading.Event()
_LAST: list[int] = []
_DEFER: list[bool] = []  # non-empty while the main thread is inside deferred()


def reset() -> None:
    """Forget an earlier interruption (a new campaign starts); return None."""
    _INTERRUPTED.clear()
    _LAST.clear()


def handler(signum: int, frame: object) -> None:
    """The launcher's SIGINT/SIGTERM/SIGHUP handler: record the signal, then raise
    KeyboardInterrupt (the cleanup path), unless inside :func:`deferred`; returns None."""
    _LAST[:] = [signum]
    _INTERRUPTED.set()
    if _DEFER:
        return
    raise KeyboardInterrupt(f"signal {signum}")


def pending() -> bool:
    """Return True when a signal was recorded since the campaign started."""
    return _INTERRUPTED.is_set()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """While inside, in the main thread: a signal is recorded, not raised (the caller asks
    :func:`raise_if_interrupted` after); other threads never get one, so nothing changes
    there."""
    main = threading.current_thread() is threading.main_thread()
    if main:
        _DEFER.append(True)
    try:
        yield
    finally:
        if main:
            _DEFER.pop()


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
