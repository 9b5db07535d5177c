"""Which NVIDIA device nodes a host should have, from the majors in /proc/devices.

Majors of nvidia-uvm, nvidia-caps and friends are DYNAMIC (allocated at module load),
so the expected major of every node is read from /proc/devices, never hard-coded. 195 is
registered as ``nvidia-frontend`` by drivers before 545, and as ``nvidia`` + ``nvidiactl``
since (see tests/data/recorded/proc_devices/SOURCES.md): both are accepted.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from gpudoctor.facts.procfs import ProcDevices


@dataclass(frozen=True)
class NodeFamily:
    """A group of NVIDIA nodes served by one driver major.

    Attributes:
        driver: the canonical /proc/devices name (``nvidia-uvm``).
        aliases: every /proc/devices name that registers this major.
        directory: where the nodes live (``/dev`` or ``/dev/nvidia-caps``).
        pattern: a regex the node names match.
        required: nodes CUDA cannot work without (``/dev/nvidiactl``, ``/dev/nvidia-uvm``).
        at_least_one: a pattern of which at least one node must exist (``nvidia[0-9]+``).
        is_dir: True when the nodes live in their own directory (bind-mount with create=dir).
    """

    driver: str
    aliases: tuple[str, ...]
    directory: str
    pattern: str
    required: tuple[str, ...] = ()
    at_least_one: str = ""
    is_dir: bool = False

    def matches(self, name: str) -> bool:
        """Return True when a node name (no directory) belongs to this family."""
        return compiled(self.pattern).fullmatch(name) is not None


@functools.cache
def compiled(pattern: str) -> re.Pattern[str]:
    """Return ``pattern`` compiled, once (a fleet run matches every node name of every
    node listing against each family)."""
    return re.compile(pattern)


NVIDIA_FAMILIES: tuple[NodeFamily, ...] = (
    NodeFamily(
        "nvidia",
        ("nvidia", "nvidiactl", "nvidia-frontend"),
        "/dev",
        r"nvidia(ctl|[0-9]+|-modeset)",
        required=("nvidiactl",),
        at_least_one=r"nvidia[0-9]+",
    ),
    NodeFamily(
        "nvidia-uvm", ("nvidia-uvm",), "/dev", r"nvidia-uvm(-tools)?", required=("nvidia-uvm",)
    ),
    NodeFamily(
        "nvidia-caps", ("nvidia-caps",), "/dev/nvidia-caps", r"nvidia-cap[0-9]+", is_dir=True
    ),
    NodeFamily(
        "nvidia-caps-imex-channels",
        ("nvidia-caps-imex-channels",),
        "/dev/nvidia-caps-imex-channels",
        r"channel[0-9]+",
        is_dir=True,
    ),
    NodeFamily("nvidia-nvswitch", ("nvidia-nvswitch",), "/dev", r"nvidia-nvswitch[0-9]+"),
)


def family_major(devices: ProcDevices, family: NodeFamily) -> int | None:
    """Return the family's current major from /proc/devices, or None when not registered."""
    return devices.char_major(*family.aliases)


def nvidia_majors(devices: ProcDevices) -> dict[str, int]:
    """Return {driver name: major} for every NVIDIA family registered in /proc/devices."""
    majors = {}
    for family in NVIDIA_FAMILIES:
        major = family_major(devices, family)
        if major is not None:
            majors[family.driver] = major
    return majors


def family_of(path: str) -> NodeFamily | None:
    """Return the NVIDIA family a node path belongs to (``/dev/nvidia-uvm`` -> nvidia-uvm)."""
    directory, _, name = path.rpartition("/")
    for family in NVIDIA_FAMILIES:
        if directory == family.directory and family.matches(name):
            return family
    return None


def driver_name_for_major(devices: ProcDevices, major: int) -> str:
    """Return a readable name for a major (``nvidia-uvm``), or ``major N`` when unknown."""
    names = devices.char_names(major)
    return "/".join(names) if names else f"major {major} (not in /proc/devices)"


def discover_nvidia_nodes(list_dir: Callable[[str], list[str]]) -> list[str]:
    """Return the paths of every NVIDIA node present (``ls /dev/nvidia* /dev/nvidia-caps*``),
    given a ``list_dir`` function (a Host's); missing directories are skipped."""
    found: list[str] = []
    for directory in sorted({f.directory for f in NVIDIA_FAMILIES}):
        try:
            names = list_dir(directory)
        except OSError:
            continue
        for name in names:
            path = f"{directory}/{name}"
            if family_of(path) is not None:
                found.append(path)
    return found


KIND_PHRASES = {
    "char": "a character device",
    "block": "a block device",
    "dir": "a directory",
    "file": "a regular file",
    "link": "a symbolic link",
    "fifo": "a FIFO",
    "socket": "a socket",
}


def a_kind(kind: str) -> str:
    """Return a FileStat ``kind`` in words, with its article (``fifo`` -> ``a FIFO``,
    ``file`` -> ``a regular file``; ``stat -c %F`` says the same); an unknown kind is
    ``a file of unknown type (KIND)``."""
    return KIND_PHRASES.get(kind, f"a file of unknown type ({kind})")
