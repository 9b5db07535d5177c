"""Hosts: where checks read facts and where fixes act (the only side-effect layer)."""

from gpudoctor.hosts.base import (
    CommandResult,
    DiskUsage,
    FileStat,
    Host,
    HostError,
    OpenResult,
)
from gpudoctor.hosts.local import LocalHost

__all__ = [
    "CommandResult",
    "DiskUsage",
    "FileStat",
    "Host",
    "HostError",
    "LocalHost",
    "OpenResult",
]
