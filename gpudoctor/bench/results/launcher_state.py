"""Who holds a run directory: the name of its ``state.json`` and whether the launcher
that wrote it still runs (same pid, same process start time). The writer is
:class:`gpudoctor.bench.launch.live_state.LiveState`; the readers are ``bench status`` and
the run directory's lock, which lives a layer below the launch."""

from __future__ import annotations

from typing import Any

STATE = "state.json"


def process_start(pid: int) -> float | None:
    """Return when process ``pid`` started (seconds since the epoch, psutil's
    ``create_time``; ``ps -o lstart= -p PID``), or None when it does not run or cannot
    be read."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def launcher_alive(state: dict[str, Any]) -> bool:
    """Return whether the launcher that wrote ``state`` still runs (same pid, same start)."""
    pid = state.get("pid")
    if not isinstance(pid, int) or state.get("finished"):
        return False
    started = process_start(pid)
    return started is not None and (state.get("pid_started") in (None, started))
