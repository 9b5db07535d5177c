"""The NVIDIA device nodes as they were BEFORE the CUDA/NVML probe, and what the probe changed.

The NVIDIA user-space driver (libcuda, libnvidia-ml), running as root with the kernel
module's ``ModifyDeviceFiles`` on (the default, ``/proc/driver/nvidia/params``), removes a
node whose major or minor it thinks wrong and tries to create the right one. In a container
whose cgroup denies the new major, the re-create fails: a plain ``cuInit(0)`` as root leaves
the container without ``/dev/nvidia-uvm`` (issue 21). A diagnosis must observe before it
disturbs: the runner takes a :class:`NodeSnapshot` (``stat`` of every NVIDIA node,
``/proc/devices``, the cgroup and id-map files) before it starts the probe, the node checks
read that snapshot, and ``device.unchanged`` compares it with the nodes after the probe.

For a local ``gpudoctor check`` the probe starts first thing in the process
(:mod:`gpudoctor.early_probe`), so that module takes the same snapshot itself, with plain
``os`` calls, just before it forks the probe; :func:`from_early` turns it into this form.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass

from gpudoctor import early_probe
from gpudoctor.facts.nodes import discover_nvidia_nodes
from gpudoctor.hosts.base import FileStat, Host

PARAMS = "/proc/driver/nvidia/params"
STATUS = "/proc/self/status"
# The files read before the probe beside the nodes (early_probe.SNAPSHOT_FILES lists them).
FILES = early_probe.SNAPSHOT_FILES


@dataclass(frozen=True)
class NodeSnapshot:
    """The NVIDIA nodes (and the ``--device`` paths) at one moment.

    Attributes:
        nodes: the NVIDIA node paths present, in discovery order (``ls /dev/nvidia*``).
        stats: (path, FileStat or None when it did not exist) for every path looked at.
        files: (path, text or None when unreadable) for :data:`FILES` (``/proc/devices``...).
    """

    nodes: tuple[str, ...] = ()
    stats: tuple[tuple[str, FileStat | None], ...] = ()
    files: tuple[tuple[str, str | None], ...] = ()

    def stat(self, path: str) -> FileStat | None:
        """Return the path's stat in this snapshot (None: missing or not looked at)."""
        return dict(self.stats).get(path)

    def looked_at(self, path: str) -> bool:
        """Return True when this snapshot holds ``path``'s stat (or its absence)."""
        return any(p == path for p, _ in self.stats)

    @property
    def paths(self) -> tuple[str, ...]:
        """Return every path this snapshot looked at, in order."""
        return tuple(p for p, _ in self.stats)


def stat_or_none(host: Host, path: str) -> FileStat | None:
    """Return ``stat PATH`` through ``host``, None when it does not exist (other errors raise)."""
    try:
        return host.stat(path)
    except FileNotFoundError:
        return None


def read_or_none(host: Host, path: str) -> str | None:
    """Return the file's text through ``host`` (``cat PATH``), None when unreadable."""
    try:
        return host.read_text(path)
    except OSError:
        return None


def take(host: Host, extra: Iterable[str] = (), files: Iterable[str] = FILES) -> NodeSnapshot:
    """Return the snapshot of ``host`` now: ``ls`` of the NVIDIA node directories, ``stat`` of
    every NVIDIA node found and of each ``extra`` path, and the text of each of ``files``."""
    nodes = tuple(discover_nvidia_nodes(host.list_dir))
    stats = []
    for path in dict.fromkeys([*nodes, *extra]):
        try:
            stats.append((path, stat_or_none(host, path)))
        except OSError:  # not looked at: the node checks stat it and report the error
            continue
    return NodeSnapshot(
        nodes=nodes,
        stats=tuple(stats),
        files=tuple((f, read_or_none(host, f)) for f in files),
    )


def from_early(raw: dict) -> NodeSnapshot:
    """Return the snapshot :func:`gpudoctor.early_probe.snapshot` took (``os.stat`` results,
    listings and file bytes, or the errno of each failure) in this form."""
    from gpudoctor.hosts.agent.server import stat_fields

    def list_dir(path: str) -> list[str]:
        names = raw["dirs"].get(path, errno.ENOENT)
        if isinstance(names, int):
            raise OSError(names, os.strerror(names), path)
        return list(names)

    def stat_of(path: str) -> FileStat | None:
        st = raw["stats"].get(path, errno.ENOENT)
        return None if isinstance(st, int) else FileStat(**stat_fields(path, st))

    def text_of(data: bytes | int) -> str | None:
        return None if isinstance(data, int) else data.decode("utf-8", "replace")

    nodes = tuple(discover_nvidia_nodes(list_dir))
    return NodeSnapshot(
        nodes=nodes,
        stats=tuple((p, stat_of(p)) for p in nodes),
        files=tuple((f, text_of(d)) for f, d in raw["files"].items()),
    )


@dataclass(frozen=True)
class NodeChange:
    """One path whose stat differs between two snapshots.

    Attributes:
        path: the node's path.
        before: its stat before the probe (None: it did not exist).
        after: its stat after the probe (None: it does not exist now).
    """

    path: str
    before: FileStat | None
    after: FileStat | None

    @property
    def kind(self) -> str:
        """Return ``removed``, ``created`` or ``changed`` (other type, major:minor or mode)."""
        if self.after is None:
            return "removed"
        return "created" if self.before is None else "changed"


def same_node(a: FileStat, b: FileStat) -> bool:
    """Return True when two stats are the same node: type, major:minor, mode and owner."""
    return (a.kind, a.major, a.minor, a.mode, a.uid, a.gid) == (
        b.kind, b.major, b.minor, b.mode, b.uid, b.gid,
    )  # fmt: skip


def changes(before: NodeSnapshot, after: NodeSnapshot) -> list[NodeChange]:
    """Return the paths whose node differs in ``after`` from ``before``, in path order."""
    old, new = dict(before.stats), dict(after.stats)
    out = []
    for path in dict.fromkeys([*old, *new]):
        a, b = old.get(path), new.get(path)
        if a is None and b is None:
            continue
        if a is None or b is None or not same_node(a, b):
            out.append(NodeChange(path, a, b))
    return out


def again(host: Host, before: NodeSnapshot) -> NodeSnapshot:
    """Return the snapshot of ``host`` now, for comparison with ``before``: the NVIDIA nodes
    present now plus every path ``before`` looked at (no files re-read)."""
    return take(host, before.paths, files=())


def effective_uid(status_text: str | None) -> int | None:
    """Return the effective uid from ``/proc/self/status`` (``Uid: real effective ...``)."""
    for line in (status_text or "").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) >= 3 and fields[2].isdigit():
                return int(fields[2])
    return None


def modify_device_files(params_text: str | None) -> str | None:
    """Return the ``ModifyDeviceFiles`` line of ``/proc/driver/nvidia/params``
    (``grep ModifyDeviceFiles``), or None when the file or the line is absent."""
    for line in (params_text or "").splitlines():
        if line.strip().startswith("ModifyDeviceFiles"):
            return line.strip()
    return None
