"""ContainerHost: the inside of an LXC / Proxmox container, reached from its host.

The agent runs INSIDE the container, started on the container's host (a LocalHost or
an SSHHost) by ``pct exec <id> -- python3 -I -c ...`` (flavor ``pve``) or
``lxc-attach -n <name> [-P lxcpath] -- python3 -I -c ...`` (flavor ``lxc``); its
stdin/stdout carry the protocol. Nothing of gpudoctor needs to be installed in the
container, only a ``python3``.
"""

from __future__ import annotations

from gpudoctor.hosts.base import Host, HostError
from gpudoctor.hosts.remote import AgentHost, ByteStream, ProcessStream, agent_command

FLAVORS = ("pve", "lxc")


def enter_command(flavor: str, ct: str, lxcpath: str | None = None) -> list[str]:
    """Return the argv prefix that runs a command inside the container on its host
    (``pct exec ID --`` or ``lxc-attach -n NAME [-P PATH] --``)."""
    if flavor == "pve":
        return ["pct", "exec", str(ct), "--"]
    if flavor == "lxc":
        return ["lxc-attach", "-n", str(ct), *(["-P", lxcpath] if lxcpath else []), "--"]
    raise HostError(f"unknown container flavor {flavor!r} (expected one of {', '.join(FLAVORS)})")


def open_stream(host: Host, argv: list[str]) -> ByteStream:
    """Start ``argv`` on ``host`` and return its pipes: through the host's own
    ``open_stream`` (SSHHost, lab hosts), else as a local subprocess (LocalHost)."""
    opener = getattr(host, "open_stream", None)
    if opener is not None:
        return opener(argv)
    from gpudoctor.hosts.local import LocalHost

    if isinstance(host, LocalHost):
        return ProcessStream(argv)
    raise HostError(f"{host.name}: cannot start a command stream on this kind of host")


class ContainerHost(AgentHost):
    """A container seen from its host; every Host operation runs inside it.

    Args:
        parent: the container's host (LocalHost, SSHHost, or anything with ``open_stream``).
        ct: the Proxmox VMID (``200``) or the LXC container name.
        flavor: ``pve`` (``pct exec``) or ``lxc`` (``lxc-attach``).
        lxcpath: LXC's container directory for flavor ``lxc`` (``-P``); None = default.
        python: the interpreter inside the container.

    The name is ``<host>/ct<id>`` (``pve1/ct200``) for Proxmox, ``<host>/<name>`` for
    plain LXC. After the container restarts, the next
    call starts a fresh agent by itself.
    """

    def __init__(
        self,
        parent: Host,
        ct: str | int,
        flavor: str = "pve",
        lxcpath: str | None = None,
        python: str = "python3",
        call_timeout: float = 30.0,
    ) -> None:
        self.parent = parent
        self.ct = str(ct)
        self.flavor = flavor
        self.lxcpath = lxcpath
        argv = enter_command(flavor, self.ct, lxcpath) + agent_command(python)
        super().__init__(
            lambda: open_stream(parent, argv),
            name=f"{parent.name}/ct{self.ct}" if flavor == "pve" else f"{parent.name}/{self.ct}",
            python=python,
            call_timeout=call_timeout,
        )
