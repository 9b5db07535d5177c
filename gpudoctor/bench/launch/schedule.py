"""Which server configuration runs next, on how many GPUs, and what the whole campaign
should take: the queue order, the pick rule the launcher and the dry run share, and the
simulated schedule (``bench run --dry-run``).

A *job* is one server configuration with its pending cells: one server on ``tp`` GPUs
that runs the concurrency sweep. The queue is ordered largest first (most GPUs, then the
longest estimate: LPT, which keeps the tail short); when the head does not fit the free
GPUs, a later job may start only if it is expected to end before the head could start
anyway (EASY backfilling), so a TP4 job is never starved by a stream of TP1 jobs.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpudoctor.bench.plan import Cell, ServerConfig

DEFAULT_CELL_S = 60.0  # a cell's estimate before anything was measured, seconds
DEFAULT_START_S = 60.0  # a server start's estimate before any was measured, seconds


def parse_shard(text: str) -> tuple[int, int]:
    """Return ``(I, N)`` of ``--shard I/N`` (1 <= I <= N); ValueError with one line otherwise."""
    head, sep, tail = text.partition("/")
    try:
        i, n = int(head), int(tail)
    except ValueError:
        i = n = 0
    if not sep or n < 1 or not 1 <= i <= n:
        raise ValueError(f"--shard {text!r}: expected I/N with 1 <= I <= N (e.g. 2/4)")
    return i, n


def shard_of(cell_key: str, n: int) -> int:
    """Return the shard (1..n) a cell belongs to: its key (hex) modulo n, plus one. The
    same key always lands in the same shard, whoever computes it."""
    return int(cell_key[:12], 16) % n + 1


def in_shard(cell_key: str, shard: tuple[int, int] | None) -> bool:
    """Return whether the cell is in ``shard`` (``(I, N)``; None: every cell is)."""
    return shard is None or shard_of(cell_key, shard[1]) == shard[0]


@dataclass(frozen=True)
class Job:
    """One server configuration to run.

    Attributes:
        config: the server configuration (its ``tp`` is the GPUs it needs).
        cells: its cells to measure, in sweep order.
        estimate_s: expected wall time of the job (start + cells), seconds.
    """

    config: ServerConfig
    cells: tuple[Cell, ...]
    estimate_s: float

    @property
    def gpus(self) -> int:
        """Return how many GPUs the job holds (its tensor parallel size)."""
        return self.config.tp


@dataclass(frozen=True)
class Estimates:
    """Per-cell and per-start seconds learned from earlier records (by tp, else overall)."""

    cell_s: dict[int, float]
    start_s: float

    def cell(self, tp: int) -> float:
        """Return the expected seconds of one cell at ``tp``."""
        if tp in self.cell_s:
            return self.cell_s[tp]
        if self.cell_s:
            return statistics.mean(self.cell_s.values())
        return DEFAULT_CELL_S


def learn_estimates(
    records: Sequence[dict[str, Any]], servers: Sequence[dict[str, Any]]
) -> Estimates:
    """Return the estimates from measured cells (``timings.cell_s`` of ok/crashed records,
    median per tp) and server lines (``startup_s``, median)."""
    by_tp: dict[int, list[float]] = {}
    for r in records:
        cell_s = (r.get("timings") or {}).get("cell_s")
        if isinstance(cell_s, (int, float)) and r.get("status") in ("ok", "crashed"):
            by_tp.setdefault(int(r.get("tp") or 1), []).append(float(cell_s))
    starts = [
        float(s["startup_s"]) for s in servers if isinstance(s.get("startup_s"), (int, float))
    ]
    return Estimates(
        {tp: statistics.median(v) for tp, v in by_tp.items()},
        statistics.median(starts) if starts else DEFAULT_START_S,
    )


def make_jobs(groups: Sequence[tuple[ServerConfig, Sequence[Cell]]], est: Estimates) -> list[Job]:
    """Return one job per (config, pending cells), ordered largest first (tp, then estimate)."""
    jobs = [
        Job(config, tuple(cells), est.start_s + est.cell(config.tp) * len(cells))
        for config, cells in groups
        if cells
    ]
    return sorted(jobs, key=lambda j: (-j.gpus, -j.estimate_s, j.config.label))


def pick(queue: Sequence[Job], free: int, usable: int, running_ends: Sequence[tuple[float, int]],
         now: float) -> int | None:  # fmt: skip
    """Return the index in ``queue`` of the job to start now, or None to wait.

    ``free``: GPUs free now; ``usable``: GPUs in the pool; ``running_ends``: (expected end,
    GPUs) of each running job. A job needing more GPUs than ``usable`` is never picked
    (the caller records it as not runnable)."""
    runnable = [i for i, j in enumerate(queue) if j.gpus <= usable]
    if not runnable:
        return None
    head = runnable[0]
    if queue[head].gpus <= free:
        return head
    # EASY backfill: when could the head start, given the running jobs' expected ends?
    need, have, shadow = queue[head].gpus, free, now
    for end, gpus in sorted(running_ends):
        have += gpus
        shadow = end
        if have >= need:
            break
    for i in runnable[1:]:
        if queue[i].gpus <= free and now + queue[i].estimate_s <= shadow:
            return i
    return None


@dataclass(frozen=True)
class Placement:
    """One job of the simulated schedule: GPUs (pool positions), wave, start/end seconds."""

    label: str
    gpus: tuple[int, ...]
    wave: int
    start_s: float
    end_s: float
    cells: int


def simulate(jobs: Sequence[Job], gpu_indices: Sequence[int]) -> list[Placement]:
    """Return the schedule the launcher would follow if every job took its estimate:
    the same :func:`pick` rule, GPUs taken lowest index first. A job's wave is 1 when it
    starts at once, else one more than the latest wave whose GPUs it takes over."""
    queue = list(jobs)
    free = list(gpu_indices)
    wave_of_gpu = dict.fromkeys(gpu_indices, 0)
    running: list[tuple[float, int, tuple[int, ...]]] = []  # (end, seq, gpus)
    out: list[Placement] = []
    now, seq = 0.0, 0
    while queue:
        ends = [(end, len(g)) for end, _, g in running]
        i = pick(queue, len(free), len(gpu_indices), ends, now)
        if i is not None:
            job = queue.pop(i)
            taken, free = tuple(sorted(free)[: job.gpus]), sorted(free)[job.gpus :]
            wave = 1 + max(wave_of_gpu[g] for g in taken)
            for g in taken:
                wave_of_gpu[g] = wave
            out.append(Placement(job.config.label, taken, wave, now, now + job.estimate_s,
                                 len(job.cells)))  # fmt: skip
            heapq.heappush(running, (now + job.estimate_s, seq, taken))
            seq += 1
            continue
        if not running:
            break  # what is left needs more GPUs than the pool has
        end, _, gpus = heapq.heappop(running)
        now = end
        free.extend(gpus)
    return out


def makespan(placements: Sequence[Placement]) -> float:
    """Return the expected length of a schedule, seconds (0 when empty)."""
    return max((p.end_s for p in placements), default=0.0)


def ideal_s(jobs: Sequence[Job], gpus: int) -> float:
    """Return the lower bound of any schedule: GPU-seconds / GPUs, or the longest job."""
    if not jobs or gpus <= 0:
        return 0.0
    return max(sum(j.estimate_s * j.gpus for j in jobs) / gpus, max(j.estimate_s for j in jobs))
