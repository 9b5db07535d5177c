"""gpu.count and nccl.p2p on recorded machines and on the fake multi-GPU driver (the real P2P
probe as a child process); the multi-GPU checks through the real CLI on this GPU-less machine.
nccl.allreduce: test_multigpu_allreduce.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.facts.multigpu import (
    MIB,
    gpu_node_minors,
    nccl_shm_bytes,
    parse_p2p_output,
    slow_pairs,
)
from gpudoctor.model import Status
from tests.unit.multigpu_host import (
    MultiGpuHost,
    build_fake_libcuda,
    findings,
    multi_gpu_host,
    only,
    recorded,
    run,
)
from tests.unit.scenarios import h200_host

REPO = Path(__file__).resolve().parents[2]
LIVE_TIMEOUT = 120.0  # the probe's own timeout when it runs for real here (a busy 2-core CI box)


@pytest.fixture(scope="session")
def fake_cuda_dir(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fake libcuda.so.1 (apt-get install gcc)")
    return build_fake_libcuda(tmp_path_factory.mktemp("fake-cuda"))


@pytest.fixture
def fake_driver(fake_cuda_dir, monkeypatch):
    """Put the fake libcuda.so.1 first on the loader path of the probes' child processes."""
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_cuda_dir))
    for key in list(os.environ):
        if key.startswith(("FAKE_CUDA_", "FAKE_NVML_")):
            monkeypatch.delenv(key)

    def configure(**env: str) -> None:
        """Set FAKE_CUDA_<KEY> (FAKE_NVML_<KEY> for nvml_* keys) for the probe's child."""
        for key, value in env.items():
            name = key.upper() if key.startswith("nvml_") else f"CUDA_{key.upper()}"
            monkeypatch.setenv(f"FAKE_{name}", value)

    return configure


# ---------------------------------------------------------------------------- gpu.count


def test_gpu_count_reports_the_count_without_an_expectation():
    f = only(run(multi_gpu_host(8), only=("gpu.count",)), "gpu.count")
    assert f.status == Status.PASS
    assert f.message == "8 GPU(s) visible (NVIDIA H200)."
    assert "kernel driver GPUs (ls /proc/driver/nvidia/gpus): 8" in f.evidence


def test_gpu_count_passes_when_enough_are_visible():
    f = only(run(multi_gpu_host(8), only=("gpu.count",), expect_gpus=4), "gpu.count")
    assert f.status == Status.PASS and f.message.endswith("; 4 needed.")


def test_gpu_count_names_the_gpus_missing_from_the_container():
    """The host's driver has 8 GPUs, the CT got /dev/nvidia0..3 only: TP8 cannot run."""
    host = multi_gpu_host(4, nodes=4, kernel_gpus=8)
    f = only(run(host, only=("gpu.count",), expect_gpus=8, ct="200"), "gpu.count")
    assert f.status == Status.FAIL
    assert f.message.startswith(
        "4 GPU(s) visible, but the workload needs 8: the host's driver has 8"
    )
    assert (
        "/dev/nvidia4, /dev/nvidia5, /dev/nvidia6, /dev/nvidia7 are not in this system" in f.message
    )
    assert (
        "lxc.mount.entry: /dev/nvidia7 dev/nvidia7 none bind,optional,create=file" in f.remediation
    )
    assert "/etc/pve/lxc/200.conf" in f.remediation


def test_gpu_count_reads_the_minors_of_the_hosts_gpus():
    """Minors follow the host's PCI order, not 0..N-1 inside the CT: read "Device Minor:"."""
    host = multi_gpu_host(2, nodes=2, kernel_gpus=4)
    infos = sorted(p for p in host.files if p.startswith("/proc/driver/nvidia/gpus/"))
    for path, minor in zip(infos, (0, 1, 6, 7), strict=True):
        host.files[path] = f"Model: \t\t NVIDIA H200\nDevice Minor: \t {minor}\n"
    f = only(run(host, only=("gpu.count",), expect_gpus=4), "gpu.count")
    assert "/dev/nvidia6, /dev/nvidia7 are not in this system" in f.message


