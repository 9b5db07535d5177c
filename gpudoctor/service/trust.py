"""What the boot unit will run as root, checked at install time (issue 22.5, 26.5).

The campaign unit runs ``bench PLAN`` as root at every boot until the campaign is done,
so everything it runs is root's code: the plan, every directory above it, the programs
the plan names, the interpreter and ``--out``. Each must belong to root (with ``--root``:
also the owner of ROOT, the CT's root) and no one else may write it (a sticky directory
such as /tmp is accepted above a file, as the kernel keeps others from swapping it).
Paths are resolved inside ROOT like ``chroot`` (:func:`gpudoctor.fsio_root.under_root`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from gpudoctor import fsio, fsio_root

WRAPPER_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
"""The PATH the wrapper sets: where a program the plan names without a ``/`` is found."""


@dataclass(frozen=True)
class Resolved:
    """A path resolved inside the root: ``shown`` on this machine, its ``stat`` (None:
    missing), and every directory walked to reach it (``(shown, stat)``)."""

    shown: str
    st: os.stat_result | None
    walked: tuple[tuple[str, os.stat_result], ...]


def owners(root: str) -> frozenset[int]:
    """Return the uids the boot unit may trust: root, and with ``--root`` the owner of
    ROOT itself (an unprivileged CT's root is 100000 on the host)."""
    return frozenset({0, os.stat(root).st_uid})


def resolve(root: str, path: str) -> Resolved:
    """Return ``path`` resolved inside ``root`` (links followed within it). A missing
    part ends the walk: ``st`` is None and ``walked`` holds the directories that exist."""
    seen: list[tuple[str, os.stat_result]] = []
    parts = PurePosixPath("/", path)
    while True:
        seen.clear()
        try:
            with fsio_root.under_root(root, str(parts), follow_last=True, seen=seen) as (
                _,
                _,
                shown,
            ):
                pass
        except fsio.FsioError as exc:
            if exc.errno != 2 or parts == parts.parent:
                raise
            parts = parts.parent  # a directory on the way is missing: judge what exists
            continue
        last = seen[-1] if seen and seen[-1][0] == shown else None
        if str(parts) != str(PurePosixPath("/", path)):
            return Resolved(shown, None, tuple(seen))
        walked = tuple(seen[:-1]) if last else tuple(seen)
        return Resolved(shown, last[1] if last else None, walked)


def find_program(root: str, word: str) -> str:
    """Return the program ``word`` names as the wrapper finds it (its PATH when ``word``
    holds no ``/``; relative to / otherwise, the wrapper's working directory); the first
    PATH entry's candidate when none exists."""
    if "/" in word:
        return str(PurePosixPath("/", word))
    for directory in WRAPPER_PATH:
        candidate = f"{directory}/{word}"
        if resolve(root, candidate).st is not None:
            return candidate
    return f"{WRAPPER_PATH[0]}/{word}"


def judge(root: str, path: str, what: str, trusted: frozenset[int]) -> Resolved:
    """Return ``path`` resolved inside ``root`` once it, and every directory walked to it,
    belongs to ``trusted`` and no one else can write it; raise FsioError naming the path,
    its owner or mode and the fix."""
    found = resolve(root, path)
    fix = "the boot unit runs it as root at every boot: chown root and chmod go-w it"
    for shown, st in found.walked:
        fsio.judge_owner(shown, st, f"above {what}", fix, trusted=trusted, allow_sticky=True)
    if found.st is not None:
        fsio.judge_owner(found.shown, found.st, what, fix, trusted=trusted)
    return found


def is_executable(found: Resolved) -> bool:
    """Return True when ``found`` is a regular file with an execute bit."""
    return (
        found.st is not None and stat.S_ISREG(found.st.st_mode) and bool(found.st.st_mode & 0o111)
    )


def check_programs(root: str, words: Iterable[str], trusted: frozenset[int]) -> None:
    """Judge each program the plan names (``engine.command[0]``, ``engine.python``) as
    the wrapper would find it inside ``root``; raise FsioError for one others can change."""
    for word in words:
        judge(root, find_program(root, word), f"a program the plan runs ({word})", trusted)
