"""SSH targets: parse ``[user@]host[:port]`` and apply ``~/.ssh/config`` (HostName, User,
Port, IdentityFile), as OpenSSH's client does."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from gpudoctor.hosts.base import HostError

DEFAULT_SSH_CONFIG = "~/.ssh/config"


@dataclass(frozen=True)
class SSHTarget:
    """Where to connect: the result of parsing ``user@host:port`` and ``~/.ssh/config``.

    Attributes:
        alias: the host as the user wrote it (``pve1``).
        hostname: the address connected to (``HostName`` from ssh config, else alias).
        port: TCP port.
        user: login user.
        identity_files: private key files to try (``IdentityFile``), expanded.
    """

    alias: str
    hostname: str
    port: int = 22
    user: str = "root"
    identity_files: tuple[str, ...] = field(default_factory=tuple)

    @property
    def known_hosts_name(self) -> str:
        """Return the name under which known_hosts stores this host (``[h]:port``)."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def split_spec(spec: str) -> tuple[str | None, str, int | None]:
    """Return ``(user, host, port)`` from ``[user@]host[:port]`` (IPv6 as ``[::1]:22``)."""
    user, _, rest = spec.rpartition("@")
    port: int | None = None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":"):
            port = _parse_port(tail[1:], spec)
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
        port = _parse_port(port_text, spec)
    else:
        host = rest
    if not host:
        raise HostError(f"bad host {spec!r}: expected [user@]host[:port]")
    return (user or None), host, port


def _parse_port(text: str, spec: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise HostError(f"bad port in {spec!r}: expected [user@]host[:port]")
    return int(text)


def resolve_target(
    spec: str,
    user: str | None = None,
    port: int | None = None,
    ssh_config: str | None = DEFAULT_SSH_CONFIG,
) -> SSHTarget:
    """Return the :class:`SSHTarget` for ``spec``, honouring ``~/.ssh/config`` aliases
    (HostName, User, Port, IdentityFile); explicit values win over the config file."""
    spec_user, alias, spec_port = split_spec(spec)
    conf: dict[str, Any] = {}
    if ssh_config:
        path = Path(ssh_config).expanduser()
        if path.is_file():
            conf = dict(paramiko.SSHConfig.from_path(str(path)).lookup(alias))
    return SSHTarget(
        alias=alias,
        hostname=conf.get("hostname", alias),
        port=int(port or spec_port or conf.get("port", 22)),
        user=user or spec_user or conf.get("user") or "root",
        identity_files=tuple(os.path.expanduser(p) for p in conf.get("identityfile", [])),
    )
