"""Write unit files under a root directory and enable them (the only module here that
writes). ``root="/"`` installs on this machine; another root installs into a CT's rootfs
or a test directory, as ``systemctl --root=ROOT enable`` would."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpudoctor import fsio
from gpudoctor.service.unitfile import UNIT_DIR


@dataclass(frozen=True)
class UnitFile:
    """One file to install: its absolute path as the target system sees it, its text and
    mode, and the ``*.wants`` target that enables it (None: not enabled by itself)."""

    path: str
    text: str
    mode: int = 0o644
    wanted_by: str | None = None


def under_root(root: str | os.PathLike[str], path: str) -> Path:
    """Return ``path`` (absolute on the target system) inside ``root`` on this machine."""
    return Path(root) / path.lstrip("/")


def write_file(target: Path, text: str, mode: int) -> None:
    """Write ``text`` to ``target`` atomically (temp file + rename), with ``mode``;
    create the parent directories (``install -D -m MODE``)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fsio.atomic_replace(target, text, mode=mode, refuse_non_regular=False, follow_dir_link=True)


def enable(root: str | os.PathLike[str], unit_path: str, wanted_by: str) -> Path:
    """Link ``UNIT_DIR/WANTED_BY.wants/UNIT`` to the unit (``systemctl --root=ROOT enable``);
    return the link's path on this machine."""
    name = unit_path.rsplit("/", 1)[1]
    link = under_root(root, f"{UNIT_DIR}/{wanted_by}.wants/{name}")
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(unit_path)
    return link


def install(files: Sequence[UnitFile], root: str | os.PathLike[str] = "/") -> list[Path]:
    """Write every file under ``root`` and enable those with ``wanted_by``; return the
    paths written on this machine (files, then links)."""
    written: list[Path] = []
    links: list[Path] = []
    for unit in files:
        target = under_root(root, unit.path)
        write_file(target, unit.text, unit.mode)
        written.append(target)
        if unit.wanted_by:
            links.append(enable(root, unit.path, unit.wanted_by))
    return written + links
