"""Issue 32 item 6: the node follows a driver reload by itself, under a REAL systemd.

The set-up, every part real but the GPU:

* the "node's systemd": a lab CT booting Debian 12's systemd 252 as PID 1
  (tests/ops/systemd_ct.py) that shares this machine's network namespace
  (``lxc.net.0.type = none``) so it reaches the lab sshd on 127.0.0.1. ``gpudoctor fix
  --host-prep`` runs inside it and installs the real units there; its
  ``/etc/default/gpudoctor-follow-driver`` points the follow command at this machine
  (``--host labpve --flavor lxc``: the lab sshd, a real OpenSSH) because the CTs live here;
  on a Proxmox node the unit runs on the node itself and the file does not exist;
* the CTs: two real LXC containers on pure cgroup v2 (tests/lab). CT A bind-mounts the
  stand-in of /dev/nvidia-uvm (a char node in the lab's node directory, misc 10:232,
  bind-mounted read-only into the systemd CT at the same path, which its path unit
  watches); CT B bind-mounts another stand-in GPU node that never moves;
* the "module reload": the stand-in node is re-created (unlink + mknod, what
  nvidia-modprobe does) under another real driver's major, cpu/cpuid 203:0 (a real
  driver's major cannot be moved, and the host's real /proc/devices lists 203, so the
  planner reads the new owner from it as it would read nvidia-uvm's).

No fake is involved: plain LXC needs no pct, and the udev rule cannot fire here (no udevd
in a container; it is installed and left out of the proof).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.lab.lxc import REPO_ROOT, Lab, LabContainer, host_python_mounts, wait_for
from tests.lab.sshd import LabSSHD
from tests.ops.systemd_ct import SystemdContainer

pytestmark = pytest.mark.lab

SERVICE = "gpudoctor-follow-driver.service"
PATH_UNIT = "gpudoctor-follow-driver.path"
MOVED = (203, 0)  # cpu/cpuid, as in tests/ops/test_reboot_drill.py


class NodeSystemd(SystemdContainer):
    """The systemd CT standing for the Proxmox node's systemd: host network namespace (the
    lab sshd on 127.0.0.1), and ``shared`` host directories bind-mounted at their own paths
    (the stand-in nodes read-only, the test's work directory read-write)."""

    def __init__(self, lab: Lab, name: str, ro: list[Path], rw: list[Path]) -> None:
        # a host's systemd runs under no device policy; inotify_add_watch on a char node
        # is a read-permission check the device cgroup answers: allow the stand-in's
        # numbers, before and after the move
        super().__init__(lab, name, allow=("c 10:232 rwm", f"c {MOVED[0]}:{MOVED[1]} rwm"))
        self.ro, self.rw = ro, rw

    def render_config(self) -> str:
        """Return the systemd CT's config with the host's network and the shared dirs."""
        text = super().render_config().replace("lxc.net.0.type = empty", "lxc.net.0.type = none")
        covered = [*host_python_mounts(), str(REPO_ROOT)]
        # not the directory pytest was started from (``python -m`` puts it on sys.path):
        # the CT needs nothing there, and "/" is a mount entry with no target (lxc-start fails)
        runner_dir = {"/", os.getcwd()}
        extra = [p for p in sys.path if p.startswith("/") and Path(p).is_dir()
                 and not any(p.startswith(c) for c in covered) and not p.startswith("/usr")
                 and p not in runner_dir]  # fmt: skip
        lines = [f"lxc.mount.entry = {d} {d.lstrip('/')} none ro,bind,create=dir 0 0"
                 for d in [*map(str, self.ro), *extra]]  # fmt: skip
        lines += [f"lxc.mount.entry = {d} {str(d).lstrip('/')} none bind,create=dir 0 0"
                  for d in self.rw]  # fmt: skip
        return text + "\n".join(lines) + "\n"

    def boot(self, work: Path, follow_args: str, **extra: str) -> None:
        """Write ``/etc/default/gpudoctor-follow-driver`` (backups and locks under ``work``,
        ``GPUDOCTOR_FOLLOW_ARGS``, ``extra``), start the CT and wait for systemd's boot."""
        env = {**extra, "GPUDOCTOR_HOST_BACKUP_DIR": str(work / "host-backups"),
               "GPUDOCTOR_CLIENT_BACKUP_DIR": str(work / "client-backups"),
               "GPUDOCTOR_LOCK_DIR": str(work / "locks"), "GPUDOCTOR_FOLLOW_ARGS": follow_args}  # fmt: skip
        (self.rootfs / "etc/default").mkdir(parents=True, exist_ok=True)
        (self.rootfs / "etc/default/gpudoctor-follow-driver").write_text(
            "".join(f"{k}={v}\n" for k, v in env.items())
        )
        self.start(timeout=60)
        assert wait_for(self.booted, 120), "systemd did not finish booting"

    def show(self, prop: str, unit: str = SERVICE) -> str:
        """Return ``systemctl show -p PROP --value UNIT``."""
        return self.systemctl("show", "-p", prop, "--value", unit)

    def journal(self, unit: str = SERVICE) -> str:
        """Return a unit's journal (``journalctl -u UNIT -o cat``)."""
        return self.attach(["/usr/bin/journalctl", "-u", unit, "-o", "cat", "--no-pager"],
                           30).stdout  # fmt: skip

    def idle(self) -> bool:
        """Return True when the path unit watches (``waiting``) and the service is not
        running: a change now starts a new run."""
        watching = self.show("SubState", PATH_UNIT) == "waiting"
        return watching and self.show("ActiveState") in ("inactive", "failed")

    def ran_since(self, since_us: int) -> bool:
        """Return True once a run of the service that started after ``since_us``
        (CLOCK_MONOTONIC, µs: the same kernel clock inside) has ended."""
        start = int(self.show("ExecMainStartTimestampMonotonic") or 0)
        end = int(self.show("ExecMainExitTimestampMonotonic") or 0)
        done = self.show("ActiveState") in ("inactive", "failed")
        return start > since_us and end >= start and done


def now_us() -> int:
    """Return CLOCK_MONOTONIC in µs (systemd's ``*TimestampMonotonic`` clock)."""
    return time.monotonic_ns() // 1000


def opens(ct: LabContainer, path: str) -> bool:
    """Return True when ``exec 3<PATH`` succeeds inside ``ct`` (the device policy checks a
    read open as a write one; read-only, so its close is no IN_CLOSE_WRITE that the path
    unit would take for a change)."""
    return ct.shell(f"exec 3<{path}").returncode == 0


def test_a_moved_major_is_followed_by_the_nodes_own_unit_restarting_only_its_ct(
    lab: Lab, lab_sshd: LabSSHD, tmp_path: Path
) -> None:
    """The unit ran on the real trigger; CT A (whose node moved) got its rule and a
    restart, and the node opens inside; CT B (another node) kept its init PID and config;
    a second trigger with nothing moved changed nothing."""
    name = lab.unique_name("fol")
    uvm = lab.make_node(f"{name}-uvm", 10, 232)
    gpu = lab.make_node(f"{name}-gpu", 10, 232)
    a = lab.container(allow=["c 10:232 rwm"], devices={"/dev/fakeuvm": str(uvm)})
    b = lab.container(allow=["c 10:232 rwm"], devices={"/dev/fakegpu": str(gpu)})
    assert opens(a, "/dev/fakeuvm") and opens(b, "/dev/fakegpu")

    work = tmp_path / "work"
    home = lab_sshd.client_home(work / "home")
    node = NodeSystemd(lab, f"{name}-node", ro=[lab.nodes_dir, lab_sshd.dir], rw=[work])
    node.create()
    lab.containers.append(node)
    node.boot(work, "--host labpve --flavor lxc", HOME=str(home))

    installed = node.gpudoctor("fix", "--host-prep", "--yes", "--device", str(uvm))
    assert installed.returncode == 0, installed.stderr + node.journal(PATH_UNIT)
    assert node.systemctl("is-active", PATH_UNIT) == "active"
    assert node.systemctl("is-enabled", PATH_UNIT) == "enabled"
    assert f"PathChanged={uvm}" in node.systemctl("cat", PATH_UNIT)
    assert node.show("ExecMainStartTimestampMonotonic") == "0"  # installing runs nothing
    again = node.gpudoctor("fix", "--host-prep", "--yes", "--device", str(uvm))
    assert again.returncode == 0 and "nothing to change" in again.stdout, again.stdout

    a_pid, b_pid = a.init_pid(), b.init_pid()
    b_config = b.config_path.read_bytes()

    # the "module reload": the node re-created under another major, nothing typed after
    since = now_us()
    uvm.unlink()
    os.mknod(uvm, 0o020666, os.makedev(*MOVED))
    uvm.chmod(0o666)
    assert wait_for(lambda: a.init_pid() not in (None, a_pid) and node.ran_since(since), 180), (
        node.journal()[-3000:]
    )
    log = node.journal()
    assert f"CT {a.name}: applied (restarted)" in log, log[-3000:]
    assert "c 203:0 rwm" in a.config_path.read_text()
    assert opens(a, "/dev/fakeuvm"), "the moved node does not open inside CT A"
    assert b.init_pid() == b_pid, "CT B, whose device did not move, was restarted"
    assert b.config_path.read_bytes() == b_config
    assert f"CT {b.name}:" not in log  # not touched, not even named as changed
    assert node.show("Result") == "success"
    backups = sorted((work / "host-backups").iterdir())
    assert len(backups) == 1 and a.name in backups[0].name

    # a second trigger with nothing moved (the node's attributes touched): changes nothing
    a_pid, a_config = a.init_pid(), a.config_path.read_bytes()
    assert wait_for(node.idle, 60), node.systemctl("status", PATH_UNIT)  # watching again
    since = now_us()
    os.utime(uvm)
    assert wait_for(lambda: node.ran_since(since), 120), (
        node.journal()[-2000:] + node.journal(PATH_UNIT) + node.systemctl("status", PATH_UNIT)
    )
    last = [ln for ln in node.journal().splitlines() if ln.startswith("follow-driver:")][-1]
    assert last.startswith("follow-driver: nothing changed"), last
    assert (a.init_pid(), b.init_pid()) == (a_pid, b_pid)
    assert (a.config_path.read_bytes(), b.config_path.read_bytes()) == (a_config, b_config)
    assert sorted((work / "host-backups").iterdir()) == backups
