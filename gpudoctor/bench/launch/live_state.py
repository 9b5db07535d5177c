"""``state.json`` of a run directory: the launcher's pid, the GPU pool and what runs where
since when, rewritten atomically at each change (read by ``bench status`` in another
terminal, which asks
:func:`gpudoctor.bench.results.launcher_state.launcher_alive` whether the writer still runs)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from gpudoctor.bench.results.launcher_state import process_start
from gpudoctor.bench.results.run_dir import write_atomic


def now_utc() -> str:
    """Return the current time as ``2025-01-31T12:00:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class LiveState:
    """``state.json`` of a run directory: the launcher's pid, the pool, what runs where."""

    def __init__(self, path: Path, tag: str) -> None:
        self.path = path
        self.tag = tag
        self.running: dict[str, dict[str, Any]] = {}
        self.pool: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._started = process_start(os.getpid())

    def _write(self, finished: bool = False) -> None:
        doc = {"tag": self.tag, "pid": os.getpid(), "pid_started": self._started,
               "updated_at": now_utc(), "finished": finished, "pool": self.pool,
               "running": sorted(self.running.values(), key=lambda r: r["slot"])}  # fmt: skip
        write_atomic(self.path, json.dumps(doc, indent=2, sort_keys=True))

    def set_pool(self, pool: dict[str, Any]) -> None:
        """Record the GPU pool (its GPUs, those taken out and why)."""
        with self._lock:
            self.pool = pool
            self._write()

    def start(self, key: str, entry: dict[str, Any]) -> None:
        """Record that a server (``entry``: label, slot, gpus, cells) started now."""
        with self._lock:
            self.running[key] = {**entry, "since": now_utc()}
            self._write()

    def cell(self, key: str, concurrency: int) -> None:
        """Record which cell of a running server is being measured."""
        with self._lock:
            if key in self.running:
                self.running[key].update(concurrency=concurrency, cell_since=now_utc())
                self._write()

    def stop(self, key: str) -> None:
        """Record that a server stopped."""
        with self._lock:
            self.running.pop(key, None)
            self._write()

    def close(self) -> None:
        """Mark the launch finished (nothing runs)."""
        with self._lock:
            self.running.clear()
            self._write(finished=True)
