"""A lab CT that boots a REAL systemd (Debian 12's systemd 252) as PID 1 (issue 26.13).

The rootfs is Debian bookworm built by Debian's own ``debootstrap`` from the mirror this
machine's apt uses (``/etc/apt/sources.list(.d)``), with ``systemd``, ``systemd-sysv`` and
``python3``; it is cached as a tarball in :data:`CACHE` so later runs only unpack it.
The CT is a real LXC container on the lab's pure cgroup v2 (tests/lab), configured as
LXC's own ``common.conf`` does for systemd guests (``lxc.autodev``, ``cgroup:mixed``,
``SIGRTMIN+3`` to halt); its network is ``empty`` (only ``lo``), a CT whose network never
comes online. The repository and its venv's base Python are bind-mounted read-only at
their own paths, so ``gpudoctor`` runs inside as it does on this machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.conftest import lab_unavailable
from tests.lab.lxc import Lab, LabContainer, host_python_mounts
from tests.ops.campaign_ct import CampaignCt

CACHE = Path(os.environ.get("GPUDOCTOR_TEST_CACHE", "/var/cache/gpudoctor-tests"))
TARBALL = CACHE / "debian12-systemd-rootfs.tar"
PACKAGES = "systemd,systemd-sysv,python3"
SUITE = "bookworm"


def debian_mirror() -> str:
    """Return the Debian archive URI this machine's apt uses for bookworm (one-line
    ``deb URI SUITE ...`` lists or deb822 ``URIs:``/``Suites:`` stanzas), else
    deb.debian.org."""
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.is_file() and path.suffix in (".list", ".sources", ""):
            texts.append(path.read_text(errors="replace"))
    for text in texts:
        for match in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", text, re.M):
            if match.group(2) == SUITE:
                return match.group(1)
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and SUITE in suites.group(1).split():
                return uris.group(1)
    return "http://deb.debian.org/debian"


def systemd_rootfs_tarball() -> Path:
    """Return the cached Debian 12 + systemd rootfs tarball, built with ``debootstrap
    --variant=minbase --include=systemd,systemd-sysv,python3 bookworm DIR MIRROR`` the
    first time (a minute with a reachable mirror). Skip (fail under
    GPUDOCTOR_REQUIRE_LAB) when debootstrap is missing or cannot reach the mirror."""
    if TARBALL.is_file():
        return TARBALL
    if shutil.which("debootstrap") is None:
        lab_unavailable("debootstrap missing (apt-get install debootstrap; tests/run.sh does)")
    CACHE.mkdir(parents=True, exist_ok=True)
    work = CACHE / f"build-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    mirror = debian_mirror()
    try:
        done = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(work / "rootfs"), mirror],
            capture_output=True, text=True, timeout=1500,
        )  # fmt: skip
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            lab_unavailable(f"debootstrap {SUITE} from {mirror} failed: {' | '.join(tail)}")
        partial = CACHE / f".{TARBALL.name}.{os.getpid()}"
        with tarfile.open(partial, "w") as tar:
            tar.add(work / "rootfs", arcname=".")
        os.replace(partial, TARBALL)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return TARBALL


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
