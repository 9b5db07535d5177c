"""Write unit files under a root directory and enable them (the only module here that
writes). ``root="/"`` installs on this machine; another root installs into a CT's rootfs
or a test directory, as ``systemctl --root=ROOT enable`` would.

Every path is resolved inside the root the way ``chroot ROOT`` would
(:func:`gpudoctor.fsio_root.under_root`): a CT's own symlinks (``usr/local/sbin ->
/etc/cron.hourly``) lead to ROOT/etc/cron.hourly, never to this machine's /etc.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpudoctor import fsio, fsio_root
from gpudoctor.service.unitfile import UNIT_DIR


@dataclass(frozen=True)
class UnitFile:
    """One file to install: its absolute path as the target system sees it, its text and
    mode, and the ``*.wants`` target that enables it (None: not enabled by itself)."""

    path: str
    text: str
    mode: int = 0o644
    wanted_by: str | None = None


@dataclass(frozen=True)
class Written:
    """One path ``install`` handled: where on this machine, and ``wrote`` or ``unchanged``."""

    path: str
    action: str


def under_root(root: str | os.PathLike[str], path: str) -> Path:
    """Return ``path`` (absolute on the target system) joined to ``root``, for messages;
    files are opened with :func:`gpudoctor.fsio_root.under_root`, never through this path."""
    return Path(root) / path.lstrip("/")


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _same_file(dir_fd: int, name: str, blob: bytes, mode: int) -> bool:
    st = _lstat(dir_fd, name)
    if st is None or not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != mode:
        return False
    if st.st_size != len(blob):
        return False
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, len(blob) + 1) == blob
    finally:
        os.close(fd)


def put_file(root: str | os.PathLike[str], unit: UnitFile) -> Written:
    """Write ``unit`` at its path resolved inside ``root`` (parents created 0755, links
    inside ROOT followed within it, the last part replaced, never written through); leave
    a file with the same bytes and mode alone. Return what was done."""
    blob = unit.text.encode("utf-8")
    with fsio_root.under_root(root, unit.path, make_parents=True) as (dir_fd, name, shown):
        if _same_file(dir_fd, name, blob, unit.mode):
            return Written(shown, "unchanged")
        fsio.atomic_replace(shown, blob, mode=unit.mode, refuse_non_regular=False, dir_fd=dir_fd)
    return Written(shown, "wrote")


def enable(root: str | os.PathLike[str], unit_path: str, wanted_by: str) -> Written:
    """Link ``UNIT_DIR/WANTED_BY.wants/UNIT`` to the unit (``systemctl --root=ROOT enable``),
    inside ``root``; a link already pointing there is left alone. Return what was done."""
    name = unit_path.rsplit("/", 1)[1]
    link = f"{UNIT_DIR}/{wanted_by}.wants/{name}"
    with fsio_root.under_root(root, link, make_parents=True) as (dir_fd, name, shown):
        st = _lstat(dir_fd, name)
        same = st is not None and stat.S_ISLNK(st.st_mode)
        if same and os.readlink(name, dir_fd=dir_fd) == unit_path:
            return Written(shown, "unchanged")
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        os.symlink(unit_path, tmp, dir_fd=dir_fd)
        try:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    return Written(shown, "wrote")


def install(files: Sequence[UnitFile], root: str | os.PathLike[str] = "/") -> list[Written]:
    """Write every file under ``root`` and enable those with ``wanted_by``; return what
    was done to each path on this machine (files, then links)."""
    if not os.path.isdir(root):  # a new image directory: mkdir -p, through no symlink
        fsio.make_dirs("/", os.path.abspath(root).lstrip("/"))
    written: list[Written] = []
    links: list[Written] = []
    for unit in files:
        written.append(put_file(root, unit))
        if unit.wanted_by:
            links.append(enable(root, unit.path, unit.wanted_by))
    return written + links
