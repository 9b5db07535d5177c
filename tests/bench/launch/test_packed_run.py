"""Several servers at once (:class:`PackedRun`), in-process and fast: each job on its own
GPUs, the GPUs given back when it ends, a GPU that fails its check out of the pool (and in
gpus.jsonl), a job larger than the pool skipped, a smaller job started beside a waiting
large one only when it ends in time, and a slot's error stopping every other server.

Real ``python -m http.server`` processes started by the launcher (tests/bench/launch/
inproc_launch.py); the GPUs are stand-ins declared by ``GPUDOCTOR_FAKE_GPUS`` (a GPU
cannot exist here; ``GPUDOCTOR_FAKE_GPU_FAULTS`` stands for NVML reporting a fault); the
load generator is :class:`GatedLoad` (each job's cells wait for events the test names)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.bench.launch.packed import PackedRun
from gpudoctor.bench.launch.schedule import Job
from gpudoctor.bench.launch.slots import Gpu, GpuPool
from gpudoctor.bench.plan import Plan
from tests.bench.launch.inproc_launch import Launch, http_server_engine, load, plan_text, served_dir

UUIDS = [f"GPU-{i}" for i in range(2)]
WAIT_S = 60  # an event that never comes fails the test (not a timing assumption)


class GatedLoad:
    """Stands for ``measure_cell``: records which job measured on which GPUs, and runs
    the test's ``hooks[label]`` (wait for another job, raise...) before answering."""

    def __init__(self) -> None:
        self.started: dict[str, threading.Event] = {}
        self.hooks: dict[str, Callable[[], None]] = {}
        self.seen: list[tuple[str, tuple[str, ...]]] = []
        self.threads: dict[str, tuple[str, bool]] = {}  # label: (its thread's name, daemon)
        self.lock = threading.Lock()

    def event(self, label: str) -> threading.Event:
        with self.lock:
            return self.started.setdefault(label, threading.Event())

    def __call__(self, target: Any, workload: Any, concurrency: int, slo: Any,
                 telemetry_gpus: list[str] | None = None, **_: Any) -> dict[str, Any]:  # fmt: skip
        label = target.label.rsplit("-c", 1)[0]
        with self.lock:
            self.seen.append((label, tuple(telemetry_gpus or ())))
            me = threading.current_thread()
            self.threads[label] = (me.name, me.daemon)
        self.event(label).set()
        hook = self.hooks.get(label)
        if hook is not None:
            hook()
        return {"num_prompts": 4, "completed": 4, "errors": {},
                "metrics": {"total_output_tokens": 32}}  # fmt: skip


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Declare 2 stand-in GPUs; return the file that declares their faults (empty)."""
    faults = tmp_path / "faults"
    faults.write_text("")
    monkeypatch.setenv("GPUDOCTOR_FAKE_GPUS", ",".join(UUIDS))
    monkeypatch.setenv("GPUDOCTOR_FAKE_GPU_FAULTS", str(faults))
    return faults


CONFIGS = "".join(f'[[configs]]\nname = "{n}"\nenv = {{ JOB = "{n}" }}\n' for n in "abc") + (
    '[[configs]]\nname = "d"\ntp = [2]\n'
)


def _plan(tmp_path: Path) -> Plan:
    engine = http_server_engine(served_dir(tmp_path / "served"))
    return load(tmp_path, plan_text(tmp_path, engine, configs=CONFIGS))


def _jobs(plan: Plan, *spec: tuple[str, float]) -> list[Job]:
    by_name = {c.name: c for c in plan.configs}
    cells = list(plan.cells())
    return [Job(by_name[name], tuple(c for c in cells if c.config.name == name), estimate)
            for name, estimate in spec]  # fmt: skip


def _pool() -> GpuPool:
    return GpuPool([Gpu(i, u, "NVIDIA H200") for i, u in enumerate(UUIDS)])


def _waits_for(load: GatedLoad, label: str) -> Callable[[], None]:
    def wait() -> None:
        assert load.event(label).wait(WAIT_S), f"{label} never started beside this job"

    return wait


def _run(launch: Launch, pool: GpuPool, jobs: list[Job]) -> PackedRun:
    packed = PackedRun(launch.servers, launch.runner, pool, jobs)
    try:
        packed.run()
    finally:
        launch.close()
    return packed


def test_jobs_run_side_by_side_each_on_its_own_gpu_which_comes_back(
    tmp_path: Path, gpus: Path
) -> None:
    plan = _plan(tmp_path)
    gated = GatedLoad()
    gated.hooks = {"a@tp1": _waits_for(gated, "b@tp1"), "b@tp1": _waits_for(gated, "a@tp1")}
    launch = Launch(plan, tmp_path / "run", gated)
    pool = _pool()
    packed = _run(launch, pool, _jobs(plan, ("a", 10), ("b", 10), ("c", 10)))

    records = {r["label"]: r for r in launch.records()}
    assert {k: r["status"] for k, r in records.items()} == {"a@tp1": "ok", "b@tp1": "ok",
                                                            "c@tp1": "ok"}  # fmt: skip
    assert {records["a@tp1"]["gpus"][0], records["b@tp1"]["gpus"][0]} == set(UUIDS)
    assert sorted(r["slot"] for r in records.values()) == [1, 2, 3]
    # each slot's thread says which slot it is (py-spy dump, faulthandler) and never keeps
    # the launcher from exiting
    assert gated.threads == {k: (f"slot-{r['slot']}", True) for k, r in records.items()}
    assert {(label, gpus) for label, gpus in gated.seen} == {
        (r["label"], tuple(r["gpus"])) for r in records.values()
    }
    servers = launch.servers_lines()
    assert sorted(s["slot"] for s in servers) == [1, 2, 3]
    assert all(len(s["gpus"]) == 1 and s["exit_code"] is not None for s in servers)
    assert pool.held == {} and pool.out == {} and packed.running == {} and packed.queue == []
    assert launch.servers.live == {}  # every server stopped
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["pool"] == {"gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200"},
                                      {"index": 1, "uuid": "GPU-1", "name": "NVIDIA H200"}], "out": {}}  # fmt: skip


def test_a_job_larger_than_the_pool_is_skipped_and_nothing_starts_for_it(
    tmp_path: Path, gpus: Path
) -> None:
    plan = _plan(tmp_path)
    launch = Launch(plan, tmp_path / "run", GatedLoad())
    pool = GpuPool([Gpu(0, UUIDS[0])])
    _run(launch, pool, _jobs(plan, ("d", 10)))
    (record,) = launch.records()
    assert (record["label"], record["status"], record["retryable"]) == ("d@tp2", "skipped", True)
    assert record["reason"] == "needs 2 GPU(s); the pool has 1 usable of 1"
    assert launch.servers_lines() == []


def test_a_gpu_that_fails_its_check_leaves_the_pool_and_the_job_runs_on_another(
    tmp_path: Path, gpus: Path
) -> None:
    gpus.write_text("GPU-0 2 uncorrected ECC errors\n")
    plan = _plan(tmp_path)
    gated = GatedLoad()
    launch = Launch(plan, tmp_path / "run", gated)
    pool = _pool()
    _run(launch, pool, _jobs(plan, ("a", 10), ("d", 10)))

    records = {r["label"]: r for r in launch.records()}
    assert records["a@tp1"]["status"] == "ok" and records["a@tp1"]["gpus"] == ["GPU-1"]
    assert records["a@tp1"]["slot"] == 1  # the failed take started no slot
    assert records["d@tp2"]["status"] == "skipped"
    assert records["d@tp2"]["reason"] == "needs 2 GPU(s); the pool has 1 usable of 2"
    (out,) = [json.loads(x) for x in (tmp_path / "run" / "gpus.jsonl").read_text().splitlines()]
    assert (out["uuid"], out["reason"], out["before"]) == ("GPU-0", "2 uncorrected ECC errors",
                                                           "a@tp1")  # fmt: skip
    assert pool.out == {"GPU-0": "2 uncorrected ECC errors"} and pool.held == {}
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["pool"]["out"] == {"GPU-0": "2 uncorrected ECC errors"}


def test_the_healthy_partners_of_a_failing_gpu_return_to_the_pool(
    tmp_path: Path, gpus: Path
) -> None:
    """A TP2 job takes both GPUs; GPU-1 fails its check: GPU-0 goes back to the pool (the
    TP2 job no longer fits and is skipped) and the next job runs on it."""
    gpus.write_text("GPU-1 fell off the bus\n")
    plan = _plan(tmp_path)
    launch = Launch(plan, tmp_path / "run", GatedLoad())
    pool = _pool()
    _run(launch, pool, _jobs(plan, ("d", 10), ("a", 10)))
    records = {r["label"]: r for r in launch.records()}
    assert records["d@tp2"]["status"] == "skipped"
    assert (records["a@tp1"]["status"], records["a@tp1"]["gpus"]) == ("ok", ["GPU-0"])
    assert pool.held == {} and pool.out == {"GPU-1": "fell off the bus"}


def test_a_small_job_starts_beside_a_waiting_large_one_only_if_it_ends_in_time(
    tmp_path: Path, gpus: Path
) -> None:
    """a (TP1) runs; d (TP2) waits for both GPUs; b (TP1) may use the free GPU meanwhile
    only when it is expected to end before a (EASY backfill)."""
    plan = _plan(tmp_path)
    gated = GatedLoad()
    gated.hooks = {"a@tp1": _waits_for(gated, "b@tp1")}  # a ends only once b ran beside it
    launch = Launch(plan, tmp_path / "run", gated)
    _run(launch, _pool(), _jobs(plan, ("a", 1000), ("d", 10), ("b", 500)))
    order = [label for label, _ in gated.seen]
    assert order.index("b@tp1") < order.index("d@tp2")


def test_a_small_job_that_would_delay_the_large_one_waits(tmp_path: Path, gpus: Path) -> None:
    plan = _plan(tmp_path)
    gated = GatedLoad()
    launch = Launch(plan, tmp_path / "run", gated)
    _run(launch, _pool(), _jobs(plan, ("a", 1000), ("d", 10), ("b", 5000)))
    order = [label for label, _ in gated.seen]
    assert order.index("d@tp2") < order.index("b@tp1")


def test_an_error_in_one_slot_stops_every_server_and_goes_on(tmp_path: Path, gpus: Path) -> None:
    plan = _plan(tmp_path)
    gated = GatedLoad()
    launch = Launch(plan, tmp_path / "run", gated)
    processes = []

    def b_runs_until_stopped() -> None:
        (process,) = [p for p in launch.servers.live.values() if p.tag.endswith("slot2/")]
        processes.append(process)
        process.proc.wait(timeout=WAIT_S)  # stopped by the launcher, not by the test

    def a_breaks() -> None:
        _waits_for(gated, "b@tp1")()
        raise OSError("no space left on device")

    gated.hooks = {"a@tp1": a_breaks, "b@tp1": b_runs_until_stopped}
    packed = PackedRun(launch.servers, launch.runner, _pool(), _jobs(plan, ("a", 10), ("b", 10)))
    with pytest.raises(OSError, match="no space left"):
        packed.run()
    assert launch.writer.stopping.is_set()
    assert processes and processes[0].returncode is not None
    assert all(not t.is_alive() for _, _, t, _ in packed.running.values())
    launch.close()
    assert launch.records() == []  # interrupted cells are not recorded: a resume runs them
    assert (tmp_path / "local-quirks.toml").exists() is False  # not a crash of b's config