def test_gpu_count_blames_cuda_visible_devices():
    host = multi_gpu_host(8)
    host.probe_lines[2]["device_count"] = 2
    host.probe_lines[2]["devices"] = host.probe_lines[2]["devices"][:2]
    host.probe_lines[0]["env"] = {"CUDA_VISIBLE_DEVICES": "0,1"}
    f = only(run(host, only=("gpu.count",), expect_gpus=4), "gpu.count")
    assert f.status == Status.FAIL
    assert "NVML sees 8 but CUDA_VISIBLE_DEVICES=0,1 hides some" in f.message
    assert "CUDA_VISIBLE_DEVICES" in f.remediation


def test_gpu_count_points_at_a_failed_gpu_when_nodes_are_all_there():
    host = multi_gpu_host(8)
    host.probe_lines[2]["device_count"] = 7
    host.probe_lines[2]["devices"] = host.probe_lines[2]["devices"][:7]
    f = only(run(host, only=("gpu.count",), expect_gpus=8), "gpu.count")
    assert f.status == Status.FAIL
    assert "the kernel driver lists 8 GPUs, so the others are hidden or failed" in f.message
    assert "Xid 79" in f.remediation


def test_gpu_count_warns_on_mixed_models():
    host = multi_gpu_host(2)
    host.probe_lines[2]["devices"][1]["name"] = "NVIDIA H100 80GB HBM3"
    f = only(run(host, only=("gpu.count",)), "gpu.count")
    assert f.status == Status.WARN and "different models" in f.message


# ---------------------------------------------------------------------------- nccl.p2p, live probe


def test_p2p_skips_on_one_gpu_without_running_a_probe():
    host = MultiGpuHost(
        **{k: getattr(h200_host(), k) for k in ("files", "nodes", "probe_lines", "disk")}
    )
    f = only(run(host, only=("nccl.p2p",)), "nccl.p2p")
    assert f.status == Status.SKIP
    assert f.message == "Only 1 GPU visible to CUDA here: peer-to-peer needs two or more."
    assert host.calls == []


def test_p2p_healthy_4_gpus_through_the_real_probe(fake_driver):
    fake_driver(devices="4", nvml_nvlink="1")
    host = multi_gpu_host(4)
    host.p2p_live = True
    f = only(run(host, only=("nccl.p2p",), probe_timeout_s=LIVE_TIMEOUT), "nccl.p2p")
    assert f.status == Status.PASS, f
    assert f.message == (
        "All 12 ordered pairs of 4 GPUs: peer access on, 32 MiB copies byte-exact, 370 GB/s."
    )
    assert "topology NVLink: 0-1, 0-2, 0-3, 1-2, 1-3, 2-3" in f.evidence
    assert f.evidence[0].startswith("GB/s src\\dst")
    assert host.calls == ["p2p"]


def test_p2p_detects_silent_corruption(fake_driver):
    fake_driver(devices="2", zero_copy="0-1")
    host = multi_gpu_host(2)
    host.p2p_live = True
    report = run(host, only=("nccl.p2p",), probe_timeout_s=LIVE_TIMEOUT)
    fails = findings(report, "nccl.p2p", Status.FAIL)
    assert [f.subject for f in fails] == ["GPU 0 -> GPU 1"]
    assert "Silent corruption" in fails[0].message
    assert "holds zeros in 8192 of 8192 4 KiB blocks (first at byte 0)" in fails[0].message
    for needle in ("iommu=pt", "setpci -s <bridge BDF> ECAP_ACS+6.w=0000", "NCCL_P2P_DISABLE=1"):
        assert needle in fails[0].remediation


