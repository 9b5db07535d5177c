"""User namespaces: is the target an unprivileged container, and who owns a node there.

In an unprivileged LXC container (``lxc.idmap = u 0 100000 65536``) the CT's root is host
uid 100000; a node bind-mounted from the host keeps its host owner (root:root, or
root:video), which is NOT mapped into the CT, so ``stat`` inside shows the overflow ids
(``nobody:nogroup``, 65534). The CT's root is then "other" for that node: only the mode's
last three bits count, and ``chown`` inside cannot change it.
"""

from __future__ import annotations

from dataclasses import dataclass

UID_MAP = "/proc/self/uid_map"
OVERFLOW_UID = "/proc/sys/kernel/overflowuid"
DEFAULT_OVERFLOW = 65534


@dataclass(frozen=True)
class IdMap:
    """The target's uid map (``cat /proc/self/uid_map``).

    Attributes:
        ranges: ``(inside, outside, count)`` per line.
        overflow_uid: the id unmapped owners show as (``/proc/sys/kernel/overflowuid``).
    """

    ranges: tuple[tuple[int, int, int], ...] = ((0, 0, 4294967295),)
    overflow_uid: int = DEFAULT_OVERFLOW

    @property
    def unprivileged(self) -> bool:
        """Return True when the target's root is not the host's root (a user namespace
        that does not map uid 0 to 0)."""
        return not any(inside == 0 and outside == 0 for inside, outside, _ in self.ranges)

    @property
    def root_outside(self) -> int | None:
        """Return the host uid of the target's root (``100000``), or None if unmapped."""
        return next((out for inside, out, count in self.ranges if inside == 0 and count), None)

    def unmapped_owner(self, uid: int, gid: int) -> bool:
        """Return True when a file's owner or group shows as the overflow id in an
        unprivileged target (its real owner is a host id not mapped in)."""
        return self.unprivileged and self.overflow_uid in (uid, gid)

    def describe(self) -> str:
        """Return ``uid_map 0 100000 65536`` for evidence lines."""
        return "uid_map " + ", ".join(f"{a} {b} {c}" for a, b, c in self.ranges)


def parse_idmap(uid_map: str | None, overflow: str | None) -> IdMap:
    """Return the IdMap of ``/proc/self/uid_map`` and ``overflowuid`` texts (None, or
    unparsable: the initial namespace, overflow 65534)."""
    ranges = []
    for line in (uid_map or "").splitlines():
        fields = line.split()
        if len(fields) == 3 and all(f.isdigit() for f in fields):
            ranges.append((int(fields[0]), int(fields[1]), int(fields[2])))
    text = (overflow or "").strip()
    return IdMap(
        tuple(ranges) or IdMap.ranges,
        int(text) if text.isdigit() else DEFAULT_OVERFLOW,
    )
