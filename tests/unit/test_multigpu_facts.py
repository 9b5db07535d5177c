"""gpudoctor/facts/multigpu.py: the GPU counts of each layer, NCCL's /dev/shm need, and the
P2P probe's output read into pairs, links, slow pairs and the bandwidth matrix (what
``gpu.count`` and ``nccl.p2p`` report). The probe's output is what
gpudoctor/probes/p2p_probe.py prints; a machine with several GPUs cannot exist here, so
tests/fakes/answering_host.py answers the probe's command (the real probe on the fake
driver: test_multigpu.py)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from gpudoctor.facts.gpu import GpuProbe, parse_probe_output
from gpudoctor.facts.multigpu import (
    MIB,
    GpuInventory,
    P2PProbe,
    PairResult,
    bandwidth_matrix,
    gpu_inventory,
    gpu_node_minors,
    nccl_shm_bytes,
    pair_from_stage,
    parse_p2p_output,
    probe_source,
    run_p2p_probe,
    slow_pairs,
)
from gpudoctor.hosts.base import CommandResult
from tests.fakes.answering_host import AnsweringHost

PROBES = Path(__file__).resolve().parents[2] / "gpudoctor" / "probes"


def lines(*objs: object) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


def lister(tree: dict[str, list[str]]):
    """Return a list_dir over ``tree`` ({dir: names}); a dir not in it raises ENOENT."""

    def list_dir(path: str) -> list[str]:
        if path not in tree:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return tree[path]

    return list_dir


# ---------------------------------------------------------------------------- GPU count


def test_gpu_nodes_are_the_nvidiaN_minors_sorted():
    names = ["nvidiactl", "nvidia10", "nvidia-uvm", "nvidia2", "nvidia0", "nvidia1x", "xnvidia3"]
    assert gpu_node_minors(lister({"/dev": names})) == (0, 2, 10)
    assert gpu_node_minors(lister({})) == ()


def probe(*objs: object) -> GpuProbe:
    return GpuProbe(stages=parse_probe_output(lines(*objs)))


H200 = {"name": "NVIDIA H200"}


def test_the_inventory_counts_each_layer_and_names_cudas_gpus():
    gpu = probe(
        {"stage": "env", "env": {"CUDA_VISIBLE_DEVICES": "1,0"}},
        {"stage": "nvml", "init": 0, "devices": [{"name": "nvml0"}, {"name": "nvml1"}, {}]},
        {"stage": "cuda", "init": 0, "device_count": 2, "devices": [H200, {"name": "B"}]},
    )
    tree = {
        "/dev": ["nvidia0", "nvidia1", "nvidiactl"],
        "/proc/driver/nvidia/gpus": ["0000:18:00.0", "0000:28:00.0", "0000:38:00.0"],
    }
    files = {
        "/proc/driver/nvidia/gpus/0000:18:00.0/information": "Model: X\nDevice Minor: \t 4\n",
        "/proc/driver/nvidia/gpus/0000:28:00.0/information": "Device Minor:1\n",
        "/proc/driver/nvidia/gpus/0000:38:00.0/information": "Device Minor: 0\nIRQ: 3\n",
    }
    inv = gpu_inventory(gpu, lister(tree), files.get)
    assert inv == GpuInventory(
        nvml=3,
        cuda=2,
        kernel=3,
        nodes=(0, 1),
        kernel_minors=(0, 1, 4),
        names=("NVIDIA H200", "B"),
        cuda_visible_devices="1,0",
    )
    assert inv.visible == 2
    assert inv.missing_nodes == (4,)


def test_a_failed_cuda_init_counts_nvmls_gpus_and_names_them():
    gpu = probe(
        {"stage": "nvml", "init": 0, "devices": [{"name": "A"}, {"name": "B"}]},
        {"stage": "cuda", "init": 100, "device_count": 0, "devices": [H200]},
    )
    inv = gpu_inventory(gpu, lister({"/dev": []}))
    assert (inv.nvml, inv.cuda, inv.visible, inv.names) == (2, None, 2, ("A", "B"))
    assert inv.kernel is None and inv.kernel_minors == () and inv.missing_nodes == ()
    assert inv.cuda_visible_devices is None


def test_a_failed_nvml_init_counts_none_and_cudas_zero_is_zero():
    gpu = probe(
        {"stage": "nvml", "init": 9, "devices": [{"name": "A"}]},
        {"stage": "cuda", "init": 0, "device_count": 0},
        {"stage": "env", "env": None},
    )
    inv = gpu_inventory(gpu, lister({"/dev": []}))
    assert (inv.nvml, inv.cuda, inv.visible, inv.names) == (None, 0, 0, ())
    assert gpu_inventory(probe({"stage": "nvml", "init": 0}), lister({})).nvml == 0


def test_kernel_minors_are_used_only_when_every_gpu_gave_one():
    tree = {"/dev": ["nvidia0"], "/proc/driver/nvidia/gpus": ["a", "b"]}
    files = {"/proc/driver/nvidia/gpus/a/information": "Device Minor: 5\n"}
    inv = gpu_inventory(probe(), lister(tree), files.get)
    assert inv.kernel == 2 and inv.kernel_minors == ()
    assert inv.missing_nodes == (1,)  # the minors 0..kernel-1 when the driver did not say
    none = gpu_inventory(probe(), lister({"/proc/driver/nvidia/gpus": []}))
    assert (none.kernel, none.kernel_minors, none.missing_nodes) == (0, (), ())


def test_the_minor_is_read_only_from_a_line_that_starts_with_it():
    tree = {"/proc/driver/nvidia/gpus": ["a"]}
    files = {"/proc/driver/nvidia/gpus/a/information": "Old Device Minor: 3\nDevice Minor: 7\n"}
    assert gpu_inventory(probe(), lister(tree), files.get).kernel_minors == (7,)


def test_the_inventory_evidence_names_each_count_and_node():
    inv = GpuInventory(nvml=2, cuda=None, kernel=None, nodes=(0, 1), cuda_visible_devices="")
    assert inv.evidence() == [
        "CUDA devices (cuDeviceGetCount): N/A",
        "NVML devices (nvidia-smi -L): 2",
        "kernel driver GPUs (ls /proc/driver/nvidia/gpus): N/A",
        "GPU nodes here: /dev/nvidia0, /dev/nvidia1",
        "CUDA_VISIBLE_DEVICES=",
    ]
    bare = GpuInventory(nvml=None, cuda=0, kernel=8, nodes=())
    assert bare.evidence() == [
        "CUDA devices (cuDeviceGetCount): 0",
        "NVML devices (nvidia-smi -L): N/A",
        "kernel driver GPUs (ls /proc/driver/nvidia/gpus): 8",
        "GPU nodes here: none",
    ]
    assert bare.missing_nodes == tuple(range(8))


def test_missing_nodes_follow_the_drivers_minors():
    inv = GpuInventory(nvml=8, cuda=8, kernel=3, nodes=(0, 2), kernel_minors=(0, 2, 6))
    assert inv.missing_nodes == (6,)


@pytest.mark.parametrize(
    ("gpus", "need"), [(0, 0), (1, 0), (2, 256 * MIB), (4, 512 * MIB), (8, 1024 * MIB)]
)
def test_ncclss_shm_need_is_128_mib_per_gpu_from_two_gpus(gpus, need):
    assert nccl_shm_bytes(gpus) == need
    assert MIB == 1024 * 1024


# ---------------------------------------------------------------------------- P2P output


def test_probe_sources_are_the_probe_scripts():
    for name in ("p2p_probe", "allreduce_probe"):
        assert probe_source(name) == (PROBES / f"{name}.py").read_text()


P2P_OK = lines(
    {"stage": "init", "started": True},
    {"stage": "init", "init": 0, "device_count": 2},
    {"stage": "topology", "links": {"0-1": {"level": "NV18", "nvlink": "OK", "read": "OK"}}},
    {"stage": "setup", "gpus": 2},
    {"stage": "pair:0-1", "started": True},
    {"stage": "pair:0-1", "can_access_peer": 1, "enable_rc": 0, "enable_name": "CUDA_SUCCESS",
     "copy_ok": True, "gbps": 391.5, "pair_s": 0.25},
    {"stage": "pair:1-0", "can_access_peer": 1, "enable_rc": 704, "copy_ok": False,
     "mismatch": {"dst_looks": "zeroed", "bad_chunks": 8}, "error": "copy differs"},
    {"stage": "done"},
)  # fmt: skip


def test_a_finished_probe_gives_each_pair_and_link():
    p2p = parse_p2p_output(P2P_OK, timed_out=False, returncode=0, stderr="", timeout_s=60.0)
    assert p2p.init == {"init": 0, "device_count": 2}
    assert p2p.device_count == 2
    assert p2p.links == {(0, 1): {"level": "NV18", "nvlink": "OK", "read": "OK"}}
    assert p2p.pairs == (
        PairResult(0, 1, 1, 0, "CUDA_SUCCESS", True, {}, 391.5, "", 0.25, True),
        PairResult(1, 0, 1, 704, None, False, {"dst_looks": "zeroed", "bad_chunks": 8}, None,
                   "copy differs", None, True),
    )  # fmt: skip
    assert (p2p.setup_error, p2p.unfinished_stage, p2p.finished) == ("", "", True)
    assert p2p.timeout_s == 60.0 and p2p.hung_pair is None


def test_a_probe_killed_in_a_copy_names_the_pair_it_hung_in():
    stdout = lines(
        {"stage": "init", "init": 0, "device_count": 4},
        {"stage": "pair:0-1", "copy_ok": True, "gbps": 20.0},
        {"stage": "pair:2-3", "started": True},
        {"stage": "pair:3-2", "started": True},
    )
    p2p = parse_p2p_output(stdout, timed_out=True, returncode=-9, stderr="tail")
    assert p2p.unfinished_stage == "pair:2-3" and not p2p.finished
    assert p2p.hung_pair == PairResult(2, 3, finished=False)
    assert (p2p.returncode, p2p.stderr) == (-9, "tail")
    assert parse_p2p_output(stdout, timed_out=False).hung_pair is None


def test_a_setup_failure_is_kept_and_no_init_means_no_gpus():
    stdout = lines({"stage": "setup", "error": "cuCtxCreate returned 2"})
    p2p = parse_p2p_output(stdout)
    assert p2p.setup_error == "cuCtxCreate returned 2"
    assert p2p.init == {} and p2p.device_count == 0 and p2p.pairs == () and p2p.links == {}
    assert parse_p2p_output(lines({"stage": "init", "device_count": None})).device_count == 0
    assert parse_p2p_output(lines({"stage": "setup", "error": 7})).setup_error == "7"


def test_link_values_are_text_and_an_error_is_text():
    stdout = lines(
        {"stage": "topology", "links": {"2-10": {"level": 3, "read": "OK"}}},
        {"stage": "pair:10-2", "error": 700},
    )
    p2p = parse_p2p_output(stdout)
    assert p2p.links == {(2, 10): {"level": "3", "read": "OK"}}
    assert p2p.pairs[0].error == "700" and p2p.pairs[0].label == "GPU 10 -> GPU 2"


def test_pair_from_stage_reads_a_pair_whose_mismatch_is_null():
    stage = parse_probe_output(lines({"stage": "pair:1-3", "mismatch": None}))["pair:1-3"]
    assert pair_from_stage(stage) == PairResult(1, 3)


@pytest.mark.parametrize(
    ("can", "rc", "enabled"),
    [
        (1, 0, True),
        (1, 704, True),
        (1, 1, False),
        (0, 0, False),
        (None, 0, False),
        (1, None, False),
    ],
)
def test_a_pair_went_over_p2p_only_when_peer_access_was_possible_and_enabled(can, rc, enabled):
    assert PairResult(0, 1, can_access_peer=can, enable_rc=rc).peer_enabled is enabled


# ---------------------------------------------------------------------------- links


def links(**by_pair: dict[str, str]) -> P2PProbe:
    return P2PProbe(init={}, pairs=(), links={tuple(map(int, k[1:].split("_"))): v
                                              for k, v in by_pair.items()})  # fmt: skip


@pytest.mark.parametrize(
    ("info", "text"),
    [
        ({"nvlink": "OK", "level": "NV18", "read": "OK", "write": "OK"}, "NVLink"),
        ({"level": "PIX"}, "PCIe PIX"),
        ({"nvlink": "NS", "read": "OK", "write": "OK"}, "PCIe ?"),
        ({"level": "SYS", "read": "TNS", "write": "TNS"}, "PCIe SYS, P2P TNS (topology not supported)"),
        ({"level": "SYS", "read": "CNS", "write": "CNS"}, "PCIe SYS, P2P CNS (chipset not supported)"),
        ({"level": "NODE", "read": "ZZ", "write": "ZZ"}, "PCIe NODE, P2P ZZ (?)"),
        ({"level": "PHB", "read": "OK", "write": "NS"}, "PCIe PHB, P2P read OK write NS"),
        ({"level": "PHB", "read": "OK"}, "PCIe PHB, P2P read OK write None"),
    ],
)  # fmt: skip
def test_link_says_how_nvml_connects_two_gpus_and_the_drivers_p2p_verdict(info, text):
    p2p = links(p0_1=info)
    assert p2p.link(0, 1) == text
    assert p2p.link(1, 0) == text  # either order


def test_an_unknown_link_is_empty():
    assert links(p0_1={}).link(0, 1) == ""
    assert links(p0_1={"level": "PIX"}).link(0, 2) == ""


def test_topology_lines_group_the_pairs_by_link_in_pair_order():
    p2p = links(
        p2_3={"nvlink": "OK"},
        p0_1={"nvlink": "OK"},
        p1_2={"level": "SYS"},
        p0_2={"level": "SYS"},
    )
    assert p2p.topology_lines() == [
        "topology NVLink: 0-1, 2-3",
        "topology PCIe SYS: 0-2, 1-2",
    ]


# ---------------------------------------------------------------------------- bandwidth


def pair(src: int, dst: int, gbps: float | None, peer: bool = True, ok: bool = True) -> PairResult:
    return PairResult(src, dst, can_access_peer=1 if peer else 0, enable_rc=0, copy_ok=ok,
                      gbps=gbps)  # fmt: skip


def test_a_pair_far_below_its_peers_is_slow():
    pairs = [pair(0, 1, 20.0), pair(1, 0, 22.0), pair(0, 2, 21.0), pair(2, 0, 4.0)]
    assert slow_pairs(pairs) == [(pairs[3], 20.5)]


def test_a_pair_at_exactly_half_the_median_is_not_slow():
    pairs = [pair(0, 1, 20.0), pair(1, 0, 20.0), pair(0, 2, 10.0)]
    assert slow_pairs(pairs) == []
    assert slow_pairs(pairs, ratio=0.51) == [(pairs[2], 20.0)]


def test_staged_pairs_are_compared_with_staged_ones_only():
    nvlink = [pair(0, 1, 300.0), pair(1, 0, 310.0), pair(2, 3, 305.0)]
    staged = [pair(0, 2, 20.0, peer=False), pair(2, 0, 21.0, peer=False), pair(1, 3, 5.0, False)]
    assert slow_pairs(nvlink + staged) == [(staged[2], 20.0)]


def test_slow_pairs_of_both_classes_are_listed_p2p_ones_first():
    nvlink = [pair(0, 1, 300.0), pair(1, 0, 310.0), pair(2, 3, 100.0)]
    staged = [pair(0, 2, 20.0, peer=False), pair(2, 0, 21.0, peer=False), pair(1, 3, 5.0, False)]
    assert slow_pairs(staged + nvlink) == [(nvlink[2], 300.0), (staged[2], 20.0)]


def test_staged_pairs_are_judged_even_when_too_few_p2p_pairs_were_measured():
    nvlink = [pair(0, 1, 300.0), pair(1, 0, 3.0)]
    staged = [pair(0, 2, 20.0, peer=False), pair(2, 0, 21.0, peer=False), pair(1, 3, 5.0, False)]
    assert slow_pairs(nvlink + staged) == [(staged[2], 20.0)]


def test_fewer_than_three_measured_pairs_of_a_class_are_not_judged():
    pairs = [
        pair(0, 1, 20.0),
        pair(1, 0, 1.0),
        pair(0, 2, None),  # not measured
        pair(2, 0, 20.0, ok=False),  # a wrong copy is no bandwidth sample
    ]
    assert slow_pairs(pairs) == []


def test_the_bandwidth_matrix_marks_the_diagonal_unmeasured_and_staged_pairs():
    pairs = [pair(0, 1, 391.25), pair(1, 0, 21.04, peer=False), pair(0, 2, None)]
    assert bandwidth_matrix(pairs, 3) == [
        "GB/s src\\dst       0       1       2",
        "           0       -  391.2        x",  # a P2P value, then its blank mark
        "           1   21.0*       -       x",
        "           2       x       x       -",
    ]


# ---------------------------------------------------------------------------- running it


def test_the_p2p_probe_runs_isolated_with_its_size_and_repetitions():
    stderr = "w" * 10 + "e" * 2000
    host = AnsweringHost(answer=CommandResult((), 3, P2P_OK, stderr, True, 9.0))
    host.python = "/usr/bin/python3"
    p2p = run_p2p_probe(host, 45.0, size_mib=8, reps=2)
    argv, timeout = host.ran[0]
    assert argv == ["/usr/bin/python3", "-I", "-S", "-c", probe_source("p2p_probe"),
                    "--size-mib", "8", "--reps", "2"]  # fmt: skip
    assert timeout == 45.0
    assert (p2p.timed_out, p2p.returncode, p2p.stderr, p2p.timeout_s) == (
        True, 3, "e" * 2000, 45.0)  # fmt: skip
    assert len(p2p.pairs) == 2 and p2p.finished


def test_the_p2p_probe_copies_32_mib_five_times_by_default():
    host = AnsweringHost(answer=CommandResult((), 0, ""))
    run_p2p_probe(host, 10.0)
    assert host.ran[0][0][5:] == ["--size-mib", "32", "--reps", "5"]
