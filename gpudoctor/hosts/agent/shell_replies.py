"""Parsing the POSIX-sh agent's answers (:mod:`gpudoctor.hosts.agent.shell`) into the
python agent's result shapes: errno from strerror texts, ``stat -c`` / ``ls -lnLd`` lines,
``stat -f`` / ``df -Pk`` lines, raw file bytes and directory entries."""

from __future__ import annotations

import base64
import errno as errno_mod
import os
import re
from typing import Any

from gpudoctor.hosts.agent.server import file_kind

# strerror texts -> errno: the C library's, plus the shells' own words (dash, busybox).
_ERRNOS = {os.strerror(e).lower(): e for e in errno_mod.errorcode}
_ERRNOS.update(
    {
        "no such file": errno_mod.ENOENT,
        "directory nonexistent": errno_mod.ENOENT,
        "nonexistent directory": errno_mod.ENOENT,
        "not found": errno_mod.ENOENT,
    }
)
_DF_LINE = re.compile(r"(\d+)\s+(\d+)\s+(\d+)\s+\d+%")
_LS_TYPES = {"c": "char", "b": "block", "d": "dir", "-": "file", "l": "link", "p": "fifo",
             "s": "socket"}  # fmt: skip


def errno_of(message: str) -> int:
    """Return the errno whose strerror text is ``message`` (``EIO`` when unknown)."""
    return _ERRNOS.get(message.strip().lower(), errno_mod.EIO)


def check_path(path: str) -> str:
    """Return ``path`` when the shell protocol can carry it (absolute, one line, no
    surrounding blanks); raise OSError(EINVAL) otherwise."""
    if (
        not isinstance(path, str)
        or not path.startswith("/")
        or "\n" in path
        or "\r" in path
        or path != path.strip()
    ):
        raise OSError(errno_mod.EINVAL, "path not supported by the shell agent", path)
    return path


def stat_result(path: str, fields: list[str]) -> dict[str, Any]:
    """Return the FileStat dict for ``s RAWMODE MAJ MIN UID GID SIZE MTIME`` (stat -c, hex
    mode and numbers) or ``l <ls -lnLd line>``; raise ValueError on anything else."""
    if fields[0] == "s" and len(fields) == 8:
        raw, major, minor = int(fields[1], 16), int(fields[2], 16), int(fields[3], 16)
        uid, gid, size, mtime = (int(v) for v in fields[4:8])
        kind = file_kind(raw)
        return {
            "path": path,
            "kind": kind,
            "mode": raw & 0o7777,
            "major": major if kind in ("char", "block") else 0,
            "minor": minor if kind in ("char", "block") else 0,
            "uid": uid,
            "gid": gid,
            "size": size,
            "mtime": float(mtime),
        }
    if fields[0] == "l" and len(fields) >= 6:
        perms = fields[1]
        kind = _LS_TYPES.get(perms[0], "other")
        mode = 0
        for i, char in enumerate(perms[1:10]):
            if char not in "-ST":  # S/T: set-id/sticky WITHOUT the x bit
                mode |= 1 << (8 - i)
        mode |= (0o4000 if perms[3] in "sS" else 0) | (0o2000 if perms[6] in "sS" else 0)
        mode |= 0o1000 if perms[9] in "tT" else 0
        uid, gid = int(fields[3]), int(fields[4])
        major = minor = size = 0
        if kind in ("char", "block"):
            major, minor = int(fields[5].rstrip(",")), int(fields[6])
        else:
            size = int(fields[5])
        return {"path": path, "kind": kind, "mode": mode, "major": major, "minor": minor,
                "uid": uid, "gid": gid, "size": size, "mtime": 0.0}  # fmt: skip
    raise ValueError("unknown stat answer")


def usage_result(fields: list[str]) -> dict[str, int]:
    """Return the DiskUsage dict for ``s FRSIZE BLOCKS BFREE BAVAIL`` or ``d <df -Pk line>``."""
    if fields[0] == "s" and len(fields) == 5:
        frsize, blocks, bfree, bavail = (int(v) for v in fields[1:])
        return {"total": blocks * frsize, "used": (blocks - bfree) * frsize,
                "free": bavail * frsize}  # fmt: skip
    found = _DF_LINE.search(" ".join(fields[1:])) if fields[0] == "d" else None
    if found is None:
        raise ValueError("unknown df answer")
    total, used, free = (int(v) * 1024 for v in found.groups())
    return {"total": total, "used": used, "free": free}


def raw(lines: list[bytes]) -> bytes:
    """Return a file's bytes sent raw: all data lines, less the newline the agent adds
    before its terminator line."""
    data = b"".join(lines)
    if not data.endswith(b"\n"):
        raise ValueError("unterminated data")
    return data[:-1]


def names(lines: list[bytes]) -> list[str]:
    """Return the directory entries of ``|NAME`` lines."""
    out = []
    for line in lines:
        if not line.startswith(b"|"):
            raise ValueError("bad directory entry")
        out.append(line[1:].rstrip(b"\n").decode("utf-8", "surrogateescape"))
    return out


def b64(data: bytes) -> str:
    """Return ``data`` base64-encoded (the python agent's read_bytes result)."""
    return base64.b64encode(data).decode("ascii")
