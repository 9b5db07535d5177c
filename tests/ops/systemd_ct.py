"""A lab CT that boots a REAL systemd (Debian 12's systemd 252) as PID 1 (issue 26.13).

The rootfs is Debian bookworm built by Debian's own ``debootstrap`` from the mirror this
machine's apt uses (``/etc/apt/sources.list(.d)``), with ``systemd``, ``systemd-sysv`` and
``python3``; it is cached as a tarball (tests/lab/debian_rootfs.py) so later runs only unpack it.
The CT is a real LXC container on the lab's pure cgroup v2 (tests/lab), configured as
LXC's own ``common.conf`` does for systemd guests (``lxc.autodev``, ``cgroup:mixed``,
``SIGRTMIN+3`` to halt); its network is ``empty`` (only ``lo``), a CT whose network never
comes online. The repository and its venv's base Python are bind-mounted read-only at
their own paths, so ``gpudoctor`` runs inside as it does on this machine.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import lab_unavailable
from tests.lab.debian_rootfs import DebianRelease, RootfsUnavailable, rootfs_tarball
from tests.lab.lxc import Lab, LabContainer, host_python_mounts
from tests.ops.campaign_ct import CampaignCt

SYSTEMD_DEBIAN = DebianRelease("bookworm", 12, ("systemd", "systemd-sysv", "python3"), "systemd")


def systemd_rootfs_tarball() -> Path:
    """Return the cached Debian 12 + systemd rootfs tarball, built the first time with
    ``debootstrap --variant=minbase --include=systemd,systemd-sysv,python3 bookworm DIR
    MIRROR`` (tests/lab/debian_rootfs.py). Skip (fail under GPUDOCTOR_REQUIRE_LAB) when
    debootstrap is missing or cannot reach the mirror."""
    try:
        return rootfs_tarball(SYSTEMD_DEBIAN)
    except RootfsUnavailable as exc:
        lab_unavailable(str(exc))
        raise  # not reached: lab_unavailable skips or fails


class SystemdContainer(LabContainer):
    """A lab CT whose rootfs is the debootstrapped Debian and whose init is systemd."""

    def create(self) -> SystemdContainer:
        """Unpack the cached rootfs and write the config; return self."""
        self.dir.mkdir(parents=True)
        self.rootfs.mkdir()
        subprocess.run(["tar", "-xf", str(systemd_rootfs_tarball()), "-C", str(self.rootfs)],
                       check=True, timeout=600)  # fmt: skip
        # a CT with no console: no getty to wait for; the journal kept across boots
        (self.rootfs / "etc/systemd/system/getty.target.wants/getty@tty1.service").unlink(
            missing_ok=True
        )
        (self.rootfs / "var/log/journal").mkdir(parents=True, exist_ok=True)
        self.write_config()
        return self

    def render_config(self) -> str:
        """Return the LXC config: systemd as init (LXC's common.conf choices), no network
        but lo, the stand-in GPU and the repo bind-mounted, device policy denied by default."""
        lines = [
            f"lxc.uts.name = {self.name}",
            f"lxc.rootfs.path = dir:{self.rootfs}",
            "lxc.net.0.type = empty",
            "lxc.apparmor.profile = unconfined",
            "lxc.init.cmd = /sbin/init",
            "lxc.signal.halt = SIGRTMIN+3",
            "lxc.signal.reboot = SIGTERM",
            "lxc.autodev = 1",
            "lxc.console.path = none",
            "lxc.tty.max = 0",
            "lxc.pty.max = 16",
            "lxc.cap.drop = mac_admin mac_override sys_time sys_module sys_rawio",
            "lxc.mount.auto = proc:mixed sys:mixed cgroup:mixed",
        ]
        for host_dir in host_python_mounts():
            rel = host_dir.lstrip("/")
            lines.append(f"lxc.mount.entry = {host_dir} {rel} none ro,bind,create=dir 0 0")
        lines += self.device_lines()
        return "\n".join(lines) + "\n"

    def systemctl(self, *args: str, timeout: float = 30.0) -> str:
        """Return the stdout of ``systemctl ARGS`` run inside the CT (stripped)."""
        return self.attach(["/usr/bin/systemctl", *args], timeout).stdout.strip()

    def booted(self) -> bool:
        """Return True once systemd says the boot is over (``is-system-running`` is
        ``running`` or ``degraded``, not ``starting``/``initializing``)."""
        return self.systemctl("is-system-running") in ("running", "degraded")


class SystemdCampaign(CampaignCt):
    """The campaign CT under systemd: the unit's log is its journal."""

    def unit_log(self) -> str:
        """Return ``journalctl -u UNIT`` over every boot (empty when the CT is stopped)."""
        if self.ct.state() != "RUNNING":
            return ""
        return self.ct.attach(
            ["/usr/bin/journalctl", "-u", "gpudoctor-campaign", "-o", "cat", "--no-pager"], 30
        ).stdout


def make_systemd_ct(lab: Lab, name: str, node: Path, allow: tuple[str, ...]) -> SystemdContainer:
    """Create (not start) a systemd CT with ``node`` bind-mounted as /dev/fakegpu."""
    ct = SystemdContainer(lab, name, allow, {"/dev/fakegpu": str(node)})
    ct.create()
    lab.containers.append(ct)
    return ct
