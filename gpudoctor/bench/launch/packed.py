"""Several servers at once: each job (a configuration's sweep) on its own slot, a disjoint
set of GPUs held from the pool, in its own thread of the launcher.

- The loop (:class:`PackedRun`) is the only place GPUs are taken: it picks the next job
  (:func:`schedule.pick`), takes the best-connected free GPUs for it, checks them
  (:func:`slots.check_gpus`; a GPU that fails leaves the pool and is written to
  ``gpus.jsonl``), then starts the job's thread. A job needing more GPUs than the pool
  still has is recorded as skipped.
- A slot thread runs the configuration's sweep (:func:`config_sweep.serve_and_sweep`)
  with ``CUDA_VISIBLE_DEVICES`` set to its GPUs' UUIDs; when it ends (done or crashed)
  its GPUs go back to the pool. A crash touches nothing but its own slot.
- One writer: slot threads hand records to the cell runner, whose
  :class:`~gpudoctor.bench.launch.run_writer.RunWriter` appends them under one lock, in
  this one process (servers never write results).
- Ctrl-C / SIGTERM / a writer error: every running server is stopped, the slot threads
  end without recording the interrupted cells, and the exception goes on. SIGKILL of the
  launcher: the guardian kills every tagged process (every server's process group).
- ``state.json`` (:mod:`gpudoctor.bench.launch.live_state`) says what runs where since
  when, for ``bench status`` in another terminal.
"""

from __future__ import annotations

import queue as queue_mod
import threading
import time
from typing import Any

from gpudoctor.bench.launch.cell_runner import CellRunner
from gpudoctor.bench.launch.config_sweep import serve_and_sweep
from gpudoctor.bench.launch.schedule import Job, pick
from gpudoctor.bench.launch.server_lifecycle import ServerLifecycle
from gpudoctor.bench.launch.slots import GpuPool, Slot, check_gpus


class PackedRun:
    """Run ``jobs`` on ``pool``, several at once (see the module docstring)."""

    def __init__(
        self, servers: ServerLifecycle, runner: CellRunner, pool: GpuPool, jobs: list[Job]
    ) -> None:
        self.servers = servers
        self.runner = runner
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
                self.runner.writer.gpu_out(gpu, faults[gpu.uuid], job.config.label)
        self.pool.give_back(gpus)
        self.runner.state.set_pool(self._pool_facts())
        return None

    def _thread(self, job: Job, slot: Slot) -> None:
        error: BaseException | None = None
        try:
            serve_and_sweep(self.servers, self.runner, job.config, list(job.cells), slot)
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
                self.runner.record(cell, "skipped", reason=reason, retryable=True)

    def run(self) -> None:
        """Run every job; return when all ended (raises what a slot or a signal raised)."""
        self.runner.state.set_pool(self._pool_facts())
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
            self.runner.writer.stopping.set()
            self.servers.stop_all()
            for _, _, thread, _ in list(self.running.values()):
                thread.join(timeout=60)
            raise
