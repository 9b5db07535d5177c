"""Host facts built from the real captures in tests/data/recorded/proc_devices (test support)."""

from __future__ import annotations

import re

from gpudoctor.facts.procfs import parse_proc_devices
from gpudoctor.pve.facts import HostFacts, HostNode
from tests.recorded import RECORDED as DATA

H200_PROC_DEVICES = DATA / "proc_devices/h200-lab_580.159.04_proc-devices.txt"
H200_LS = DATA / "proc_devices/h200-lab_580.159.04_ls-dev-nvidia.txt"
LS_LINE = re.compile(r"(c)([rwx-]{9})\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s+.*?(\S+)$")


def nodes_from_ls(text: str) -> tuple[HostNode, ...]:
    """Return the char nodes of an ``ls -l /dev/nvidia*`` capture (``/dev/nvidia-caps:``
    blocks become a directory node with children), modes from the permission string."""
    top: list[HostNode] = []
    dirs: dict[str, list[HostNode]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.endswith(":") and line.startswith("/dev/"):
            current = line[:-1]
            dirs[current] = []
            continue
        match = LS_LINE.match(line)
        if not match:
            continue
        perms, major, minor, name = (
            match.group(2),
            int(match.group(3)),
            int(match.group(4)),
            match.group(5),
        )
        mode = int("".join("0" if c == "-" else "1" for c in perms), 2)
        path = name if name.startswith("/") else f"{current}/{name}"
        node = HostNode(path, "char", major, minor, mode)
        (dirs[current] if current and not name.startswith("/") else top).append(node)
    for path, children in dirs.items():
        top.append(HostNode(path, "dir", 0, 0, 0o755, children=tuple(children)))
    return tuple(top)


def h200_facts(pve_version: str | None = None) -> HostFacts:
    """Return the lent H200's facts: /proc/devices (uvm 238, caps 241) + its /dev/nvidia*."""
    nodes = nodes_from_ls(H200_LS.read_text())
    return HostFacts(
        parse_proc_devices(H200_PROC_DEVICES.read_text()),
        nodes,
        tuple(n.path for n in nodes),
        pve_version,
    )
