"""A lab container made by ``lxc-create -t busybox`` that holds nothing else.

LXC's own busybox template builds the rootfs (a static busybox and its applet links, an
``/etc/inittab``); unlike :class:`tests.lab.lxc.LabContainer` nothing of the host is
bind-mounted in: no ``/usr``, no libraries, no python3. The template's library mounts are
dropped from the config, so the CT is what a minimal busybox service CT is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tests.lab.lxc import BASE_DEVICE_RULES, Lab, LabContainer, LabError

# Template config lines replaced by the lab's own (network, host library mounts).
DROPPED = ("lxc.net.", "lxc.mount.entry = /lib", "lxc.mount.entry = /usr", "lxc.apparmor.")


class BusyboxContainer(LabContainer):
    """A real LXC container from the busybox template; device rules and bind-mounted
    nodes as for :class:`LabContainer` (``allow``, ``devices``)."""

    def __init__(
        self,
        lab: Lab,
        name: str,
        allow: Iterable[str] = (),
        devices: Mapping[str, str] | None = None,
        extra_config: Iterable[str] = (),
    ) -> None:
        super().__init__(lab, name, allow, devices, extra_config)
        self.template_config = ""

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
        return self

    def render_config(self) -> str:
        """Return the template's config plus the lab's lines (no network, unconfined, no
        console, the device nodes bind-mounted, cgroup2 device rules)."""
        lines = [
            self.template_config,
            "lxc.net.0.type = empty",
            "lxc.apparmor.profile = unconfined",
            "lxc.console.path = none",
        ]
        for inside, host_path in self.devices.items():
            rel = inside.lstrip("/")
            lines.append(f"lxc.mount.entry = {host_path} {rel} none bind,optional,create=file 0 0")
        lines.append("lxc.cgroup2.devices.deny = a")
        lines += [f"lxc.cgroup2.devices.allow = {rule}" for rule in BASE_DEVICE_RULES]
        lines += [f"lxc.cgroup2.devices.allow = {rule}" for rule in self.allow]
        lines += self.extra_config
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
) -> BusyboxContainer:
    """Create (and by default start) a busybox-template container in the lab."""
    ct = BusyboxContainer(lab, lab.unique_name("bb"), allow, devices, extra_config)
    ct.create()
    lab.containers.append(ct)
    if start:
        ct.start()
    return ct
