"""The lab itself is real: pure cgroup v2, a kernel-enforced device policy, plain-LXC
config layout, and clean teardown."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lab.fixtures import FAKE_GPU_INSIDE
from tests.lab.lxc import REPO_ROOT as REPO
from tests.lab.lxc import Lab, LabContainer, LabError, remove_stale_lab_dirs, wait_for

pytestmark = pytest.mark.lab

OPEN_RW = "import os,sys; os.close(os.open(sys.argv[1], os.O_RDWR)); print('opened')"


def test_namespace_is_pure_cgroup2(lab: Lab) -> None:
    fstype = lab.namespace.run(["stat", "-f", "-c", "%T", "/sys/fs/cgroup"]).stdout.strip()
    assert fstype == "cgroup2fs"
    mounts = lab.namespace.run(["cat", "/proc/self/mounts"]).stdout
    assert not [line for line in mounts.splitlines() if line.split()[2] == "cgroup"]
    # This machine outside the namespace keeps its hybrid layout.
    assert Path("/proc/self/mounts").read_text().count(" cgroup ") >= 1


def test_lxc_runs_in_pure_cgroup2_mode_with_an_ebpf_device_program(
    lab: Lab, lab_container: Callable[..., LabContainer]
) -> None:
    ct = lab_container(start=False)
    ct.start(log_level="TRACE")
    log = ct.log_path.read_text(errors="replace")
    assert "Unified cgroup layout" in log
    assert "Loaded bpf program" in log
    assert "Device cgroup will block" in log  # deny-all, then the allow list
    assert "devices not mounted" in log  # no v1 devices controller in its world


def test_device_policy_is_enforced_by_the_kernel(denied_container: LabContainer, lab: Lab) -> None:
    opened = denied_container.attach(["python3", "-I", "-c", OPEN_RW, FAKE_GPU_INSIDE])
    assert opened.returncode == 1
    assert "PermissionError: [Errno 1] Operation not permitted" in opened.stderr
    # The node is there and world read-writable: only the cgroup policy denies it.
    ls = denied_container.attach(["ls", "-ln", FAKE_GPU_INSIDE]).stdout
    assert ls.startswith("crw-rw-rw-")
    assert "10, 232" in ls
    # Who denies it: the container's init sits at the ROOT of the v1 devices hierarchy
    # (no v1 rule applies) and in its own cgroup2 group, whose eBPF program denies.
    pid = denied_container.init_pid()
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    entries = {line.split(":")[1]: line.split(":", 2)[2] for line in lines}
    assert entries.get("devices", "/") == "/"
    assert entries[""] == f"/lxc.payload.{denied_container.name}"


def test_allow_rule_opens_the_device(allowed_container: LabContainer) -> None:
    opened = allowed_container.attach(["python3", "-I", "-c", OPEN_RW, FAKE_GPU_INSIDE])
    assert opened.ok, opened.stderr
    assert opened.stdout.strip() == "opened"


def test_plain_lxc_layout_and_lifecycle(lab_container: Callable[..., LabContainer]) -> None:
    ct = lab_container(start=False)
    assert ct.config_path == ct.lab.lxcpath / ct.name / "config"
    text = ct.config_path.read_text()
    # The lab namespace (and the lab sshd) sees it where plain LXC keeps configs.
    seen = ct.lab.namespace.run(["cat", f"/var/lib/lxc/{ct.name}/config"]).stdout
    assert ct.lxcpath == "/var/lib/lxc"
    assert seen == text
    assert "lxc.cgroup2.devices.deny = a" in text
    assert "lxc.net.0.type = empty" in text
    assert ct.state() == "STOPPED"
    assert ct.init_pid() is None
    ct.start()
    first = ct.init_pid()
    assert first is not None
    assert ct.attach(["cat", "/proc/1/cmdline"]).stdout.startswith("/usr/bin/busybox")
    ct.restart()
    assert ct.init_pid() not in (None, first)
    ct.stop()
    assert ct.state() == "STOPPED"


def test_repo_python_runs_inside(allowed_container: LabContainer) -> None:
    result = allowed_container.python("-c", "import gpudoctor, paramiko; print(gpudoctor.__file__)")
    assert result.ok, result.stderr
    assert result.stdout.strip().endswith("gpudoctor/__init__.py")
    # The repo is read-only inside: nothing a test runs there can change the tree.
    touched = allowed_container.attach(["touch", f"{REPO}/.lab-write-test"])
    assert touched.returncode != 0


def test_destroy_removes_everything(lab: Lab) -> None:
    ct = lab.container()
    ct_dir, name = ct.dir, ct.name
    ct.destroy()
    assert not ct_dir.exists()
    assert ct not in lab.containers
    listed = lab.namespace.run(["lxc-ls", "-P", ct.lxcpath]).stdout.split()
    assert name not in listed


def test_leftovers_of_a_dead_session_are_removed(lab: Lab) -> None:
    """A crashed run leaves a running container behind; the next session kills it and
    removes its directory (other live sessions' dirs are left alone)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    other = Lab(root=Lab.BASE / f"stale-test-{os.getpid()}")
    other.setup()
    ct = other.container()
    pid = ct.init_pid()
    assert pid is not None
    (other.root / "owner.pid").write_text(str(dead.pid))
    other.namespace.stop()  # the session "crashed": nobody holds its namespace now
    assert Path(f"/proc/{pid}").exists()
    remove_stale_lab_dirs(Lab.BASE)
    assert wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=10)
    assert not other.root.exists()
    assert lab.root.exists()  # this live session's lab is untouched


def test_destroy_kills_a_container_started_with_another_lxcpath(
    lab: Lab, lab_container: Callable[..., LabContainer]
) -> None:
    """Stand-ins (pct) or a fixer may start a lab container under the lab dir's host path
    instead of /var/lib/lxc; LXC then cannot find it by the usual name, but destroy()
    still leaves nothing running."""
    ct = lab_container(start=False)
    other_path = str(lab.lxcpath)
    started = lab.namespace.run(["lxc-start", "-P", other_path, "-n", ct.name])
    assert started.ok, started.stderr
    info = lab.namespace.run(["lxc-info", "-P", other_path, "-n", ct.name, "-p", "-H"])
    pid = int(info.stdout.strip())
    assert ct.state() == "STOPPED"  # invisible under the usual lxcpath ...
    ct.destroy()
    assert wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=10)  # ... yet gone


def test_a_container_that_cannot_start_says_why(
    lab_container: Callable[..., LabContainer],
) -> None:
    ct = lab_container(start=False, extra_config=["lxc.no.such.key = 1"])
    with pytest.raises(LabError, match=f"lxc-start {ct.name} failed") as exc:
        ct.start(timeout=10)
    assert "lxc.no.such.key" in str(exc.value)
    assert ct.state() == "STOPPED"
