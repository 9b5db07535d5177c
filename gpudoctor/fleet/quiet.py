"""Keep abandoned background GPU probes from printing tracebacks during a fleet run.

The runner starts the CUDA/NVML probe early in a thread named ``gpu-probe``; when no
selected check needs it (e.g. the driver is missing) the run ends while it still runs,
and closing the CT's connection makes it raise :class:`HostError` in that thread, which
Python prints as "Exception in thread gpu-probe". The error is already cached for any
reader, so it is noise: this hook drops exactly that case and passes everything else on.
"""

from __future__ import annotations

import threading

from gpudoctor.hosts.base import HostError

_installed = False
_lock = threading.Lock()


def quiet_probe_threads() -> None:
    """Install (once) a ``threading.excepthook`` that ignores HostError in ``gpu-probe``
    threads and hands every other uncaught exception to the previous hook."""
    global _installed
    with _lock:
        if _installed:
            return
        previous = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            thread = args.thread
            if (
                thread is not None
                and thread.name == "gpu-probe"
                and isinstance(args.exc_value, HostError)
            ):
                return
            previous(args)

        threading.excepthook = hook
        _installed = True
