"""Host device facts for the planner: /proc/devices and the device nodes, read through a Host.

This is the only part of the planner's input that touches a machine; the result is a
frozen :class:`HostFacts` the pure planner works on (and tests build from captures).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpudoctor.facts.nodes import NVIDIA_FAMILIES
from gpudoctor.facts.procfs import ProcDevices, parse_proc_devices
from gpudoctor.hosts.base import FileStat, Host
from gpudoctor.pve.hooks import Hook

MISSING = "missing"


@dataclass(frozen=True)
class HostNode:
    """What ``stat PATH`` says of one path on the CT's host.

    Attributes:
        path: the absolute host path (``/dev/nvidia-uvm``).
        kind: ``char``, ``block``, ``dir``, ``file``, ``other`` or ``missing``.
        major: char/block major (0 otherwise).
        minor: char/block minor.
        mode: permission bits (``0o666``).
        gid: owner group id.
        children: for a directory, its char nodes (``/dev/nvidia-caps/nvidia-cap1`` ...).
    """

    path: str
    kind: str
    major: int = 0
    minor: int = 0
    mode: int = 0
    gid: int = 0
    children: tuple[HostNode, ...] = ()

    @property
    def exists(self) -> bool:
        """Return True unless the path is missing on the host."""
        return self.kind != MISSING

    @property
    def char_nodes(self) -> tuple[HostNode, ...]:
        """Return the char nodes this path stands for (itself, or a directory's children)."""
        if self.kind == "char":
            return (self,)
        return tuple(c for c in self.children if c.kind == "char")


@dataclass(frozen=True)
class HostFacts:
    """Everything the planner knows about the CT's host.

    Attributes:
        devices: the parsed ``/proc/devices``.
        nodes: every path looked at (NVIDIA nodes found in /dev, requested devices,
            devices the config already passes through), missing ones included.
        nvidia: the paths of the NVIDIA nodes and node directories found in /dev.
        pve_version: ``8.2.4`` from ``pveversion``, or None when unknown / not Proxmox.
        hooks: the CT config's hooks with the mknods their scripts hold
            (:func:`gpudoctor.pve.hooks.read_hooks`; empty when not read).
    """

    devices: ProcDevices
    nodes: tuple[HostNode, ...] = ()
    nvidia: tuple[str, ...] = ()
    pve_version: str | None = None
    hooks: tuple[Hook, ...] = ()

    def node(self, path: str) -> HostNode | None:
        """Return the facts about ``path``, or None when it was not looked at."""
        return next((n for n in self.nodes if n.path == path), None)


def node_from_stat(st: FileStat, children: tuple[HostNode, ...] = ()) -> HostNode:
    """Return a :class:`HostNode` from a Host's ``stat`` result."""
    return HostNode(st.path, st.kind, st.major, st.minor, st.mode, st.gid, children)


def look_at(host: Host, path: str) -> HostNode:
    """Return the node at ``path`` on the host (``stat PATH``; for a directory under /dev,
    its char children too)."""
    try:
        st = host.stat(path)
    except OSError:
        return HostNode(path, MISSING)
    if st.kind != "dir" or not path.startswith("/dev/"):
        return node_from_stat(st)
    children = []
    try:
        names = host.list_dir(path)
    except OSError:
        names = []
    for name in names:
        child = look_at_file(host, f"{path.rstrip('/')}/{name}")
        if child.kind == "char":
            children.append(child)
    return node_from_stat(st, tuple(children))


def look_at_file(host: Host, path: str) -> HostNode:
    """Return the node at ``path`` without descending into directories."""
    try:
        return node_from_stat(host.stat(path))
    except OSError:
        return HostNode(path, MISSING)


def nvidia_paths(dev_names: Iterable[str]) -> list[str]:
    """Return the /dev paths among ``ls /dev`` names that are NVIDIA nodes or node dirs."""
    found = []
    for name in sorted(dev_names):
        if "nvidia" not in name:  # every NVIDIA node and node directory in /dev says so
            continue
        for family in NVIDIA_FAMILIES:
            if (family.is_dir and f"/dev/{name}" == family.directory) or (
                family.directory == "/dev" and family.matches(name)
            ):
                found.append(f"/dev/{name}")
    return found


def parse_pveversion(text: str) -> str | None:
    """Return the pve-manager version in ``pveversion`` output (``8.2.4``), or None."""
    match = re.search(r"pve-manager/(\d+(?:\.\d+)*)", text)
    return match.group(1) if match else None


def gather(
    host: Host, paths: Iterable[str], with_pve_version: bool = False, pveversion: str = "pveversion"
) -> HostFacts:
    """Return the host's facts: ``cat /proc/devices``, ``ls /dev/nvidia*`` + ``stat`` of each,
    ``stat`` of every path in ``paths``, and ``pveversion`` when asked (``pveversion``: the
    command; a missing command or unreadable answer gives version None)."""
    devices = parse_proc_devices(host.read_text("/proc/devices"))
    try:
        nvidia = nvidia_paths(host.list_dir("/dev"))
    except OSError:
        nvidia = []
    wanted = list(dict.fromkeys([*nvidia, *paths]))
    nodes = tuple(look_at(host, path) for path in wanted)
    version = None
    if with_pve_version:
        try:
            result = host.run([pveversion], timeout=15)
            version = parse_pveversion(result.stdout) if result.ok else None
        except OSError:
            version = None
    return HostFacts(devices, nodes, tuple(nvidia), version)
