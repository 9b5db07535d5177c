"""Paths resolved inside a root the way ``chroot ROOT`` resolves them (part of the one
write module, :mod:`gpudoctor.fsio`): for ``service install --root CTROOT``, where a
compromised CT may have planted absolute symlinks (``usr/local/sbin -> /etc/cron.hourly``)
that must never lead a write out of the CT's root.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from gpudoctor.fsio import _DIR_FLAGS, FsioError, _lstat_at, kind_of


@contextlib.contextmanager
def under_root(
    root: Path | str, path: str, *, follow_last: bool = False, make_parents: bool = False,
    dir_mode: int = 0o755, seen: list[tuple[str, os.stat_result]] | None = None,
) -> Iterator[tuple[int, str, str]]:  # fmt: skip
    """Yield ``(dir_fd, name, shown)`` for ``path`` as ``chroot ROOT`` resolves it:
    ``dir_fd`` holds the last part ``name`` (``shown``: its path on this machine).

    Each directory is opened ``O_NOFOLLOW`` relative to the one before; a symlink is read
    and resolved again inside ROOT (an absolute target from ROOT, ``..`` never above it),
    so no link leads out of ROOT. ``follow_last`` resolves a link at the last part too;
    ``make_parents`` creates missing directories (``mode``); ``seen`` gets ``(shown,
    stat)`` of ROOT and of every directory (and existing last part) walked. Raise
    FsioError for a loop, a non-directory or (without ``make_parents``) a missing one.
    """
    stack = [os.open(root, _DIR_FLAGS)]
    names: list[str] = []
    shown = lambda *more: os.path.join(str(root), *names, *more)  # noqa: E731
    try:
        if seen is not None:
            seen.append((str(root), os.fstat(stack[0])))
        parts = [p for p in path.split("/") if p not in ("", ".")]
        links = 0
        while parts:
            name = parts.pop(0)
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                    names.pop()
                continue
            st = _lstat_at(stack[-1], name)
            if st is None and parts and make_parents:
                os.mkdir(name, dir_mode, dir_fd=stack[-1])
                st = _lstat_at(stack[-1], name)
            if st is not None and stat.S_ISLNK(st.st_mode) and (parts or follow_last):
                links += 1
                if links > 40:
                    raise FsioError(40, f"{shown(name)}: too many levels of symbolic links")
                target = os.readlink(name, dir_fd=stack[-1])
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                    names.clear()
                parts[:0] = [p for p in target.split("/") if p not in ("", ".")]
                continue
            if not parts:
                if st is not None and seen is not None:
                    seen.append((shown(name), st))
                yield stack[-1], name, shown(name)
                return
            if st is None:
                raise FsioError(2, f"{shown(name)} does not exist (resolved inside {root})")
            if not stat.S_ISDIR(st.st_mode):
                raise FsioError(20, f"{shown(name)} is not a directory (inside {root})")
            stack.append(os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=stack[-1]))
            names.append(name)
            if seen is not None:
                seen.append((shown(), os.fstat(stack[-1])))
        yield stack[-1], ".", shown()
    finally:
        for fd in stack:
            os.close(fd)


def read_under_root(root: Path | str, path: str, limit: int = 16 << 20) -> bytes:
    """Return the bytes (at most ``limit``) of the regular file ``path`` resolved inside
    ``root`` (:func:`under_root`, links followed inside it); FsioError for anything else."""
    with under_root(root, path, follow_last=True) as (dir_fd, name, shown):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dir_fd)  # fmt: skip
        except FileNotFoundError:
            raise FsioError(2, f"{shown} does not exist (resolved inside {root})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FsioError(f"{shown} is {kind_of(st.st_mode)}, not a regular file")
        return os.read(fd, limit)
    finally:
        os.close(fd)
