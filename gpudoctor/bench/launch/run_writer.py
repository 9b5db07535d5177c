"""The one writer of a campaign's run directory: ``results.jsonl`` (cell records and search
result lines), ``servers.jsonl`` (one line per server stopped) and ``gpus.jsonl`` (GPUs
that failed their check), each line appended and fsync'ed under one lock, so the slot
threads of a packed run never interleave.

What a cell's record holds is decided by :mod:`gpudoctor.bench.launch.cell_runner`; this
module only appends, counts and remembers the finished keys (resume never reruns them).
"""

from __future__ import annotations

import threading
from typing import Any

from gpudoctor.bench.launch.live_state import now_utc
from gpudoctor.bench.launch.progress import PlainReporter
from gpudoctor.bench.launch.slots import Gpu
from gpudoctor.bench.results.run_dir import RunDir


class RunWriter:
    """Append records to ``rundir``; ``done`` maps every recorded key (earlier launches'
    too) to its record, ``counts`` this launch's cells by status."""

    def __init__(self, rundir: RunDir, reporter: PlainReporter) -> None:
        self.rundir = rundir
        self.reporter = reporter
        self.done: dict[str, dict] = {}
        self.counts = {"ok": 0, "failed": 0, "crashed": 0, "skipped": 0, "client_bound": 0}
        self.stopping = threading.Event()  # set when interrupted: nothing more is recorded
        self._lock = threading.Lock()

    def append_cell(self, record: dict[str, Any]) -> bool:
        """Append one cell's record and count it; return False (nothing written) once the
        launch is stopping: an interrupted cell is not finished, a resume runs it."""
        if self.stopping.is_set():
            return False
        status = record["status"]
        with self._lock:
            self.rundir.append(record)
            self.done[record["key"]] = record
            self.counts[status if status in self.counts else "skipped"] += 1
            if status == "ok" and record.get("client_bound"):  # not a result (issue 45.9)
                self.counts["client_bound"] += 1
        return True

    def append_result_line(self, line: dict[str, Any]) -> None:
        """Append a line that is not a cell (a search's result) to results.jsonl."""
        with self._lock:
            self.rundir.append(line)
            self.done[line["key"]] = line

    def server_line(self, line: dict[str, Any]) -> None:
        """Append one stopped server's facts to servers.jsonl."""
        with self._lock:
            self.rundir.append_server(line)

    def gpu_out(self, gpu: Gpu, reason: str, before: str) -> None:
        """Record that ``gpu`` failed its check before ``before`` and left the pool."""
        line = {"uuid": gpu.uuid, "index": gpu.index, "name": gpu.name, "reason": reason,
                "before": before, "at": now_utc()}  # fmt: skip
        with self._lock:
            self.rundir.append_gpu_out(line)
        self.reporter.note(
            f"GPU {gpu.index} ({gpu.uuid}) failed its check and left the pool: {reason}"
        )