def test_p2p_warns_on_pairs_without_peer_access(fake_driver):
    fake_driver(devices="4", no_peer="0-2,1-3", nvml_level="10")
    host = multi_gpu_host(4)
    host.p2p_live = True
    f = only(run(host, only=("nccl.p2p",), probe_timeout_s=LIVE_TIMEOUT), "nccl.p2p")
    assert f.status == Status.WARN
    assert f.message.startswith(
        "4 of 12 pairs cannot use peer access (cuDeviceCanAccessPeer = 0: "
        "0->2, 1->3, 2->0, 3->1); NVML says PCIe SYS, P2P TNS (topology not supported) "
        "for 0-2, 1-3: NCCL routes them through host memory"
    )
    assert "topology PCIe PIX: 0-1, 0-3, 1-2, 2-3" in f.evidence
    assert "20.0*" in "\n".join(f.evidence)


def test_p2p_flags_a_pair_far_below_the_others(fake_driver):
    fake_driver(devices="4", slow="2-3:18.5", nvml_nvlink="1")
    host = multi_gpu_host(4)
    host.p2p_live = True
    f = only(run(host, only=("nccl.p2p",), probe_timeout_s=LIVE_TIMEOUT), "nccl.p2p")
    assert f.status == Status.WARN
    assert f.message.startswith(
        "2 pair(s) copy far below the others: GPU 2 -> GPU 3 18.5 GB/s "
        "vs median 370.0 (NVLink); GPU 3 -> GPU 2 18.5 GB/s vs median 370.0 (NVLink)."
    )


def test_p2p_nvlink_pairs_copying_at_host_speed(fake_driver):
    """NVML reports NVLink, but every copy is staged through the host (peer access off)."""
    fake_driver(devices="2", nvml_nvlink="1", gbps="9.5")
    host = multi_gpu_host(2)
    host.p2p_live = True
    f = only(run(host, only=("nccl.p2p",), probe_timeout_s=LIVE_TIMEOUT), "nccl.p2p")
    assert f.status == Status.WARN
    assert f.message.startswith(
        "2 pair(s) joined by NVLink (per NVML) copy at 9.5 GB/s, below even one NVLink's "
        "15 GB/s: 0->1, 1->0."
    )


def test_p2p_names_the_pair_whose_copy_hangs(fake_driver):
    fake_driver(devices="3", hang="0-1")
    host = multi_gpu_host(3)
    host.p2p_live = True
    f = only(run(host, only=("nccl.p2p",), probe_timeout_s=8, timeout_s=2), "nccl.p2p")
    assert f.status == Status.FAIL and f.subject == "GPU 0 -> GPU 1"
    assert "did not complete within 8 s: P2P traffic between them is being dropped" in f.message
    assert "(5 later pair(s) not tested)" in f.message


def test_p2p_enable_peer_access_error(fake_driver):
    fake_driver(devices="2", enable_rc="0-1:217")
    host = multi_gpu_host(2)
    host.p2p_live = True
    fails = findings(
        run(host, only=("nccl.p2p",), probe_timeout_s=LIVE_TIMEOUT), "nccl.p2p", Status.FAIL
    )
    assert [f.subject for f in fails] == ["GPU 0 -> GPU 1"]
    assert (
        "cuCtxEnablePeerAccess returned 217 CUDA_ERROR_PEER_ACCESS_UNSUPPORTED" in fails[0].message
    )


def test_p2p_sticky_cuda_error_is_one_finding(fake_driver):
    fake_driver(devices="3", fault="0-2")
    host = multi_gpu_host(3)
    host.p2p_live = True
    fails = findings(
        run(host, only=("nccl.p2p",), probe_timeout_s=LIVE_TIMEOUT), "nccl.p2p", Status.FAIL
    )
    assert [f.subject for f in fails] == ["GPU 0 -> GPU 2"]
    assert fails[0].message == (
        "The peer copy GPU 0 -> GPU 2 failed: cuMemcpyPeer returned 700 "
        "CUDA_ERROR_ILLEGAL_ADDRESS (and 4 more pair(s): 1->0, 1->2, 2->0, 2->1)."
    )


