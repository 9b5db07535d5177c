"""What a fleet run asks a CT for in one round trip before its checks run.

The checks inside a CT read the same handful of facts every time (``/proc/devices``,
``/proc/self/status``, ``/proc/self/mounts``, ``/proc/meminfo``, the NVIDIA version file,
the NVIDIA node directories, ``df /dev/shm``, then ``stat`` and ``open`` of every device
node). :func:`prefetch_ct` sends them to the CT's agent pipelined (one write, answers
read in order: one round trip, plus one more for the NVIDIA nodes found in ``/dev``) and
the ContainerHost serves the checks from those answers
(:meth:`~gpudoctor.hosts.agent.client.AgentHost.prefetch`); the checks and the Host interface
are unchanged, and whatever a check asks beyond these goes to the agent as before.
Only the fleet check uses it: its ContainerHost lives for one check run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpudoctor.context import CheckOptions
from gpudoctor.early_probe import SNAPSHOT_FILES
from gpudoctor.facts.kernel import CONTAINER_FILES, DOCKER_MARKER
from gpudoctor.facts.nodes import NVIDIA_FAMILIES, discover_nvidia_nodes
from gpudoctor.hosts.base import Host

ENABLED = True  # False: no prefetch (the benchmark's "before" path)
TEXT_LIMIT = 1 << 20  # AgentHost.read_text's default limit: the checks' reads use it
# The files the CT checks read on every run (proc.usable, driver.loaded, device.*,
# shm.capacity, driver.userspace_match); the cgroup v1 list only on EPERM, but it is
# cheap and EPERM is the common finding.
# Also the node snapshot's files (read before the probe, early_probe.SNAPSHOT_FILES) and
# the files that tell a CT from a host (facts.kernel.CONTAINER_FILES, for the host checks).
CT_FILES = tuple(
    dict.fromkeys(
        (
            "/proc/devices",
            "/proc/self/status",
            "/proc/self/mounts",
            "/proc/meminfo",
            "/proc/driver/nvidia/version",
            "/sys/fs/cgroup/devices/devices.list",
            *SNAPSHOT_FILES,
            *CONTAINER_FILES,
        )
    )
)
SHM = "/dev/shm"


def node_requests(paths: Iterable[str], open_nodes: bool) -> list[tuple[str, dict[str, Any]]]:
    """Return ``stat`` of every path and, with ``open_nodes``, its ``open(O_RDWR)`` where it
    is a char/block node (what device.nodes and device.open ask)."""
    requests: list[tuple[str, dict[str, Any]]] = []
    for path in paths:
        requests.append(("stat", {"path": path}))
        if open_nodes:
            requests.append(("try_open", {"path": path, "write": True, "nodes_only": True}))
    return requests


def ct_requests(options: CheckOptions, open_nodes: bool) -> list[tuple[str, dict[str, Any]]]:
    """Return the first round trip's requests: the files, the NVIDIA node directories,
    ``df /dev/shm`` and the ``--device`` nodes."""
    requests: list[tuple[str, dict[str, Any]]] = [
        ("read_text", {"path": path, "limit": TEXT_LIMIT}) for path in CT_FILES
    ]
    directories = sorted({family.directory for family in NVIDIA_FAMILIES})
    requests += [("list_dir", {"path": directory}) for directory in directories]
    requests.append(("disk_usage", {"path": SHM}))
    requests.append(("stat", {"path": DOCKER_MARKER}))  # the host checks: a CT or a host?
    return requests + node_requests((d.path for d in options.devices), open_nodes)


def prefetch_ct(host: Host, options: CheckOptions, open_nodes: bool) -> int:
    """Prefetch the CT's facts into ``host`` (two round trips at most: the files, lists and
    ``--device`` nodes, then the NVIDIA nodes found); return how many answers were kept
    (0 when disabled or when the agent cannot take pipelined requests)."""
    if not ENABLED:
        return 0
    kept = host.prefetch(ct_requests(options, open_nodes))
    if not kept:
        return 0
    asked = {d.path for d in options.devices}
    found = [p for p in discover_nvidia_nodes(host.list_dir) if p not in asked]
    return kept + host.prefetch(node_requests(found, open_nodes))
