"""The pure parts of packing: `nvidia-smi topo -m` parsing, choosing linked GPUs, the
queue order and backfill rule, the simulated schedule, shards."""

from __future__ import annotations

import hashlib

import pytest

from gpudoctor.bench.launch import schedule as sched
from gpudoctor.bench.launch.slots import Gpu, GpuPool, best_set, cap_gpus, gpu_fault, parse_topo
from gpudoctor.bench.plan import Cell, ServerConfig

# The shape `nvidia-smi topo -m` prints on a 4-GPU PCIe box with two NVLink bridges
# (GPU0-GPU2 and GPU1-GPU3 bridged; columns as the driver prints them).
TOPO = """\
\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tSYS\tNV4\tSYS\t0-31\t0\t\tN/A
GPU1\tSYS\t X \tSYS\tNV4\t32-63\t1\t\tN/A
GPU2\tNV4\tSYS\t X \tPXB\t0-31\t0\t\tN/A
GPU3\tSYS\tNV4\tPXB\t X \t32-63\t1\t\tN/A

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
  NV#  = Connection traversing a bonded set of # NVLinks
"""

GPUS = [Gpu(i, f"GPU-{i}") for i in range(4)]


def test_topology_is_parsed_and_a_pair_is_chosen_by_its_nvlink() -> None:
    links = parse_topo(TOPO)
    assert links[(0, 2)] == "NV4" and links[(1, 0)] == "SYS" and links[(2, 3)] == "PXB"
    assert [g.index for g in best_set(GPUS, 2, links)] == [0, 2]
    assert [g.index for g in best_set(GPUS[1:], 2, links)] == [1, 3]
    assert best_set(GPUS, 5, links) is None
    assert [g.index for g in best_set(GPUS, 2, {})] == [0, 1]  # no topology: lowest first


def test_pool_takes_disjoint_sets_and_a_failed_gpu_stays_out() -> None:
    pool = GpuPool(GPUS, parse_topo(TOPO))
    first = pool.take(2, slot=1)
    second = pool.take(2, slot=2)
    assert {g.index for g in first} == {0, 2} and {g.index for g in second} == {1, 3}
    assert pool.take(1, slot=3) is None
    pool.remove(first[0], "ECC")
    pool.give_back(first)
    assert [g.index for g in pool.free()] == [2] and pool.usable == 3


def test_hardware_cap_and_fault_reasons() -> None:
    assert [g.index for g in cap_gpus(GPUS, (3, 1), None)] == [3, 1]
    assert [g.index for g in cap_gpus(GPUS, None, 2)] == [0, 1]
    with pytest.raises(ValueError, match="names GPU 7"):
        cap_gpus(GPUS, (7,), None)
    assert gpu_fault({"ecc_uncorrected_volatile": 3}).startswith("3 uncorrected ECC")
    assert gpu_fault({"remapped_rows": {"pending": 1}}).startswith("a row remap is pending")
    assert gpu_fault({"ecc_uncorrected_volatile": 0, "clocks_event_reasons": 4}) is None


def _job(name: str, tp: int, seconds: float) -> sched.Job:
    config = ServerConfig(name, tp, (), (), (1,), name)
    return sched.Job(config, (Cell(config, 1, name + "c"),), seconds)


def test_largest_first_and_backfill_never_delays_the_head() -> None:
    jobs = sched.make_jobs(
        [(j.config, j.cells) for j in (_job("a", 1, 0), _job("b", 4, 0), _job("c", 2, 0))],
        sched.Estimates({1: 10.0, 2: 10.0, 4: 10.0}, 0.0),
    )
    assert [j.config.name for j in jobs] == ["b", "c", "a"]
    queue = [_job("wide", 4, 100), _job("long", 1, 500), _job("short", 1, 5)]
    # 1 GPU free, 3 busy until t=10: the head (4 GPUs) starts at 10; only "short" ends by then
    assert sched.pick(queue, free=1, usable=4, running_ends=[(10.0, 3)], now=0.0) == 2
    assert sched.pick(queue, free=4, usable=4, running_ends=[], now=0.0) == 0
    assert sched.pick([_job("x", 8, 1)], free=4, usable=4, running_ends=[], now=0.0) is None


def test_simulated_schedule_meets_the_lower_bound_for_equal_jobs() -> None:
    jobs = [_job(f"t{i}", 1, 60.0) for i in range(8)] + [_job("w", 4, 60.0)]
    jobs = sorted(jobs, key=lambda j: -j.gpus)
    placements = sched.simulate(jobs, [0, 1, 2, 3])
    assert sched.makespan(placements) == pytest.approx(sched.ideal_s(jobs, 4)) == 180.0
    assert {p.label: p.wave for p in placements}["w@tp4"] == 1
    assert sorted(len(p.gpus) for p in placements) == [1] * 8 + [4]


def test_shards_split_every_cell_exactly_once() -> None:
    keys = [hashlib.sha256(str(i).encode()).hexdigest()[:16] for i in range(300)]
    owners = [[s for s in range(1, 5) if sched.in_shard(k, (s, 4))] for k in keys]
    assert all(len(o) == 1 for o in owners)
    assert {o[0] for o in owners} == {1, 2, 3, 4}
    assert sched.parse_shard("2/4") == (2, 4)
    for bad in ("0/4", "5/4", "x", "1/0", "2"):
        with pytest.raises(ValueError, match="expected I/N"):
            sched.parse_shard(bad)
