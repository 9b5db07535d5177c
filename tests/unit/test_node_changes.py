"""Issue 21.1: observe before disturbing. The node facts are read before the CUDA/NVML probe,
the node checks report them, and device.unchanged says what the driver library changed.

Real device nodes (mknod) in a tmp /dev tree (tests/fakes/rooted_host.py), the real probe,
and the fake driver (tests/unit/fake_libcuda.c) doing what libcuda does as root with
ModifyDeviceFiles=1: remove a node with a wrong major and mknod the right one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudoctor import early_probe
from gpudoctor.context import CheckOptions, FactCache
from gpudoctor.facts import node_snapshot
from gpudoctor.facts.nodes import NVIDIA_FAMILIES
from gpudoctor.hosts.local import LocalHost
from gpudoctor.model import Status
from gpudoctor.runner import run_checks
from tests.fakes.rooted_host import RootedHost
from tests.unit.multigpu_host import build_fake_libcuda

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of char nodes needs root")

PROC_DEVICES = "Character devices:\n  1 mem\n195 nvidia\n195 nvidiactl\n238 nvidia-uvm\n"
VERSION = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n"


def ct_tree(root: Path, uvm_major: int = 511, modify: str = "1") -> RootedHost:
    """A CT's root: nodes as a hook made them (nvidia-uvm with ``uvm_major``), the host
    kernel's /proc/devices (uvm is 238 now), the driver's params, root's status."""
    (root / "dev").mkdir(parents=True)
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/devices").write_text(PROC_DEVICES)
    (root / "proc/driver/nvidia/version").write_text(VERSION)
    (root / "proc/driver/nvidia/params").write_text(f"ModifyDeviceFiles: {modify}\n")
    (root / "proc/self/status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\n")
    for name, major, minor in (
        ("nvidia0", 195, 0),
        ("nvidiactl", 195, 255),
        ("nvidia-uvm", uvm_major, 0),
        ("nvidia-uvm-tools", uvm_major, 1),
    ):
        os.mknod(root / "dev" / name, 0o020666, os.makedev(major, minor))
        os.chmod(root / "dev" / name, 0o666)
    return RootedHost(str(root), name="ct201")


@pytest.fixture
def driver(tmp_path_factory, monkeypatch):
    """Put the fake driver on LD_LIBRARY_PATH; return a setter for its node behaviour.
    The probe keeps root here (``GPUDOCTOR_PROBE_AS_ROOT=1``): these tests show how what
    the library does AS ROOT is reported; by default the probe drops to nobody (below)."""
    monkeypatch.setenv(early_probe.KEEP_ROOT_ENV, "1")
    libs = build_fake_libcuda(tmp_path_factory.mktemp("fake-driver"))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libs))
    monkeypatch.setenv("FAKE_CUDA_INIT_RC", "999")

    def modify(root: Path, mknod_denied: bool) -> None:
        nodes = ",".join(f"{root}/dev/{n}:238" for n in ("nvidia-uvm", "nvidia-uvm-tools"))
        monkeypatch.setenv("FAKE_CUDA_MODIFY_NODES", nodes)
        if mknod_denied:
            monkeypatch.setenv("FAKE_CUDA_MKNOD_EPERM", "1")

    return modify


def by(report, check_id):
    return {f.subject: f for f in report.findings if f.check_id == check_id}


def test_the_driver_removing_a_stale_node_is_reported_and_the_node_checks_see_it_before(
    tmp_path, driver
) -> None:
    root = tmp_path / "ct"
    host = ct_tree(root)
    driver(root, mknod_denied=True)
    report = run_checks(host, CheckOptions(ct="201"))
    assert not (root / "dev/nvidia-uvm").exists()  # the fake driver really removed it
    nodes = by(report, "device.nodes")
    # what was there BEFORE the probe: stale 511:0, not "does not exist"
    assert "is stale: it is char 511:0" in nodes["/dev/nvidia-uvm"].message
    changed = by(report, "device.unchanged")
    uvm = changed["/dev/nvidia-uvm"]
    assert uvm.status is Status.FAIL
    assert uvm.message.startswith(
        "the driver library (libcuda/libnvidia-ml, running as root) removed /dev/nvidia-uvm "
        "(511:0) and could not create 238:0: the cgroup denies it"
    )
    assert "A check run as root can make the NVIDIA driver library rewrite device nodes" in (
        uvm.message
    )
    assert "before the probe: stat /dev/nvidia-uvm: char 511:0, mode 0666" in uvm.evidence
    assert "after the probe: stat /dev/nvidia-uvm: No such file or directory" in uvm.evidence
    assert "/proc/driver/nvidia/params: ModifyDeviceFiles: 1" in uvm.evidence
    assert "/proc/devices: 238 nvidia-uvm" in uvm.evidence
    assert "c 238:* rwm" in uvm.remediation and "/etc/pve/lxc/201.conf" in uvm.remediation
    assert changed["/dev/nvidia-uvm-tools"].status is Status.FAIL
    assert "/dev/nvidia0" not in changed  # untouched nodes are not findings


def test_a_node_the_driver_re_created_is_a_warning_naming_old_and_new(tmp_path, driver) -> None:
    root = tmp_path / "ct"
    host = ct_tree(root)
    driver(root, mknod_denied=False)
    report = run_checks(host, CheckOptions())
    assert os.major(os.stat(root / "dev/nvidia-uvm").st_rdev) == 238
    uvm = by(report, "device.unchanged")["/dev/nvidia-uvm"]
    assert uvm.status is Status.WARN
    assert "replaced /dev/nvidia-uvm (511:0) by 238:0 while gpudoctor's probe ran" in uvm.message
    assert "is stale" in by(report, "device.nodes")["/dev/nvidia-uvm"].message


