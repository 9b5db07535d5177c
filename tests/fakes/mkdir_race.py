"""Nobody wins the race between gpudoctor's check of a path and its ``mkdir`` (issue 46.4).

Stands for another local user running ``mkdir NAME`` in a world-writable directory
(``/dev/shm``, ``/tmp``) at the worst moment: right before gpudoctor's own ``mkdir`` of
NAME, after it judged the levels that existed. The attacker's ``mkdir`` is real (``nobody``
through ``setpriv``); only its timing is forced, by wrapping ``os.mkdir`` in gpudoctor's
process, so the outcome never depends on luck. In a subprocess, set ``GPUDOCTOR_RACE_NAME``
and import this module before running gpudoctor (:data:`PRELUDE`)."""

from __future__ import annotations

import os
import subprocess

NOBODY = 65534
PRELUDE = (
    "import runpy, sys, tests.fakes.mkdir_race as race; race.install(); "
    "sys.argv[0] = 'gpudoctor'; runpy.run_module('gpudoctor', run_name='__main__')"
)


def nobody_mkdir(path: str) -> None:
    """Make the directory ``path`` as uid/gid 65534 (mode 0755: nobody's own)."""
    command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    subprocess.run([*command, "mkdir", "-m", "0755", path], check=True, capture_output=True)


def _absolute(path: str, dir_fd: int | None) -> str:
    if dir_fd is None or os.path.isabs(path):
        return os.path.abspath(path)
    return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)


def install(name: str | None = None) -> list[str]:
    """Wrap ``os.mkdir`` so that nobody makes a directory named ``name`` (default
    ``$GPUDOCTOR_RACE_NAME``) just before gpudoctor's own ``mkdir`` of it; return the
    paths nobody made (in order)."""
    name = name or os.environ["GPUDOCTOR_RACE_NAME"]
    real = os.mkdir
    won: list[str] = []

    def mkdir(path, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        where = _absolute(os.fspath(path), dir_fd)
        if os.path.basename(where) == name and not won:
            nobody_mkdir(where)
            won.append(where)
        return real(path, mode, dir_fd=dir_fd)

    os.mkdir = mkdir  # type: ignore[assignment]
    return won
