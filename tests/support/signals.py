"""The signal dispositions of the children a test signals (issue 49).

A shell starts a background job (``cmd &``, ``nohup cmd &``) with SIGINT and SIGQUIT
ignored (``nohup`` adds SIGHUP), and an ignored signal stays ignored across ``fork`` and
``exec``. A pytest started that way passes the ignore on to every process a test starts:
their Python then installs no KeyboardInterrupt handler, and the Ctrl-C the test sends
is dropped. gpudoctor is right to keep an inherited ignore (a background job asks for
it); a test must not depend on how its runner was started. So every test that signals
a child starts it with ``preexec_fn=default_signals``: in the child, between fork and
exec, the signals a test sends get the kernel's default back, unblocked, whatever the
runner's were. The same child is what a person's Ctrl-C reaches in a foreground shell.
"""

from __future__ import annotations

import signal
from pathlib import Path

SENT = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP)
"""What a test sends (Ctrl-C, Ctrl-\\, ``kill``, a closed terminal), and what a shell
or ``nohup`` ignores in a background job."""


def default_signals() -> None:
    """Give each of :data:`SENT` its default disposition (SIG_DFL) and unblock it, in the
    calling process (a ``preexec_fn``: the child, between fork and exec); return None."""
    for sig in SENT:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SENT)


def status_signals(pid: int, field: str = "SigIgn") -> frozenset[int]:
    """Return which of :data:`SENT` are in ``field`` of /proc/PID/status (``SigIgn``: the
    ignored ones; ``SigBlk``: those its main thread blocks)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            mask = int(line.split()[1], 16)
            return frozenset(sig for sig in SENT if mask >> (sig - 1) & 1)
    return frozenset()