def test_without_modify_device_files_the_change_is_not_blamed_on_the_driver(
    tmp_path, driver
) -> None:
    root = tmp_path / "ct"
    host = ct_tree(root, modify="0")
    driver(root, mknod_denied=True)
    uvm = by(run_checks(host, CheckOptions()), "device.unchanged")["/dev/nvidia-uvm"]
    assert uvm.message.startswith("something other than the driver library")
    assert "A check run as root" not in uvm.message


def test_healthy_nodes_are_left_alone_and_pass(tmp_path, driver) -> None:
    root = tmp_path / "ct"
    host = ct_tree(root, uvm_major=238)
    driver(root, mknod_denied=True)
    (result,) = by(run_checks(host, CheckOptions()), "device.unchanged").values()
    assert result.status is Status.PASS
    assert "left the 4 device node(s) as they were" in result.message


class OrderedHost(RootedHost):
    """Records each operation in order, to prove no node is read after the probe starts."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.calls: list[str] = []

    def stat(self, path):
        self.calls.append(f"stat {path}")
        return super().stat(path)

    def read_text(self, path, limit=1 << 20):
        self.calls.append(f"read {path}")
        return super().read_text(path, limit)

    def run(self, argv, timeout=30.0, input=None):
        self.calls.append("probe" if "-c" in argv else f"run {argv[0]}")
        return super().run(argv, timeout, input)


def test_every_node_fact_is_read_before_the_probe_starts(tmp_path, driver) -> None:
    root = tmp_path / "ct"
    ct_tree(root)
    host = OrderedHost(str(root))
    driver(root, mknod_denied=True)
    run_checks(host, CheckOptions())
    first_probe = host.calls.index("probe")
    before = host.calls[:first_probe]
    for path in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        assert f"stat {path}" in before, host.calls
    for path in ("/proc/devices", "/proc/self/uid_map", "/proc/driver/nvidia/params"):
        assert f"read {path}" in before, host.calls
    # after the probe, the nodes are stat'ed again only by device.unchanged (one pass)
    after = [c for c in host.calls[first_probe:] if c == "stat /dev/nvidia0"]
    assert len(after) == 1, host.calls


def test_the_early_snapshot_is_what_a_local_run_reads(tmp_path, monkeypatch) -> None:
    """early_probe reads the nodes with os calls before it forks the probe; the FactCache of
    a LocalHost answers from that snapshot, not from the nodes as they are later."""
    assert set(early_probe.NODE_DIRS) == {f.directory for f in NVIDIA_FAMILIES}
    node = tmp_path / "uvm"
    os.mknod(node, 0o020666, os.makedev(511, 0))
    raw = {
        "dirs": {"/dev": ["nvidia-uvm", "null"]},
        "stats": {"/dev/nvidia-uvm": os.stat(node)},
        "files": {"/proc/devices": PROC_DEVICES.encode(), "/proc/self/uid_map": 2},
    }
    monkeypatch.setattr(early_probe, "_SNAPSHOT", [raw])
    facts = FactCache(LocalHost(), CheckOptions())
    snap = facts.nodes_before()
    assert snap.nodes == ("/dev/nvidia-uvm",)
    assert facts.node_stat("/dev/nvidia-uvm").major == 511  # type: ignore[union-attr]
    assert facts.nvidia_nodes() == ["/dev/nvidia-uvm"]
    assert facts.read_optional("/proc/self/uid_map") is None
    assert facts.proc_devices().char_major("nvidia-uvm") == 238
    assert early_probe.take_snapshot() is None  # handed over once


def test_early_snapshot_reads_this_machine(tmp_path) -> None:
    raw = early_probe.snapshot()
    assert isinstance(raw["files"]["/proc/devices"], bytes)
    assert isinstance(raw["dirs"]["/dev"], list) and "null" in raw["dirs"]["/dev"]
    snap = node_snapshot.from_early(raw)
    assert all(p.startswith("/dev/") for p in snap.nodes)


@pytest.fixture
def open_dir():
    """A directory every user can traverse (pytest's tmp dirs are 0700 root): the fake
    driver and the CT tree, as an unprivileged probe must be able to reach them."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gd-nobody-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_by_default_the_probe_drops_root_and_a_stale_node_is_kept(open_dir, monkeypatch) -> None:
    """Issue 32 item 7: the same fake driver that removes a stale node as root cannot as
    uid 65534: the probe drops root before loading it, every node stays as it was,
    device.unchanged PASSes and says how the probe ran."""
    monkeypatch.delenv(early_probe.KEEP_ROOT_ENV, raising=False)
    libs = open_dir / "driver"
    libs.mkdir(mode=0o755)
    build_fake_libcuda(libs)
    for lib in libs.iterdir():
        lib.chmod(0o755)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libs))
    monkeypatch.setenv("FAKE_CUDA_INIT_RC", "999")
    root = open_dir / "ct"
    host = ct_tree(root)
    for path in [root, *root.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
    nodes = ",".join(f"{root}/dev/{n}:238" for n in ("nvidia-uvm", "nvidia-uvm-tools"))
    monkeypatch.setenv("FAKE_CUDA_MODIFY_NODES", nodes)
    report = run_checks(host, CheckOptions(ct="201"))
    assert os.stat(root / "dev/nvidia-uvm").st_rdev == os.makedev(511, 0)  # kept
    [unchanged] = by(report, "device.unchanged").values()
    assert unchanged.status is Status.PASS, unchanged.message
    assert "ran as uid 65534 (nobody)" in unchanged.message
    cuda = by(report, "cuda.init")["cuInit"]
    assert any("ran as uid 65534 (nobody)" in line for line in cuda.evidence), cuda.evidence
    assert "is stale: it is char 511:0" in by(report, "device.nodes")["/dev/nvidia-uvm"].message
