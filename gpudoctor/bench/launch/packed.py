"""Several servers at once: each job (a configuration's sweep) on its own slot, a disjoint
set of GPUs held from the pool, in its own thread of the launcher.

- The loop (:class:`PackedRun`) is the only place GPUs are taken: it picks the next job
  (:func:`schedule.pick`), takes the best-connected free GPUs for it, checks them
  (:func:`slots.check_gpus`; a GPU that fails leaves the pool and is written to
  ``gpus.jsonl``), then starts the job's thread. A job needing more GPUs than the pool
  still has is recorded as skipped.
- A slot thread runs the campaign's ``_run_config`` with ``CUDA_VISIBLE_DEVICES`` set to
  its GPUs' UUIDs; when it ends (done or crashed) its GPUs go back to the pool. A crash
  touches nothing but its own slot.
- One writer: slot threads hand records to the campaign, which appends them to
  ``results.jsonl`` under one lock, in this one process (servers never write results).
- Ctrl-C / SIGTERM / a writer error: every running server is stopped, the slot threads
  end without recording the interrupted cells, and the exception goes on. SIGKILL of the
  launcher: the guardian kills every tagged process (every server's process group).
- ``state.json`` (written atomically at each change) says what runs where since when, for
  ``bench status`` in another terminal.
"""

from __future__ import annotations

import json
import os
import queue as queue_mod
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.bench.launch.schedule import Job, pick
from gpudoctor.bench.launch.slots import Gpu, GpuPool, check_gpus
from gpudoctor.bench.results.run_dir import write_atomic

if TYPE_CHECKING:
    from gpudoctor.bench.launch.campaign import Campaign

STATE = "state.json"


def now_utc() -> str:
    """Return the current time as ``2025-01-31T12:00:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class Slot:
    """Where one job runs: its number (1, 2, ... in start order) and its GPUs."""

    number: int
    gpus: tuple[Gpu, ...]

    @property
    def uuids(self) -> list[str]:
        """Return the slot's GPU UUIDs (``CUDA_VISIBLE_DEVICES``)."""
        return [g.uuid for g in self.gpus]


class LiveState:
    """``state.json`` of a run directory: the launcher's pid, the pool, what runs where."""

    def __init__(self, path: Path, tag: str) -> None:
        self.path = path
        self.tag = tag
        self.running: dict[str, dict[str, Any]] = {}
        self.pool: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._started = _process_start(os.getpid())

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


def _process_start(pid: int) -> float | None:
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
    started = _process_start(pid)
    return started is not None and (state.get("pid_started") in (None, started))


class PackedRun:
    """Run ``jobs`` on ``pool`` for ``campaign``, several at once (see the module docstring)."""

    def __init__(self, campaign: Campaign, pool: GpuPool, jobs: list[Job]) -> None:
        self.campaign = campaign
        self.pool = pool
        self.queue = list(jobs)
        self.done: queue_mod.Queue[tuple[int, BaseException | None]] = queue_mod.Queue()
        self.running: dict[int, tuple[Job, Slot, threading.Thread, float]] = {}
        self.slots_started = 0

    def _pool_facts(self) -> dict[str, Any]:
        return {
            "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name} for g in self.pool.gpus],
            "out": dict(self.pool.out),
        }

    def _take(self, job: Job) -> Slot | None:
        """Take and check GPUs for ``job``; None when a GPU failed (it left the pool)."""
        number = self.slots_started + 1
        gpus = self.pool.take(job.gpus, number)
        if gpus is None:
            return None
        faults = check_gpus(gpus)
        if not faults:
            self.slots_started = number
            return Slot(number, tuple(gpus))
        for gpu in gpus:
            if gpu.uuid in faults:
                self.pool.remove(gpu, faults[gpu.uuid])
                self.campaign.gpu_out(gpu, faults[gpu.uuid], job.config.label)
        self.pool.give_back(gpus)
        self.campaign.state.set_pool(self._pool_facts())
        return None

    def _thread(self, job: Job, slot: Slot) -> None:
        error: BaseException | None = None
        try:
            self.campaign.run_config(job.config, list(job.cells), slot)
        except BaseException as exc:  # handed to the loop, which stops the rest
            error = exc
        finally:
            self.pool.give_back(list(slot.gpus))
            self.done.put((slot.number, error))

    def _start_ready(self) -> None:
        while self.queue:
            now = time.monotonic()
            ends = [(t0 + job.estimate_s, job.gpus) for job, _, _, t0 in self.running.values()]
            i = pick(self.queue, len(self.pool.free()), self.pool.usable, ends, now)
            if i is None:
                return
            slot = self._take(self.queue[i])
            if slot is None:
                continue  # a GPU failed its check and left the pool: pick again
            job = self.queue.pop(i)
            thread = threading.Thread(target=self._thread, args=(job, slot),
                                      name=f"slot-{slot.number}", daemon=True)  # fmt: skip
            self.running[slot.number] = (job, slot, thread, now)
            thread.start()

    def _too_big(self) -> None:
        """Record as skipped every queued job that needs more GPUs than the pool has."""
        for job in [j for j in self.queue if j.gpus > self.pool.usable]:
            self.queue.remove(job)
            reason = (f"needs {job.gpus} GPU(s); the pool has {self.pool.usable} usable "
                      f"of {len(self.pool.gpus)}")  # fmt: skip
            for cell in job.cells:
                self.campaign.record(cell, "skipped", reason=reason, retryable=True)

    def run(self) -> None:
        """Run every job; return when all ended (raises what a slot or a signal raised)."""
        self.campaign.state.set_pool(self._pool_facts())
        try:
            while self.queue or self.running:
                self._too_big()
                self._start_ready()
                if not self.running:
                    self._too_big()
                    if self.queue:  # nothing runs and nothing fits: cannot happen after _too_big
                        raise RuntimeError("scheduler stalled")  # pragma: no cover
                    break
                try:
                    number, error = self.done.get(timeout=0.5)
                except queue_mod.Empty:
                    continue
                _, _, thread, _ = self.running.pop(number)
                thread.join()
                if error is not None:
                    raise error
        except BaseException:
            self.campaign.stopping.set()
            self.campaign.stop_all_servers()
            for _, _, thread, _ in list(self.running.values()):
                thread.join(timeout=60)
            raise
