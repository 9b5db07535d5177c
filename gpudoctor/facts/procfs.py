"""Parsers for procfs files: /proc/devices, /proc/driver/nvidia/version, /proc/mounts."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcDevices:
    """``cat /proc/devices``: the char and block majors the kernel has registered.

    Attributes:
        char: (major, name) pairs of the "Character devices:" section, in file order.
        block: (major, name) pairs of the "Block devices:" section.
    """

    char: tuple[tuple[int, str], ...] = ()
    block: tuple[tuple[int, str], ...] = ()

    def char_major(self, *names: str) -> int | None:
        """Return the char major registered under the first of ``names`` that exists."""
        for wanted in names:
            for major, name in self.char:
                if name == wanted:
                    return major
        return None

    def char_names(self, major: int) -> list[str]:
        """Return the names registered for a char major (``[]`` when none)."""
        return [name for m, name in self.char if m == major]


DEVICE_LINE = re.compile(r"^(\d+)\s+(\S.*)$")


def parse_proc_devices(text: str) -> ProcDevices:
    """Return the parsed ``/proc/devices``; unknown lines are ignored."""
    char: list[tuple[int, str]] = []
    block: list[tuple[int, str]] = []
    section: list[tuple[int, str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("Character devices"):
            section = char
        elif line.startswith("Block devices"):
            section = block
        elif section is not None:
            match = DEVICE_LINE.match(line)
            if match:
                section.append((int(match.group(1)), match.group(2).strip()))
    return ProcDevices(tuple(char), tuple(block))


@dataclass(frozen=True)
class DriverVersion:
    """``cat /proc/driver/nvidia/version``: the loaded kernel module.

    Attributes:
        version: ``580.159.04``.
        flavor: ``open`` (NVIDIA Open Kernel Module) or ``proprietary``.
        line: the NVRM line as read.
    """

    version: str
    flavor: str
    line: str


def parse_driver_version(text: str) -> DriverVersion | None:
    """Return the kernel module version from /proc/driver/nvidia/version, or None."""
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            match = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", line + " ")
            if match:
                flavor = "open" if "Open Kernel Module" in line else "proprietary"
                return DriverVersion(match.group(1), flavor, line.strip())
    return None


@dataclass(frozen=True)
class Mount:
    """One line of ``/proc/self/mounts``."""

    source: str
    target: str
    fstype: str
    options: tuple[str, ...]

    def option(self, name: str) -> str | None:
        """Return the value of ``name=value`` among the options, or None."""
        prefix = name + "="
        return next((o[len(prefix) :] for o in self.options if o.startswith(prefix)), None)


def parse_mounts(text: str) -> list[Mount]:
    """Return the mounts of ``/proc/self/mounts`` (octal escapes like ``\\040`` decoded)."""

    def unescape(field: str) -> str:
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)

    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            mounts.append(
                Mount(unescape(parts[0]), unescape(parts[1]), parts[2], tuple(parts[3].split(",")))
            )
    return mounts


def mount_of(mounts: list[Mount], path: str) -> Mount | None:
    """Return the mount that holds ``path`` (the longest matching target; last one wins)."""
    best: Mount | None = None
    for mount in mounts:
        target = mount.target.rstrip("/") or "/"
        inside = path == target or path.startswith(target.rstrip("/") + "/") or target == "/"
        if inside and (best is None or len(target) >= len(best.target.rstrip("/") or "/")):
            best = mount
    return best