def test_p2p_full_gpu_memory_is_a_warning_not_a_fault(fake_driver):
    fake_driver(devices="2", oom_device="1")
    host = multi_gpu_host(2)
    host.p2p_live = True
    f = only(run(host, only=("nccl.p2p",), probe_timeout_s=LIVE_TIMEOUT), "nccl.p2p")
    assert f.status == Status.WARN
    assert f.message.startswith(
        "Setting up a context and 2 x 32 MiB on every GPU failed: "
        "cuMemAlloc_v2 returned 2 CUDA_ERROR_OUT_OF_MEMORY: the GPUs' "
        "memory is taken"
    )


def test_p2p_cuinit_failing_in_the_probe(fake_driver):
    fake_driver(devices="2", init_rc="999")
    host = multi_gpu_host(2)
    host.p2p_live = True
    f = only(run(host, only=("nccl.p2p",), probe_timeout_s=LIVE_TIMEOUT), "nccl.p2p")
    assert f.status == Status.FAIL
    assert f.message == "CUDA failed in the P2P probe: cuInit = 999 CUDA_ERROR_UNKNOWN."


# ---------------------------------------------------------------------------- nccl.p2p, recorded


def test_recorded_h100_without_peer_access_warns_and_sizes_shm():
    host = multi_gpu_host(8, name="NVIDIA H100 80GB HBM3")
    host.p2p_stdout = recorded("p2p_8xh100_no-peer_nccl-1264.jsonl")
    f = only(run(host, only=("nccl.p2p",)), "nccl.p2p")
    assert f.status == Status.WARN
    assert f.message.startswith("No GPU pair can use peer access (cuDeviceCanAccessPeer = 0): NCCL")
    assert "about 1024 MiB for 8 GPUs" in f.message
    assert "nvidia-smi topo -p2p rw" in f.remediation


def test_recorded_split_peer_1080ti():
    host = multi_gpu_host(4, name="GeForce GTX 1080 Ti")
    host.p2p_stdout = recorded("p2p_4x1080ti_split-peer_nccl-257.jsonl")
    f = only(run(host, only=("nccl.p2p",)), "nccl.p2p")
    assert f.status == Status.WARN
    assert f.message.startswith(
        "8 of 12 pairs cannot use peer access (cuDeviceCanAccessPeer = 0: "
        "0->2, 0->3, 1->2, 1->3, 2->0, 2->1, 3->0, 3->1)"
    )


def test_recorded_iommu_zeroed_copy_fails_both_directions():
    host = multi_gpu_host(2, name="NVIDIA GeForce RTX 4090")
    host.p2p_stdout = recorded("p2p_2x4090_iommu-zeroed_tinygrad-18.jsonl")
    fails = findings(run(host, only=("nccl.p2p",)), "nccl.p2p", Status.FAIL)
    assert [f.subject for f in fails] == ["GPU 0 -> GPU 1", "GPU 1 -> GPU 0"]


def test_recorded_uniform_pcie_p2p_passes():
    host = multi_gpu_host(6, name="NVIDIA GPU")
    host.p2p_stdout = recorded("p2p_6gpu_pcie-p2p_nccl-814.jsonl")
    f = only(run(host, only=("nccl.p2p",)), "nccl.p2p")
    assert f.status == Status.PASS
    assert f.message.endswith("32 MiB copies byte-exact, 10 GB/s.")


