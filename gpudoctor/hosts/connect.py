"""open_host: turn a ``--host`` value into a Host (``local`` or an SSH target)."""

from __future__ import annotations

from typing import Any

from gpudoctor.hosts.base import Host


def open_host(spec: str, **opts: Any) -> Host:
    """Return the Host that ``spec`` names: ``local`` (or empty) -> LocalHost, anything
    else (``root@pve1``, ``root@10.0.0.5:2222``, an ``~/.ssh/config`` alias) -> SSHHost
    built with ``opts`` (``known_hosts``, ``accept_new_host_key``, ``key_filename``,
    ``ssh_config``, ...); the alias is resolved as ``ssh -G`` resolves it (ProxyJump,
    ProxyCommand, IdentityFile, UserKnownHostsFile, HostKeyAlias, ...).
    The SSH connection is opened lazily, on first use (or call ``.connect()``)."""
    if spec in ("", "local"):
        from gpudoctor.hosts.local import LocalHost

        return LocalHost()
    from gpudoctor.hosts.ssh.host import SSHHost

    return SSHHost(spec, **opts)


def open_container(
    parent: Host, ct: str | int, flavor: str = "pve", lxcpath: str | None = None
) -> Host:
    """Return a ContainerHost for container ``ct`` on ``parent`` (``pct exec`` for
    flavor ``pve``, ``lxc-attach`` for ``lxc``)."""
    from gpudoctor.hosts.container import ContainerHost

    return ContainerHost(parent, ct, flavor=flavor, lxcpath=lxcpath)
