"""Recorded machines for the catalogue's unit tests, built from tests/data/recorded captures.

``h200_host()`` is the lent H200 as captured on 2026-12-02 (driver 580.159.04, nvidia-uvm
major 238); the other builders derive the failure situations users meet from it and from
the public captures (the incident's new uvm major, stale nodes, version mismatches, ...).
"""

from __future__ import annotations

import copy
import errno
import json
import re
from pathlib import Path

from gpudoctor.hosts.base import DiskUsage
from tests.fakes.recorded_host import RecordedHost, stats_from_ls
from tests.recorded import recorded_file

H200_VERSION = "580.159.04"
GIB = 1 << 30


RECORDED_PROBE = Path(__file__).resolve().parents[1] / "data" / "h200-probe-healthy.jsonl"


def recorded_probe() -> list[dict]:
    """Return the probe's output as recorded on the lent H200 on 2026-12-02 (UUID masked)."""
    lines = [json.loads(line) for line in RECORDED_PROBE.read_text().splitlines() if line.strip()]
    return [line for line in lines if not (line.get("started") is True and len(line) == 2)]


def healthy_probe(version: str = H200_VERSION, cuda_rc: int = 0, nvml_rc: int = 0) -> list[dict]:
    """Return the recorded H200 probe output, changed into a failure when asked: another
    user-space ``version``, a cuInit code, an nvmlInit code."""
    env, nvml, cuda = (copy.deepcopy(line) for line in recorded_probe())
    nvml["lib_path"] = nvml["lib_path"].replace(H200_VERSION, version)
    cuda["lib_path"] = cuda["lib_path"].replace(H200_VERSION, version)
    if nvml_rc:
        nvml = {"stage": "nvml", "init": nvml_rc, "lib_path": nvml["lib_path"]}
    if cuda_rc:
        names = {
            999: "CUDA_ERROR_UNKNOWN",
            304: "CUDA_ERROR_OPERATING_SYSTEM",
            803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        }
        cuda = {
            "stage": "cuda",
            "init": cuda_rc,
            "init_name": names.get(cuda_rc),
            "init_s": 0.001,
            "driver_version": cuda["driver_version"],
            "lib_path": cuda["lib_path"],
        }
    return [env, nvml, cuda]


def h200_host() -> RecordedHost:
    """Return the healthy H200 machine as recorded."""
    nodes = stats_from_ls(recorded_file("proc_devices/h200-lab_580.159.04_ls-dev-nvidia.txt"))
    files = {
        "/proc/devices": recorded_file("proc_devices/h200-lab_580.159.04_proc-devices.txt"),
        "/proc/driver/nvidia/version": recorded_file(
            "proc_devices/h200-lab_580.159.04_proc-driver-nvidia-version.txt"
        ),
        "/proc/driver/nvidia/params": "ResmanDebugLevel: 4294967295\n",
        "/proc/self/status": "Name:\tpython3\nUid:\t0\t0\t0\t0\n",
        "/proc/self/mounts": "tmpfs /dev/shm tmpfs rw,nosuid,nodev,size=65536000k 0 0\n",
        "/proc/meminfo": "MemTotal: 131072000 kB\nMemAvailable: 120000000 kB\n",
    }
    return RecordedHost(
        files=files,
        nodes=nodes,
        probe_lines=healthy_probe(),
        disk={"/dev/shm": DiskUsage(total=62 * GIB, used=1 * GIB, free=61 * GIB)},
        name="h200",
    )


def incident_ct(new_uvm_major: int = 511) -> RecordedHost:
    """Return CT 200 after the host reboot in DESIGN.md: nvidia-uvm re-registered as
    ``new_uvm_major``, the CT's cgroup policy still allows only the old majors, so open()
    of /dev/nvidia-uvm gives EPERM and cuInit returns 999 (NVML, on nvidiactl, still works)."""
    host = h200_host()
    host.files["/proc/devices"] = host.files["/proc/devices"].replace(
        "238 nvidia-uvm", f"{new_uvm_major} nvidia-uvm"
    )
    for path in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        st = host.nodes[path]
        host.nodes[path] = type(st)(path, st.kind, st.mode, new_uvm_major, st.minor)
        host.open_errno[path] = errno.EPERM
    host.probe_lines = healthy_probe(cuda_rc=999)
    host.name = "pve1/ct200"
    return host


def mismatch_host(
    capture: str = "outputs/failures/nvml-version-mismatch_truenas-nvidia-drivers-19.txt",
):
    """Return a host whose user-space NVML differs from the kernel module (recorded versions)."""
    text = recorded_file(capture)
    lib = re.search(r"NVML library version: (\S+)", text).group(1)  # type: ignore[union-attr]
    host = h200_host()
    kernel = re.search(r"Kernel Module\s+(\d+\.\d+\.\d+)", text)
    if kernel:
        host.files["/proc/driver/nvidia/version"] = text[text.index("NVRM version") :]
    probe = healthy_probe(version=lib, cuda_rc=803, nvml_rc=18)
    probe[1]["error_name"] = "Driver/library version mismatch"
    host.probe_lines = probe
    return host, lib, (kernel.group(1) if kernel else H200_VERSION)
