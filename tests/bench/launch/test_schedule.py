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


# --- the rules one by one, at their edges -----------------------------------------------


def test_a_shard_is_i_of_n_with_one_line_for_anything_else() -> None:
    assert sched.parse_shard("1/1") == (1, 1) and sched.parse_shard("4/4") == (4, 4)
    for bad in ("-1/2", "3/2", "2/4/5", "/4", "2/", "a/b"):
        with pytest.raises(ValueError) as err:
            sched.parse_shard(bad)
        assert str(err.value) == f"--shard {bad!r}: expected I/N with 1 <= I <= N (e.g. 2/4)"


def test_a_cells_shard_is_fixed_by_its_key_wherever_it_is_computed() -> None:
    """The shards of a Slurm campaign are computed by each task on its own node and again by
    `bench status` and `bench merge`: the first 12 hex digits of the key, modulo N, plus 1."""
    assert sched.shard_of("0000000000070001", 4) == 4
    assert sched.shard_of("00000000000a0000", 4) == 3
    assert sched.shard_of("ffffffffffff", 1) == 1
    assert sched.shard_of("0000000000100000", 4) == 1  # 0x10 = 16
    assert sched.in_shard("0000000000070001", None) and sched.in_shard("0000000000070001", (4, 4))
    assert not sched.in_shard("0000000000070001", (3, 4))


def test_estimates_come_from_measured_cells_and_server_starts() -> None:
    records = [
        {"tp": 1, "status": "ok", "timings": {"cell_s": 10}},
        {"tp": 1, "status": "crashed", "timings": {"cell_s": 40.0}},
        {"tp": 1, "status": "ok", "timings": {"cell_s": 20.0}},
        {"status": "ok", "timings": {"cell_s": 30.0}},  # no tp: TP1
        {"tp": 2, "status": "ok", "timings": {"cell_s": 100.0}},
        {"tp": 2, "status": "failed", "timings": {"cell_s": 1.0}},  # failed: not a cell's time
        {"tp": 2, "status": "skipped", "timings": {"cell_s": 1.0}},
        {"tp": 2, "status": "ok", "timings": {"cell_s": "n/a"}},
        {"tp": 4, "status": "ok", "timings": None},
        {"tp": 4, "status": "ok"},
    ]
    servers = [{"startup_s": 5}, {"startup_s": 9.0}, {"startup_s": 30.0}, {"startup_s": None}, {}]
    est = sched.learn_estimates(records, servers)
    assert est == sched.Estimates({1: 25.0, 2: 100.0}, 9.0)
    assert est.cell(1) == 25.0 and est.cell(2) == 100.0
    assert sched.Estimates({1: 10.0, 2: 40.0, 8: 100.0}, 0).cell(4) == 50.0  # the mean of all
    none = sched.learn_estimates([], [])
    assert none == sched.Estimates({}, 60.0) and none.cell(1) == 60.0


def test_jobs_hold_their_start_and_cells_and_the_widest_longest_go_first() -> None:
    est = sched.Estimates({1: 10.0, 2: 30.0}, 5.0)
    a, b, c, d = (ServerConfig(n, tp, (), (), (1,), n) for n, tp in
                  (("a", 1), ("b", 1), ("c", 2), ("d", 1)))  # fmt: skip
    groups = [(a, [Cell(a, 1, "a1")]), (b, [Cell(b, 1, "b1"), Cell(b, 2, "b2")]), (d, []),
              (c, [Cell(c, 1, "c1")])]  # fmt: skip
    jobs = sched.make_jobs(groups, est)
    assert [(j.config.name, j.estimate_s, j.gpus) for j in jobs] == [
        ("c", 35.0, 2),
        ("b", 25.0, 1),
        ("a", 15.0, 1),
    ]  # d has no pending cell: no job
    assert jobs[1].cells == (Cell(b, 1, "b1"), Cell(b, 2, "b2"))
    twins = sched.make_jobs([(b, [Cell(b, 1, "b1")]), (a, [Cell(a, 1, "a1")])], est)
    assert [j.config.name for j in twins] == ["a", "b"]  # same size, same time: by label
    wide_short = ServerConfig("ws", 4, (), (), (1,), "ws")
    order = sched.make_jobs([(a, [Cell(a, i, f"a{i}") for i in range(9)]),
                             (wide_short, [Cell(wide_short, 1, "w")])], est)  # fmt: skip
    assert [j.config.name for j in order] == ["ws", "a"]  # GPUs before time


def test_a_job_needing_exactly_the_free_gpus_starts_and_a_too_wide_one_is_passed_over() -> None:
    queue = [_job("x8", 8, 1), _job("t4", 4, 50), _job("t1", 1, 5)]
    assert sched.pick(queue, free=4, usable=4, running_ends=[], now=0.0) == 1
    assert sched.pick(queue[:1], free=4, usable=4, running_ends=[], now=0.0) is None
    assert sched.pick([_job("t4", 4, 5)], free=3, usable=4, running_ends=[], now=0.0) is None


