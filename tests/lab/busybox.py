"""A lab container made by ``lxc-create -t busybox`` that holds nothing else.

LXC's own busybox template builds the rootfs (a static busybox and its applet links, an
``/etc/inittab``); unlike :class:`tests.lab.lxc.LabContainer` nothing of the host is
bind-mounted in: no ``/usr``, no libraries, no python3. The template's library mounts are
dropped from the config, so the CT is what a minimal busybox service CT is.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from tests.lab.lxc import Lab, LabContainer, LabError

# Template config lines replaced by the lab's own (network, host library mounts).
DROPPED = ("lxc.net.", "lxc.mount.entry = /lib", "lxc.mount.entry = /usr", "lxc.apparmor.")


# An unprivileged CT's id map (as Proxmox's default: root is host uid 100000).
ID_BASE = 100000
IDMAP = (f"lxc.idmap = u 0 {ID_BASE} 65536", f"lxc.idmap = g 0 {ID_BASE} 65536")


class BusyboxContainer(LabContainer):
    """A real LXC container from the busybox template; device rules and bind-mounted
    nodes as for :class:`LabContainer` (``allow``, ``devices``). ``unprivileged``: with
    :data:`IDMAP`, its rootfs shifted to the mapped ids (as ``lxc-usernsexec``/Proxmox do)."""

    def __init__(
        self,
        lab: Lab,
        name: str,
        allow: Iterable[str] = (),
        devices: Mapping[str, str] | None = None,
        extra_config: Iterable[str] = (),
        unprivileged: bool = False,
    ) -> None:
        super().__init__(
            lab, name, allow, devices, [*(IDMAP if unprivileged else ()), *extra_config]
        )
        self.template_config = ""
        self.unprivileged = unprivileged

    def create(self) -> BusyboxContainer:
        """Run ``lxc-create -t busybox`` in the lab namespace, keep its config (minus the
        host mounts and network) as the base of :meth:`render_config`; return self."""
        result = self.lab.namespace.run(
            ["lxc-create", "-P", self.lxcpath, "-n", self.name, "-t", "busybox"], 120
        )
        if not result.ok:
            raise LabError(f"lxc-create -t busybox failed: {result.stderr.strip()[-400:]}")
        lines = self.config_path.read_text().splitlines()
        self.template_config = "\n".join(
            line for line in lines if not line.strip().startswith(DROPPED)
        )
        self.write_config()
        if self.unprivileged:
            self.shift_ids()
        return self

    def shift_ids(self) -> None:
        """Chown the rootfs to the mapped ids (host id = ID_BASE + id inside) and let the
        mapped root traverse the CT's directory (``chmod 0755``)."""
        for root, dirs, files in os.walk(self.rootfs):
            for name in dirs + files:
                path = os.path.join(root, name)
                st = os.lstat(path)
                os.lchown(path, ID_BASE + st.st_uid, ID_BASE + st.st_gid)
        os.lchown(self.rootfs, ID_BASE, ID_BASE)
        self.dir.chmod(0o755)

    def render_config(self) -> str:
        """Return the template's config plus the lab's lines (no network, unconfined, no
        console, the device nodes bind-mounted, cgroup2 device rules)."""
        lines = [
            self.template_config,
            "lxc.net.0.type = empty",
            "lxc.apparmor.profile = unconfined",
            "lxc.console.path = none",
        ]
        lines += self.device_lines()
        return "\n".join(lines) + "\n"

    def shell(self, script: str, timeout: float = 60.0):  # type: ignore[override]
        """Run ``sh -c SCRIPT`` inside (the CT's own busybox sh)."""
        return self.attach(["/bin/sh", "-c", script], timeout)


def busybox_container(
    lab: Lab,
    allow: Iterable[str] = (),
    devices: Mapping[str, str] | None = None,
    start: bool = True,
    extra_config: Iterable[str] = (),
    unprivileged: bool = False,
) -> BusyboxContainer:
    """Create (and by default start) a busybox-template container in the lab
    (``unprivileged``: with an lxc.idmap, root = host uid 100000)."""
    if unprivileged:
        lab.grant_subordinate_ids(ID_BASE, 65536)
    ct = BusyboxContainer(lab, lab.unique_name("bb"), allow, devices, extra_config, unprivileged)
    ct.create()
    lab.containers.append(ct)
    if start:
        ct.start()
    return ct
