"""nccl.allreduce on recorded launcher outputs, and the real launcher (gloo on CPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.util import find_spec

import psutil
import pytest

from gpudoctor.facts.allreduce import parse_allreduce_output, run_allreduce_probe
from gpudoctor.hosts.local import LocalHost
from gpudoctor.model import Status
from tests.unit.multigpu_host import multi_gpu_host, only, recorded, run

# ---------------------------------------------------------------------------- nccl.allreduce


def test_allreduce_is_opt_in():
    host = multi_gpu_host(2)
    f = only(run(host, only=("nccl.allreduce",)), "nccl.allreduce")
    assert f.status == Status.SKIP and f.message.startswith("Opt-in: run with --deep")
    assert host.calls == []


def test_allreduce_skips_on_one_gpu():
    host = multi_gpu_host(1)
    f = only(run(host, only=("nccl.allreduce",), deep=True), "nccl.allreduce")
    assert f.status == Status.SKIP and "Only 1 GPU visible" in f.message


def test_allreduce_passes_with_multicast_off():
    host = multi_gpu_host(2)
    host.allreduce_stdouts = [recorded("allreduce_2gpu_ok.jsonl")]
    f = only(run(host, only=("nccl.allreduce",), deep=True), "nccl.allreduce")
    assert f.status == Status.PASS
    assert f.message.startswith(
        "NCCL 2.21.5 all-reduce over 2 GPUs gave the exact sum on every rank"
    )
    assert "bus bandwidth 352 GB/s at 64 MiB; transports: P2P/CUMEM/read." in f.message
    env_line = next(e for e in f.evidence if e.startswith("env: "))
    for var in (
        "NCCL_NVLS_ENABLE=0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
        "NVSHMEM_DISABLE_NVLS=1",
    ):
        assert var in env_line
    assert host.argvs[0][-6:] == ["--world-size", "2", "--timeout", "21", "--backend", "nccl"]


def test_allreduce_warns_when_p2p_disable_is_left_set():
    host = multi_gpu_host(2)
    host.allreduce_stdouts = [recorded("allreduce_2gpu_p2p-disabled-ok_nccl-2079.jsonl")]
    f = only(run(host, only=("nccl.allreduce",), deep=True), "nccl.allreduce")
    assert f.status == Status.WARN
    assert f.message.endswith(
        "NCCL_P2P_DISABLE=1 is set in this environment: NCCL avoids the "
        "GPUs' direct path, which is slower."
    )


def test_allreduce_hang_that_p2p_disable_cures_blames_p2p():
    host = multi_gpu_host(2)
    host.allreduce_stdouts = [
        recorded("allreduce_2gpu_hang-acs_nccl-2079.jsonl"),
        recorded("allreduce_2gpu_p2p-disabled-ok_nccl-2079.jsonl"),
    ]
    f = only(run(host, only=("nccl.allreduce",), deep=True), "nccl.allreduce")
    assert f.status == Status.FAIL
    assert f.message.startswith(
        "The all-reduce across 2 GPUs did not finish within 21 s (ranks 0, 1 in allreduce)."
    )
    assert f.message.endswith(
        "With NCCL_P2P_DISABLE=1 the same all-reduce gives the right sum: "
        "the GPUs' peer-to-peer path is broken."
    )
    assert "ECAP_ACS+6.w=0000" in f.remediation and "iommu=pt" in f.remediation
    assert host.argvs[1][-2:] == ["--env", "NCCL_P2P_DISABLE=1"]
    assert "retry with NCCL_P2P_DISABLE=1:" in f.evidence


def test_allreduce_shm_failure_asks_for_dev_shm():
    host = multi_gpu_host(2)
    host.allreduce_stdouts = [
        recorded("allreduce_2gpu_shm-full_dynamo-1408.jsonl"),
        recorded("allreduce_2gpu_shm-full_dynamo-1408.jsonl"),
    ]
    f = only(run(host, only=("nccl.allreduce",), deep=True), "nccl.allreduce")
    assert f.status == Status.FAIL
    assert f.message.startswith(
        "Rank 1 exited 1 during init (Error: failed to extend "
        "/dev/shm/nccl-YrFC5V to 33030532 bytes"
    )
    assert f.message.endswith("A retry with NCCL_P2P_DISABLE=1 failed too.")
    assert "at least 256 MiB free for 2 GPUs" in f.remediation


def test_allreduce_wrong_sum_is_corruption():
    host = multi_gpu_host(2)
    host.allreduce_stdouts = [recorded("allreduce_2gpu_wrong-sum_tinygrad-18.jsonl"), ""]
    f = only(run(host, only=("nccl.allreduce",), deep=True), "nccl.allreduce")
    assert f.status == Status.FAIL
    assert (
        "WRONG values on rank(s) 1 (1048576 of 1048576 elements; first 0, expected 1)" in f.message
    )


def test_allreduce_without_torch_skips_with_the_reason():
    host = multi_gpu_host(2)
    host.allreduce_stdouts = [
        json.dumps(
            {
                "stage": "launcher",
                "error": "no_torch",
                "detail": "torch is not importable by /usr/bin/python3",
            }
        )
    ]
    f = only(run(host, only=("nccl.allreduce",), deep=True), "nccl.allreduce")
    assert f.status == Status.SKIP
    assert f.message.startswith("torch is not importable by /usr/bin/python3: install torch there")


def test_allreduce_hang_in_the_large_transfers_only():
    checked = {"sum_ok": True, "elements": 1048576}
    lines = [{"stage": f"rank{k}", "step": "bandwidth", "checked": checked} for k in (0, 1)]
    lines.append(
        {
            "stage": "launcher",
            "timed_out": True,
            "ranks": [{"rank": k, "returncode": -9, "step": "bandwidth"} for k in (0, 1)],
        }
    )
    stdout = "".join(json.dumps(line) + "\n" for line in lines)
    result = parse_allreduce_output(stdout, 2, timeout_s=21.0)
    assert result.timed_out and not result.ok and result.wrong_sum == []
    assert result.describe_failure() == (
        "The all-reduce across 2 GPUs did not finish within 21 s (ranks 0, 1 in bandwidth). "
        "The first, 4 MiB all-reduce gave the right sum; the timed 64 MiB ones hung "
        "(large transfers fail where small ones pass)."
    )


def test_parse_allreduce_output_of_a_killed_launcher():
    run_ = parse_allreduce_output('{"stage": "rank0", "step": "init"}\n', 2, killed=True)
    assert run_.timed_out and not run_.ok and [r.step for r in run_.ranks] == ["init", "start"]


# ---------------------------------------------------------------------------- real launcher (gloo)


def launcher_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


def needs_torch() -> None:
    """Skip where the [test] extra was installed without torch on purpose (the Python 3.13
    stage, tests/lab/python313.py, sets GPUDOCTOR_TEST_WITHOUT_ENGINES=1); anywhere else a
    missing torch fails the test: the [test] extra brings it."""
    if os.environ.get("GPUDOCTOR_TEST_WITHOUT_ENGINES") == "1" and not find_spec("torch"):
        pytest.skip(
            "torch not installed: the 3.13 stage leaves it out of the [test] extra (PyPI's "
            "Linux torch brings the CUDA stack, ~3 GB; tests/lab/python313.py)"
        )


def test_real_launcher_all_reduces_on_cpu_with_gloo(tmp_path, monkeypatch):
    needs_torch()
    # the launcher's work dir (and so its ranks' command lines) under this test's own tmp
    # dir: other runs of the probe on the machine (a parallel mutation run) are not counted
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    host = LocalHost()
    host.python = sys.executable
    result = run_allreduce_probe(host, 2, 240.0, backend="gloo")
    assert result.ok, result
    assert [r.result["sum_ok"] for r in result.ranks] == [True, True]
    assert result.env["NCCL_NVLS_ENABLE"] == "0"
    assert result.env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert result.env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert launcher_processes(f"{tmp_path}/gpudoctor-allreduce-") == []


def test_real_launcher_kills_ranks_at_its_deadline(tmp_path, monkeypatch):
    """A deadline far below torch's import time: every rank is still starting when it passes."""
    needs_torch()
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    host = LocalHost()
    host.python = sys.executable
    result = run_allreduce_probe(host, 2, 0.3, backend="gloo")
    assert result.timed_out and not result.ok
    assert {r.step for r in result.ranks} <= {"start", "import"}
    assert {r.returncode for r in result.ranks} == {-9}
    assert launcher_processes(f"{tmp_path}/gpudoctor-allreduce-") == []


def test_real_launcher_without_torch(tmp_path):
    python = shutil.which("python3")
    assert python is not None
    check = subprocess.run([python, "-c", "import torch"], capture_output=True)
    if check.returncode == 0:
        pytest.skip(f"{python} has torch: no torch-less interpreter to test with")
    host = LocalHost()
    host.python = python
    result = run_allreduce_probe(host, 2, 30.0)
    assert result.error == "no_torch"
    assert result.error_detail.startswith("torch is not importable by /")
