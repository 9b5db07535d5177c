"""Issue 21.1 in a real LXC container on cgroup v2: a check must observe before it disturbs.

The container is set up the way forum guides do it: an ``lxc.hook.autodev`` script mknods
``/dev/nvidia-uvm`` with a hard-coded major from an earlier boot (511), while the kernel's
/proc/devices (a file bind-mounted over it: this machine has no NVIDIA driver) says
nvidia-uvm is 238 now. The cgroup allows mknod of nothing NVIDIA. The stand-in driver is
the fake libcuda (tests/unit/fake_libcuda.c) doing what the real one does as root with
ModifyDeviceFiles=1: unlink the stale node, then mknod 238:0, which the real cgroup denies.
`gpudoctor check` runs inside, unchanged, with its real probe.
"""

from __future__ import annotations

import json

import pytest

from tests.lab.lxc import Lab
from tests.unit.multigpu_host import build_fake_libcuda

pytestmark = pytest.mark.lab

PROC_DEVICES = (
    "Character devices:\n  1 mem\n  5 /dev/tty\n195 nvidia\n195 nvidiactl\n238 nvidia-uvm\n"
)
HOOK = """#!/bin/sh
# the forum guide's hook: nodes with the majors of an earlier boot
mknod -m 666 "${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm" c 511 0
mknod -m 666 "${LXC_ROOTFS_MOUNT}/dev/nvidia0" c 195 0
mknod -m 666 "${LXC_ROOTFS_MOUNT}/dev/nvidiactl" c 195 255
"""


def hook_ct_and_driver(lab: Lab, keep_root: bool):
    """Return (the started forum-guide CT, the env that puts the fake driver in front of
    ``gpudoctor check`` inside it); ``keep_root``: GPUDOCTOR_PROBE_AS_ROOT=1."""
    work = lab.root / f"nodes21-{lab.unique_name()}"
    work.mkdir(parents=True)
    libs = build_fake_libcuda(work)
    (work / "devices").write_text(PROC_DEVICES)
    hook = work / "autodev.sh"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    ct = lab.container(
        start=False,
        allow=["c 195:* rwm", "c 511:* rwm"],  # the guide's rules; nothing allows 238
        extra_config=[
            "lxc.autodev = 1",
            f"lxc.hook.autodev = {hook}",
            f"lxc.mount.entry = {work} {str(work).lstrip('/')} none ro,bind,create=dir 0 0",
            f"lxc.mount.entry = {work}/devices proc/devices none ro,bind 0 0",
        ],
    )
    text = ct.config_path.read_text().replace("lxc.cgroup2.devices.allow = c *:* m\n", "")
    ct.config_path.write_text(text)
    ct.start()
    before = ct.shell("stat -c '%F %t:%T' /dev/nvidia-uvm").stdout.strip()
    assert before == "character special file 1ff:0", before  # 511:0, from the hook
    env = {
        "LD_LIBRARY_PATH": str(libs),
        "FAKE_CUDA_MODIFY_NODES": "/dev/nvidia-uvm:238",
        "FAKE_CUDA_INIT_RC": "999",
    }
    if keep_root:
        env["GPUDOCTOR_PROBE_AS_ROOT"] = "1"
    return ct, env


def test_check_reports_the_node_the_driver_library_removed(lab: Lab) -> None:
    """With GPUDOCTOR_PROBE_AS_ROOT=1 (as before issue 32): what the library does AS ROOT
    is reported, and the CT really loses its node."""
    ct, env = hook_ct_and_driver(lab, keep_root=True)
    done = ct.attach(
        [str(lab.venv_python), "-m", "gpudoctor", "check", "--json"], timeout=120, env=env
    )
    report = json.loads(done.stdout)
    by = {(f["check"], f["subject"]): f for f in report["findings"]}
    # the node checks report what was there before the probe: stale, not "does not exist"
    node = by[("device.nodes", "/dev/nvidia-uvm")]
    assert node["status"] == "FAIL" and "is stale: it is char 511:0" in node["message"], node
    change = by[("device.unchanged", "/dev/nvidia-uvm")]
    assert change["status"] == "FAIL", change
    assert (
        "the driver library (libcuda/libnvidia-ml, running as root) removed /dev/nvidia-uvm "
        "(511:0) and could not create 238:0: the cgroup denies it" in change["message"]
    )
    assert "after the probe: stat /dev/nvidia-uvm: No such file or directory" in change["evidence"]
    # the container really lost the node (the driver's mknod was denied by the real cgroup)
    assert "No such file" in ct.shell("ls -l /dev/nvidia-uvm 2>&1").stdout
    assert ("device.unchanged", "/dev/nvidia0") not in by
    assert done.returncode == 3


def test_a_check_as_root_keeps_the_ct_s_nodes(lab: Lab) -> None:
    """Issue 32 item 7, by default: the probe drops to nobody before the (fake) driver
    library loads; its unlink of the stale node fails, the CT keeps 511:0, the node checks
    still name it stale, device.unchanged PASSes and says how the probe ran."""
    ct, env = hook_ct_and_driver(lab, keep_root=False)
    done = ct.attach(
        [str(lab.venv_python), "-m", "gpudoctor", "check", "--json"], timeout=120, env=env
    )
    report = json.loads(done.stdout)
    by = {(f["check"], f["subject"]): f for f in report["findings"]}
    node = by[("device.nodes", "/dev/nvidia-uvm")]
    assert node["status"] == "FAIL" and "is stale: it is char 511:0" in node["message"], node
    unchanged = [f for (check, _), f in by.items() if check == "device.unchanged"]
    assert [f["status"] for f in unchanged] == ["PASS"], unchanged
    assert "ran as uid 65534 (nobody)" in unchanged[0]["message"]
    after = ct.shell("stat -c '%F %t:%T' /dev/nvidia-uvm").stdout.strip()
    assert after == "character special file 1ff:0", after  # still there, as the hook made it
