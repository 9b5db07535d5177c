"""Will the model fit? Free space of the target filesystem, and RAM when it is tmpfs.

tmpfs pages are memory: a tmpfs mounted with ``size=`` larger than the free RAM
accepts writes until the machine starts swapping or the OOM killer runs. So for tmpfs
(and ramfs) the bytes needed are checked against both the filesystem's free space
(``df -B1 --output=avail DIR``) and the RAM available (``MemAvailable`` in
``/proc/meminfo``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.weights.errors import SpaceError
from gpudoctor.weights.progress import human_bytes

MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
BLOCK = 4096


@dataclass(frozen=True)
class SpaceInfo:
    """Where a path would be written, and how much room there is.

    Attributes:
        path: the existing directory that was measured (the target or its nearest parent).
        mount_point: the mount point of its filesystem.
        fs_type: the filesystem type (``tmpfs``, ``ext4``, ...).
        free_bytes: bytes an unprivileged writer may still use (``f_bavail * f_frsize``).
        size_bytes: the filesystem's total size in bytes.
        ram_available_bytes: ``MemAvailable`` in bytes (None when not a memory filesystem).
    """

    path: str
    mount_point: str
    fs_type: str
    free_bytes: int
    size_bytes: int
    ram_available_bytes: int | None = None

    @property
    def in_memory(self) -> bool:
        """Return True for tmpfs/ramfs (pages of these live in RAM)."""
        return self.fs_type in MEMORY_FILESYSTEMS


def bytes_on_disk(sizes: list[int] | tuple[int, ...]) -> int:
    """Return the bytes that files of these sizes take, each rounded up to a 4 KiB block."""
    return sum(-(-size // BLOCK) * BLOCK for size in sizes)


def check_fits(needed_bytes: int, info: SpaceInfo, what: str = "the model") -> None:
    """Return None when ``needed_bytes`` fit in ``info``; raise :class:`SpaceError` otherwise.

    The message is one line with the numbers (needed, free, filesystem size, RAM).
    """
    if needed_bytes <= info.free_bytes and (
        info.ram_available_bytes is None or needed_bytes <= info.ram_available_bytes
    ):
        return
    where = f"{info.mount_point} ({info.fs_type}, size {human_bytes(info.size_bytes)})"
    if needed_bytes > info.free_bytes:
        reason = f"only {human_bytes(info.free_bytes)} free"
    else:
        reason = f"only {human_bytes(info.ram_available_bytes or 0)} RAM available for tmpfs pages"
    raise SpaceError(
        f"not enough space for {what} in {where}: need {human_bytes(needed_bytes)}"
        f" ({needed_bytes} bytes), {reason}"
    )


def nearest_existing_dir(path: Path) -> Path:
    """Return ``path`` or its nearest ancestor that exists (what ``df`` would measure)."""
    current = path.absolute()
    while not current.is_dir():
        if current.parent == current:
            break
        current = current.parent
    return current


def _mount_of(path: Path, mountinfo_text: str) -> tuple[str, str]:
    """Return (mount point, fs type) of the longest mount point containing ``path``."""
    best = ("/", "unknown")
    target = str(path)
    for line in mountinfo_text.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or not rfields:
            continue
        mount_point = fields[4].encode().decode("unicode_escape")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best[0]):
            best = (mount_point, rfields[0])
    return best


def measure_space(path: Path) -> SpaceInfo:
    """Return the :class:`SpaceInfo` for writing at ``path`` (``df -T PATH`` + MemAvailable)."""
    existing = nearest_existing_dir(path).resolve()
    st = os.statvfs(existing)
    mount_point, fs_type = _mount_of(existing, Path("/proc/self/mountinfo").read_text())
    ram = None
    if fs_type in MEMORY_FILESYSTEMS:
        import psutil

        ram = int(psutil.virtual_memory().available)
    return SpaceInfo(
        path=str(existing),
        mount_point=mount_point,
        fs_type=fs_type,
        free_bytes=st.f_bavail * st.f_frsize,
        size_bytes=st.f_blocks * st.f_frsize,
        ram_available_bytes=ram,
    )


def same_filesystem(a: Path, b: Path) -> bool:
    """Return True when the nearest existing dirs of ``a`` and ``b`` share ``st_dev``."""
    return nearest_existing_dir(a).stat().st_dev == nearest_existing_dir(b).stat().st_dev
