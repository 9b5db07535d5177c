"""A bounded worker pool whose every job has a deadline, and a limit per key (node).

- At most ``workers`` jobs run at once, and at most ``per_key`` of one key (one node: an
  sshd allows only so many sessions per connection, MaxSessions defaults to 10).
- Each job runs in its own daemon thread; its worker waits for it at most ``timeout_s``
  seconds. A job still running then is ABANDONED: ``on_timeout`` gives its result, its
  ``abandon`` hook runs in the background (close its connection), and the worker moves on.
  So one hung job costs one slot for ``timeout_s``, never the whole run.
- A job's ``done`` callback may submit more jobs (a node's CT jobs after its connect job).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Job:
    """One unit of work.

    Attributes:
        key: the per-key limit's key (the node's name).
        label: what it is, for thread names and messages (``pve1/ct200``).
        run: the work; returns the result.
        timeout_s: seconds the worker waits for it.
        on_timeout: ``(waited_s) -> result`` when it overruns.
        on_error: ``(exception) -> result`` when ``run`` raises.
        done: ``(result, started_s, finished_s) -> None``; times are seconds since the
            pool's start (``time.monotonic`` based).
        abandon: called in a background thread after a timeout (may block).
    """

    key: str
    label: str
    run: Callable[[], Any]
    timeout_s: float
    on_timeout: Callable[[float], Any]
    on_error: Callable[[BaseException], Any]
    done: Callable[[Any, float, float], None]
    abandon: Callable[[], None] | None = None


class DeadlinePool:
    """Runs submitted jobs with bounded parallelism and deadlines (see the module doc)."""

    def __init__(self, workers: int, per_key: int) -> None:
        if workers < 1 or per_key < 1:
            raise ValueError("workers and per_key must be at least 1")
        self.workers = workers
        self.per_key = per_key
        self.started = time.monotonic()
        self._cond = threading.Condition()
        self._queue: list[Job] = []
        self._inflight: dict[str, int] = {}
        self._outstanding = 0
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"fleet-worker-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def now(self) -> float:
        """Return seconds since the pool started."""
        return time.monotonic() - self.started

    def submit(self, job: Job) -> None:
        """Queue ``job`` (runs in submission order, as keys allow)."""
        with self._cond:
            self._queue.append(job)
            self._outstanding += 1
            self._cond.notify_all()

    def wait(self) -> None:
        """Block until every submitted job (and those their callbacks submit) is done,
        then stop the workers."""
        with self._cond:
            while self._outstanding:
                self._cond.wait()
            self._closed = True
            self._cond.notify_all()

    def _next(self) -> Job | None:
        with self._cond:
            while True:
                for index, job in enumerate(self._queue):
                    if self._inflight.get(job.key, 0) < self.per_key:
                        self._inflight[job.key] = self._inflight.get(job.key, 0) + 1
                        return self._queue.pop(index)
                if self._closed:
                    return None
                self._cond.wait()

    def _work(self) -> None:
        while (job := self._next()) is not None:
            began = self.now()
            result = self._run_with_deadline(job)
            ended = self.now()
            with self._cond:
                self._inflight[job.key] -= 1
                self._cond.notify_all()
            try:
                job.done(result, began, ended)
            finally:
                with self._cond:
                    self._outstanding -= 1
                    self._cond.notify_all()

    def _run_with_deadline(self, job: Job) -> Any:
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = job.run()
            except BaseException as exc:  # reported as the job's result, never lost
                box["error"] = exc

        began = time.monotonic()
        thread = threading.Thread(target=target, name=f"fleet:{job.label}", daemon=True)
        thread.start()
        thread.join(job.timeout_s)
        if thread.is_alive():
            if job.abandon is not None:
                threading.Thread(target=_quietly, args=(job.abandon,), daemon=True).start()
            return job.on_timeout(time.monotonic() - began)
        if "error" in box:
            return job.on_error(box["error"])
        return box.get("result")


def _quietly(func: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):  # best-effort cleanup of an abandoned job
        func()