def test_backfill_fills_exactly_up_to_the_heads_start_and_no_later() -> None:
    """The head (4 GPUs) waits for 3 GPUs that free at t=10; another GPU frees only at t=50.
    A 1-GPU job may start now if it ends by t=10, when the head can start."""
    running = [(50.0, 1), (10.0, 3)]
    ten = [_job("wide", 4, 100), _job("ten", 1, 10)]
    assert sched.pick(ten, free=1, usable=5, running_ends=running, now=0.0) == 1
    thirty = [_job("wide", 4, 100), _job("thirty", 1, 30)]
    assert sched.pick(thirty, free=1, usable=5, running_ends=running, now=0.0) is None
    assert sched.pick(ten, free=1, usable=5, running_ends=running, now=0.5) is None
    two = [_job("wide", 4, 100), _job("two", 2, 1)]  # ends in time but needs 2 GPUs, 1 free
    assert sched.pick(two, free=1, usable=5, running_ends=running, now=0.0) is None


def test_the_simulated_schedule_takes_the_lowest_gpus_and_counts_waves() -> None:
    jobs = [_job("w", 2, 100.0), _job("a", 1, 30.0), _job("b", 1, 60.0), _job("c", 1, 30.0)]
    placed = sched.simulate(jobs, [4, 5, 6])
    assert [(p.label, p.gpus, p.wave, p.start_s, p.end_s, p.cells) for p in placed] == [
        ("w@tp2", (4, 5), 1, 0.0, 100.0, 1),
        ("a@tp1", (6,), 1, 0.0, 30.0, 1),
        ("b@tp1", (6,), 2, 30.0, 90.0, 1),
        ("c@tp1", (6,), 3, 90.0, 120.0, 1),
    ]
    assert sched.makespan(placed) == 120.0 and sched.makespan([]) == 0.0
    later = sched.simulate([_job("x", 1, 10.0), _job("y", 2, 10.0)], [0, 1])
    assert [(p.label, p.gpus, p.wave, p.start_s) for p in later] == [
        ("x@tp1", (0,), 1, 0.0),
        ("y@tp2", (0, 1), 2, 10.0),
    ]  # y waits for GPU 0: one wave after the wave that held it


def test_a_job_wider_than_the_pool_is_left_out_of_the_schedule() -> None:
    placed = sched.simulate([_job("huge", 8, 10.0), _job("a", 1, 10.0)], [0, 1])
    assert [p.label for p in placed] == ["a@tp1"]
    assert sched.simulate([_job("huge", 8, 10.0)], [0, 1]) == []


def test_the_lower_bound_is_gpu_time_over_gpus_or_the_longest_job() -> None:
    jobs = [_job("w", 2, 100.0), _job("a", 1, 30.0)]
    assert sched.ideal_s(jobs, 2) == 115.0  # (200 + 30) GPU-s over 2 GPUs
    assert sched.ideal_s(jobs, 8) == 100.0  # many GPUs: the longest job
    assert sched.ideal_s([], 4) == 0.0 and sched.ideal_s(jobs, 0) == 0.0


def test_a_small_job_is_backfilled_in_the_simulation_too() -> None:
    jobs = [_job("w", 2, 100.0), _job("h", 3, 50.0), _job("s", 1, 10.0)]
    placed = sched.simulate(jobs, [0, 1, 2])
    assert [(p.label, p.gpus, p.wave, p.start_s) for p in placed] == [
        ("w@tp2", (0, 1), 1, 0.0),
        ("s@tp1", (2,), 1, 0.0),  # ends by t=10, long before h could start
        ("h@tp3", (0, 1, 2), 2, 100.0),
    ]


def test_of_two_jobs_ending_at_once_the_first_started_frees_its_gpus_first() -> None:
    """p (5 s) and a (10 s) start at 0 on GPUs 0 and 1; b takes GPU 0 at 5 and ends at 10
    with a. a, started first, gives GPU 1 back first: c starts there, in wave 2."""
    jobs = [_job("p", 1, 5.0), _job("a", 1, 10.0), _job("b", 1, 5.0), _job("c", 1, 1.0)]
    placed = sched.simulate(jobs, [0, 1])
    assert [(p.label, p.gpus, p.wave, p.start_s) for p in placed] == [
        ("p@tp1", (0,), 1, 0.0),
        ("a@tp1", (1,), 1, 0.0),
        ("b@tp1", (0,), 2, 5.0),
        ("c@tp1", (1,), 2, 10.0),
    ]


def test_one_gpu_has_a_lower_bound_too() -> None:
    assert sched.ideal_s([_job("a", 1, 30.0), _job("b", 1, 20.0)], 1) == 50.0
