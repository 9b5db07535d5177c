"""Stand-in hosts of the Proxmox VE generations gpudoctor meets over SSH.

Proxmox VE 7 runs on Debian 11 (Python 3.9), PVE 8 on Debian 12 (Python 3.11: this
machine, so the rest of the suite), PVE 9 on Debian 13 (Python 3.13). gpudoctor sends its
remote programs (the host agent, the config program, the probes) to run under the HOST's
own ``python3``, and its in-CT agents under the CT's ``python3`` or ``/bin/sh``; so each
generation's userland must run them.

A :class:`StandinHost` is a real LXC container (tests/lab) whose rootfs is that Debian
release, built by ``debootstrap`` (tests/lab/debian_rootfs.py, cached in set-up), with
nothing of this machine bind-mounted: its own ``python3``, coreutils, dash, util-linux. Its
init is that release's own OpenSSH server on ``127.0.0.1:PORT`` (the CT shares this
machine's network namespace, ``lxc.net.0.type = none``), with a fresh host key and a root
login by a fresh client key. So it is both a "host" reached by SSH and an "old CT" reached
by ``lxc-attach``. What it is not: Proxmox (no ``pct``, no pmxcfs) and no GPU (the lab's
stand-in node ``/dev/fakegpu`` is bind-mounted in, as for every lab CT).

    .venv/bin/python -m tests.lab.pve_generations   # set-up: build the rootfs tarballs
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

from gpudoctor.hosts.ssh.host import SSHHost
from tests.lab.debian_rootfs import DebianRelease, RootfsUnavailable, rootfs_tarball, unpack
from tests.lab.lxc import Lab, LabContainer, LabError
from tests.lab.sshd import free_port, keygen, lab_ssh_host

PVE7 = DebianRelease("bullseye", 11, ("python3", "openssh-server"), "pve7")
PVE9 = DebianRelease("trixie", 13, ("python3", "openssh-server"), "pve9")
# Debian 13's Python 3.13 also runs the unit suite in a chroot (tests/lab/python313.py):
# venv, the CA store for pip, gcc for the fake libcuda the unit tests build.
PY313 = DebianRelease(
    "trixie", 13, ("python3", "python3-venv", "ca-certificates", "gcc", "libc6-dev"), "py313"
)
GENERATIONS: dict[str, DebianRelease] = {"pve7": PVE7, "pve9": PVE9}
PYTHON_OF = {"pve7": (3, 9), "pve9": (3, 13)}
"""The ``python3`` each generation's Debian ships (major, minor)."""

SSHD_CONFIG = "/etc/ssh/sshd_config_gpudoctor_lab"


class StandinHost(LabContainer):
    """A Proxmox-generation stand-in host: a lab CT of ``release``'s own userland whose
    PID 1 is its sshd on 127.0.0.1:``port``.

    Attributes:
        release: the Debian release of its rootfs.
        port: the TCP port its sshd listens on.
        spec: the ``--host`` value reaching it (``root@127.0.0.1:PORT``).
        client_key: the private key of a root login it accepts.
        known_hosts: a known_hosts file holding its host key.
    """

    def __init__(
        self,
        lab: Lab,
        name: str,
        release: DebianRelease,
        allow: Iterable[str] = (),
        devices: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(lab, name, allow, devices)
        self.release = release
        self.port = free_port()
        self.spec = f"root@127.0.0.1:{self.port}"
        self.client_key = self.dir / "client_key"
        self.known_hosts = self.dir / "known_hosts"

    def create(self) -> StandinHost:
        """Unpack the cached rootfs, give it a host key, a root login key and an sshd
        config, and write the LXC config; return self."""
        self.dir.mkdir(parents=True)
        unpack(self.release, self.rootfs)
        host_key = keygen(self.dir / "ssh_host_ed25519_key", "gpudoctor-standin-host")
        keygen(self.client_key, "gpudoctor-standin-client")
        etc_ssh = self.rootfs / "etc/ssh"
        (etc_ssh / "gpudoctor_lab_host_key").write_bytes(host_key.read_bytes())
        (etc_ssh / "gpudoctor_lab_host_key").chmod(0o600)
        ssh_dir = self.rootfs / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        (self.rootfs / "run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        (self.rootfs / SSHD_CONFIG.lstrip("/")).write_text(
            "\n".join([
                f"Port {self.port}", "ListenAddress 127.0.0.1",
                "HostKey /etc/ssh/gpudoctor_lab_host_key", "PidFile none", "UsePAM no",
                "PermitRootLogin prohibit-password", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "MaxSessions 64", "MaxStartups 64", "",
            ])
        )  # fmt: skip
        key_type, key_b64 = host_key.with_suffix(".pub").read_text().split()[:2]
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {key_type} {key_b64}\n")
        self.write_config()
        return self

    def render_config(self) -> str:
        """Return the LXC config: the release's own rootfs (nothing of this machine
        mounted), this machine's network namespace, sshd as init, the stand-in GPU."""
        lines = [
            f"lxc.uts.name = {self.name}",
            f"lxc.rootfs.path = dir:{self.rootfs}",
            "lxc.net.0.type = none",
            "lxc.apparmor.profile = unconfined",
            f"lxc.init.cmd = /usr/sbin/sshd -D -e -f {SSHD_CONFIG}",
            "lxc.signal.halt = SIGTERM",
            "lxc.autodev = 1",
            "lxc.console.path = none",
            "lxc.tty.max = 0",
            "lxc.pty.max = 16",
            "lxc.mount.auto = proc:mixed sys:mixed cgroup:mixed",
            "lxc.mount.entry = tmpfs tmp tmpfs rw,nosuid,nodev,mode=1777 0 0",
            "lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,mode=1777,create=dir 0 0",
            *self.device_lines(),
        ]
        return "\n".join(lines) + "\n"

    def wait_for_sshd(self, bound_s: float = 60.0) -> StandinHost:
        """Return self once the CT's sshd accepts TCP connections (the event); raise
        LabError with the CT's log when the CT stops first, or after ``bound_s``."""
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            if self.state() != "RUNNING":
                raise LabError(f"stand-in {self.name} stopped: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        raise LabError(f"stand-in {self.name}: no sshd on port {self.port}: {self.log_tail()}")

    def host(self, **opts: Any) -> SSHHost:
        """Return an SSHHost for root on this stand-in, trusting only its known_hosts."""
        return lab_ssh_host(self.spec, self.client_key, self.known_hosts, **opts)


def standin_host(lab: Lab, generation: str, allow: Iterable[str] = ()) -> StandinHost:
    """Create and start the stand-in host of ``generation`` (``pve7``/``pve9``) with the
    lab's stand-in GPU at /dev/fakegpu; return it once its sshd answers. Raise
    RootfsUnavailable when its rootfs cannot be built here."""
    ct = StandinHost(lab, f"standin-{generation}", GENERATIONS[generation], allow,
                     {"/dev/fakegpu": str(lab.fake_gpu)})  # fmt: skip
    ct.create()
    lab.containers.append(ct)
    ct.start()
    return ct.wait_for_sshd()


def main() -> int:
    """Set-up: build (or find cached) every generation's rootfs tarball; print each path.
    Return 1 when one cannot be built (the reason on stderr)."""
    status = 0
    for generation, release in {**GENERATIONS, "py313": PY313}.items():
        try:
            print(f"{generation}: {rootfs_tarball(release)}")
        except RootfsUnavailable as exc:
            print(f"{generation}: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