def test_recorded_hang_between_gpu2_and_gpu3():
    host = multi_gpu_host(4, name="NVIDIA GPU")
    host.p2p_stdout = recorded("p2p_4gpu_hang-2-3_nccl-606.jsonl")
    host.p2p_killed = True
    f = only(run(host, only=("nccl.p2p",)), "nccl.p2p")
    assert f.status == Status.FAIL and f.subject == "GPU 2 -> GPU 3"
    assert f.message == (
        "A 32 MiB peer copy GPU 2 -> GPU 3 did not complete within 37 s: P2P traffic between "
        "them is being dropped; NCCL will hang the same way (3 later pair(s) not tested)."
    )


def test_hang_message_gives_the_pace_of_the_earlier_pairs():
    lines = [json.loads(x) for x in recorded("p2p_4gpu_hang-2-3_nccl-606.jsonl").splitlines()]
    for line in lines:
        if str(line["stage"]).startswith("pair:") and "started" not in line:
            line["pair_s"] = 0.0412
    host = multi_gpu_host(4, name="NVIDIA GPU")
    host.p2p_stdout = "".join(json.dumps(line) + "\n" for line in lines)
    host.p2p_killed = True
    f = only(run(host, only=("nccl.p2p",)), "nccl.p2p")
    assert "within 37 s, while each earlier pair took 0.04 s at most: P2P traffic" in f.message


def test_recorded_probe_that_stopped_mid_pair_without_a_timeout_fails():
    host = multi_gpu_host(4, name="NVIDIA GPU")
    host.p2p_stdout = recorded("p2p_4gpu_hang-2-3_nccl-606.jsonl")
    f = only(run(host, only=("nccl.p2p",)), "nccl.p2p")
    assert f.status == Status.FAIL
    assert f.message == "The P2P probe exited 0 in pair:2-3 before testing every pair."


def test_probe_killed_before_any_pair_is_a_failure_not_a_pass():
    host = multi_gpu_host(2)
    host.p2p_stdout = "".join(
        line + "\n"
        for line in recorded("p2p_2x4090_iommu-zeroed_tinygrad-18.jsonl").splitlines()[:3]
    )  # init done, setup started: creating the contexts never returned
    f = only(run(host, only=("nccl.p2p",)), "nccl.p2p")
    assert f.status == Status.FAIL
    assert f.message == "The P2P probe exited 0 in setup before testing every pair."


def test_slow_pairs_compares_within_a_class():
    probe = parse_p2p_output(recorded("p2p_4x1080ti_split-peer_nccl-257.jsonl"))
    assert slow_pairs(probe.pairs) == []  # staged pairs are slower than peer ones: no fault


# ---------------------------------------------------------------------------- shm, CLI


def test_gpu_node_minors_for_shm_capacity():
    host = multi_gpu_host(4)
    assert gpu_node_minors(host.list_dir) == (0, 1, 2, 3)
    assert nccl_shm_bytes(len(gpu_node_minors(host.list_dir))) == 512 * MIB


def test_nccl_shm_bytes():
    assert nccl_shm_bytes(0) == nccl_shm_bytes(1) == 0
    assert nccl_shm_bytes(2) == 256 * MIB
    assert nccl_shm_bytes(8) == 1024 * MIB
    assert nccl_shm_bytes(8) > 2 * 33_030_528 * 8  # > two recorded recent-NCCL segments per rank


def test_cli_on_this_gpu_less_machine_skips_with_the_reason():
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver: the SKIP path does not apply")
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "check", "--only", "gpu.count,nccl.p2p", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    report = json.loads(proc.stdout)
    by_check = {f["check"]: f for f in report["findings"]}
    assert by_check["driver.loaded"]["status"] == "FAIL"
    assert by_check["gpu.count"]["status"] == "SKIP"
    assert by_check["gpu.count"]["message"] == "not run: driver.loaded FAIL"
    assert by_check["nccl.p2p"]["status"] == "SKIP"
    assert by_check["nccl.p2p"]["message"].startswith("not run: driver.loaded FAIL")
    assert by_check["nccl.p2p"]["caused_by"][0] == "driver.loaded"
    assert proc.returncode == 3  # driver.loaded FAILs here
