"""Subordinate ids for the lab's unprivileged containers.

When the ``uidmap`` package is installed (Debian's ``lxc`` recommends it), LXC maps an
unprivileged CT's ids through the setuid ``newuidmap``/``newgidmap``, which refuse any range
that ``/etc/subuid`` / ``/etc/subgid`` do not grant to the caller ("uid range [0-65536) ->
[100000-165536) not allowed"). Without ``uidmap``, LXC as root writes ``uid_map`` itself and
needs nothing. The lab grants root the range it needs only when ``newuidmap`` would check, and
takes back exactly the lines it added when the lab is torn down.
"""

from __future__ import annotations

import shutil
from pathlib import Path

SUBID_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))


def range_granted(text: str, user: str, base: int, count: int) -> bool:
    """Return True when a ``user:start:count`` line of a subid file's ``text`` covers
    ``[base, base + count)`` (as ``newuidmap`` reads it; ``grep ^root: /etc/subuid``)."""
    for line in text.splitlines():
        fields = line.strip().split(":")
        if len(fields) != 3 or fields[0] != user:
            continue
        try:
            start, size = int(fields[1]), int(fields[2])
        except ValueError:
            continue
        if start <= base and base + count <= start + size:
            return True
    return False


class SubordinateIds:
    """Grant ``root:BASE:COUNT`` in /etc/subuid and /etc/subgid while the lab runs (only
    where ``newuidmap`` exists), and remove the lines it added on :meth:`release`."""

    def __init__(self, base: int, count: int, files: tuple[Path, ...] = SUBID_FILES) -> None:
        self.line = f"root:{base}:{count}"
        self.base, self.count, self.files = base, count, files
        self.added: list[Path] = []

    def needed(self) -> bool:
        """Return True when LXC will map ids through ``newuidmap`` (``command -v newuidmap``)."""
        return shutil.which("newuidmap") is not None

    def grant(self) -> list[Path]:
        """Append the lab's line to each subid file that does not already cover the range;
        return the files changed (none when ``newuidmap`` is absent)."""
        if not self.needed():
            return []
        for path in self.files:
            text = path.read_text() if path.exists() else ""
            if range_granted(text, "root", self.base, self.count):
                continue
            separator = "" if not text or text.endswith("\n") else "\n"
            with path.open("a") as handle:
                handle.write(f"{separator}{self.line}\n")
            self.added.append(path)
        return list(self.added)

    def release(self) -> None:
        """Remove the one line :meth:`grant` added to each file (other lines untouched)."""
        for path in self.added:
            lines = path.read_text().splitlines(keepends=True)
            for index in range(len(lines) - 1, -1, -1):
                if lines[index].strip() == self.line:
                    del lines[index]
                    break
            path.write_text("".join(lines))
        self.added.clear()
