"""RecordedHost: a Host that answers from captured facts instead of a live machine.

It stands for a real GPU host or container whose files (/proc/devices,
/proc/driver/nvidia/version, ...), device nodes (from `ls -l /dev/nvidia*` captures),
open() outcomes (errno per node, as the cgroup device policy decides) and GPU probe
output were recorded. Checks cannot tell it from LocalHost/SSHHost: it subclasses the
real Host interface. Used for the GPU paths that cannot run on the CPU-only CI machine.
"""

from __future__ import annotations

import errno as errno_mod
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpudoctor.hosts.base import CommandResult, DiskUsage, FileStat, Host, OpenResult

LS_LINE = re.compile(
    r"^(?P<type>[cbd-])(?P<perm>[rwxsStT-]{9})\S*\s+\d+\s+\S+\s+\S+\s+"
    r"(?:(?P<major>\d+),\s*(?P<minor>\d+)|(?P<size>\d+))\s+\w+\s+\d+\s+[\d:]+\s+(?P<name>\S+)$"
)


def stats_from_ls(text: str) -> dict[str, FileStat]:
    """Parse an ``ls -l /dev/nvidia*`` capture (with ``DIR:`` sections) into FileStats."""
    stats: dict[str, FileStat] = {}
    directory = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.endswith(":") and line.startswith("/"):
            directory = line[:-1]
            stats[directory] = FileStat(directory, "dir", 0o755)
            continue
        match = LS_LINE.match(line)
        if not match or match["name"] in (".", ".."):
            continue
        name = match["name"]
        path = name if name.startswith("/") else f"{directory}/{name}"
        kind = {"c": "char", "b": "block", "d": "dir", "-": "file"}[match["type"]]
        mode = perm_bits(match["perm"])
        stats[path] = FileStat(
            path,
            kind,
            mode,
            int(match["major"] or 0),
            int(match["minor"] or 0),
            size=int(match["size"] or 0),
        )
    return stats


def perm_bits(perm: str) -> int:
    """Return the permission bits of an ``rw-rw-rw-`` string."""
    bits = 0
    for i, ch in enumerate(perm):
        if ch not in "-ST":
            bits |= 1 << (8 - i)
    return bits


@dataclass
class RecordedHost(Host):
    """A Host answering from recorded facts.

    Attributes:
        files: path -> text.
        nodes: path -> FileStat (device nodes, directories).
        open_errno: path -> errno that open() returns (default 0 = success).
        probe_lines: the GPU probe's JSON-lines stdout, as dicts.
        probe_hangs: True to make the probe time out (a hung driver).
        disk: path -> DiskUsage.
        commands: ``" ".join(argv)`` -> (returncode, stdout) of a recorded command run
            (``dkms status``, ``journalctl -k -b ...``); others exit 127 as missing.
    """

    files: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, FileStat] = field(default_factory=dict)
    open_errno: dict[str, int] = field(default_factory=dict)
    probe_lines: list[dict[str, object]] = field(default_factory=list)
    probe_hangs: bool = False
    disk: dict[str, DiskUsage] = field(default_factory=dict)
    commands: dict[str, tuple[int, str]] = field(default_factory=dict)
    name: str = "recorded"
    python: str = "python3"

    def read_text(self, path: str, limit: int = 1 << 20) -> str:
        if path in self.files:
            return self.files[path][:limit]
        raise FileNotFoundError(errno_mod.ENOENT, "No such file or directory", path)

    def read_bytes(self, path: str, length: int, offset: int = 0) -> bytes:
        return self.read_text(path).encode()[offset : offset + length]

    def stat(self, path: str) -> FileStat:
        if path in self.nodes:
            return self.nodes[path]
        if path in self.files:
            return FileStat(path, "file", 0o644, size=len(self.files[path].encode()))
        raise FileNotFoundError(errno_mod.ENOENT, "No such file or directory", path)

    def try_open(self, path: str, write: bool = True) -> OpenResult:
        if path not in self.nodes and path not in self.files:
            return OpenResult(path, "O_RDWR" if write else "O_RDONLY", errno_mod.ENOENT)
        return OpenResult(path, "O_RDWR" if write else "O_RDONLY", self.open_errno.get(path, 0))

    def list_dir(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        names = {
            p[len(prefix) :].split("/")[0]
            for p in [*self.nodes, *self.files]
            if p.startswith(prefix)
        }
        if not names and path not in self.nodes:
            raise FileNotFoundError(errno_mod.ENOENT, "No such file or directory", path)
        return sorted(names)

    def disk_usage(self, path: str) -> DiskUsage:
        if path in self.disk:
            return self.disk[path]
        raise FileNotFoundError(errno_mod.ENOENT, "No such file or directory", path)

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        if "-c" in argv and "gpu_probe" not in " ".join(argv[:2]):
            stdout = "".join(json.dumps(line) + "\n" for line in self.probe_lines)
            if self.probe_hangs:
                return CommandResult(tuple(argv), -9, stdout, "", True, timeout)
            return CommandResult(tuple(argv), 0, stdout, "", False, 0.2)
        if " ".join(argv) in self.commands:
            code, out = self.commands[" ".join(argv)]
            return CommandResult(tuple(argv), code, out, "" if code == 0 else out, False, 0.0)
        return CommandResult(tuple(argv), 127, "", f"{argv[0]}: not recorded", False, 0.0)
