"""Container hooks that ``mknod`` device nodes with a fixed major (issue 21.2).

Forum guides make GPU nodes inside a CT with an ``lxc.hook.autodev`` script such as
``mknod -m 666 ${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm c 511 0``. The major of nvidia-uvm is
dynamic (handed out at module load), so after a driver update or reboot the hook makes a
STALE node; and a bind mount of the host's node at the same path makes the hook's mknod
fail ("File exists"), so the CT does not start.

LXC runs a hook value with ``/bin/sh -c`` (``run_script_argv`` in LXC's conf.c: the
value, then the container name, section and hook type as arguments), so a value is either
a script path (read on the CT's host) or an inline ``sh -c '...'`` command. This module
finds the hook lines (:data:`HOOK_KEYS`), reads their scripts through the Host
(``cat FILE``), and the ``mknod NAME c MAJOR MINOR`` commands in them whose numbers are
literals. A mknod whose major comes from the host (``$(awk ... /proc/devices)``) is not
reported: it follows a moving major.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from gpudoctor.hosts.base import Host
from gpudoctor.pve.config import Config, Kind

HOOK_KEYS = (
    "lxc.hook.pre-start",
    "lxc.hook.pre-mount",
    "lxc.hook.mount",
    "lxc.hook.autodev",
    "lxc.hook.start-host",
)
SHELLS = {"sh", "bash", "dash", "ash", "busybox"}
SCRIPT_LIMIT = 256 * 1024
_NUMBER = re.compile(r"[0-9]+", re.ASCII)
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "{", "}", "\n"}


@dataclass(frozen=True)
class Mknod:
    """One ``mknod`` with literal numbers in a hook.

    Attributes:
        line_no: the line in the script (1-based; the config line for inline hooks).
        text: that line, stripped.
        path: the node's path inside the CT (``/dev/nvidia-uvm``).
        type: ``c`` (or ``u``) / ``b``.
        major, minor: the numbers the hook writes.
    """

    line_no: int
    text: str
    path: str
    type: str
    major: int
    minor: int


@dataclass(frozen=True)
class Hook:
    """One hook line of the CT config and what its script holds.

    Attributes:
        index: the config line's index.
        key: ``lxc.hook.autodev`` ...
        value: the hook value as written.
        file: the script's path on the host ("" for an inline ``sh -c`` hook).
        mknods: the mknod commands with literal numbers.
        commands: how many other command lines the script holds (what commenting the
            hook out also stops).
        error: why the script could not be read ("" when it was).
    """

    index: int
    key: str
    value: str
    file: str = ""
    mknods: tuple[Mknod, ...] = ()
    commands: int = 0
    error: str = ""

    @property
    def where(self) -> str:
        """Return where the hook's code is: its file, or ``inline (lxc.hook.autodev)``."""
        return self.file or f"inline {self.key}"


def hook_lines(config: Config) -> list[tuple[int, str, str]]:
    """Return ``(index, key, value)`` of every hook line of the live config."""
    return [
        (i, line.key, line.value)
        for i, line in config.main()
        if line.kind is Kind.RAW and line.key in HOOK_KEYS and line.value
    ]


def inline_script(value: str) -> str | None:
    """Return the script of an inline hook (``sh -c 'SCRIPT'``, ``/bin/bash -c ...``),
    or None when the value runs a program file."""
    try:
        argv = shlex.split(value)
    except ValueError:
        return None
    if len(argv) > 1 and _program(argv[0]) == "busybox" and argv[1] in SHELLS:
        argv = argv[1:]  # ``busybox sh -c ...``, ``busybox ash -c ...``: the applet runs it
    if len(argv) >= 3 and _program(argv[0]) in SHELLS and argv[1] == "-c":
        return argv[2]
    return None


def _program(word: str) -> str:
    """The program a command word names (``/bin/sh`` -> ``sh``)."""
    return word.rpartition("/")[2]


def find_mknods(script: str, line_base: int = 1) -> tuple[list[Mknod], int]:
    """Return the mknod commands with literal numbers in ``script`` and the number of
    other command lines (comments and blank lines not counted)."""
    found: list[Mknod] = []
    others = 0
    for offset, raw in enumerate(script.splitlines()):
        text = raw.strip()
        if not text or text.startswith("#"):  # a comment, the #! line
            continue
        hits = _mknods_in(text)
        if hits:
            found.extend(Mknod(line_base + offset, text, *hit) for hit in hits)
        else:
            others += 1
    return found, others


def _mknods_in(text: str) -> list[tuple[str, str, int, int]]:
    """``(ct path, type, major, minor)`` of each literal ``mknod`` in one shell line."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    out = []
    for at, token in enumerate(tokens):
        if _program(token) != "mknod" or (
            at and tokens[at - 1] not in _SEPARATORS and tokens[at - 1] not in ("sudo", "busybox")
        ):
            continue  # fmt: skip
        args = _operands(tokens[at + 1 :])
        if len(args) < 4 or args[1] not in ("c", "u", "b"):
            continue
        name, kind, major, minor = args[:4]
        path = ct_node_path(name)
        if path and _NUMBER.fullmatch(major) and _NUMBER.fullmatch(minor):
            out.append((path, "b" if kind == "b" else "c", int(major), int(minor)))
    return out


def _operands(tokens: list[str]) -> list[str]:
    """The operands of a mknod command (options ``-m MODE``, ``-mMODE``, ``--mode=M``,
    ``-Z`` skipped), up to the next shell separator."""
    out: list[str] = []
    skip = False
    for token in tokens:
        if token in _SEPARATORS:
            break
        if skip:
            skip = False
        elif token in ("-m", "--mode"):
            skip = True
        elif token.startswith("-") and len(token) > 1 and not out:
            continue
        else:
            out.append(token)
    return out


def ct_node_path(name: str) -> str:
    """Return the path inside the CT a hook's mknod NAME makes (``${LXC_ROOTFS_MOUNT}
    /dev/nvidia-uvm`` -> ``/dev/nvidia-uvm``), or "" when it names no /dev path."""
    at = name.rfind("/dev/")  # a rootfs path may hold /dev/ itself: the last one is the CT's
    if at >= 0:
        return name[at:]
    if name.startswith("dev/"):
        return "/" + name
    return ""


def read_hooks(host: Host, config: Config) -> tuple[Hook, ...]:
    """Return every hook of the live config with its mknods, the script files read on
    the CT's host (``cat FILE``, at most 256 KiB; only a regular file: a FIFO, device or
    socket named as the script is an error of that hook, never waited on)."""
    hooks = []
    for index, key, value in hook_lines(config):
        script = inline_script(value)
        if script is not None:
            mknods, others = find_mknods(script, index + 1)
            hooks.append(Hook(index, key, value, "", tuple(mknods), others))
            continue
        try:
            file = shlex.split(value)[0]
        except (ValueError, IndexError):
            file = value.split()[0]
        try:
            kind = host.stat(file).kind  # a FIFO named as the script would hold the read
            if kind != "file":
                raise OSError(22, f"it is a {kind}, not a script file")
            text = host.read_text(file, SCRIPT_LIMIT)
        except (OSError, UnicodeDecodeError) as exc:
            hooks.append(Hook(index, key, value, file, error=f"cannot read {file}: {exc}"))
            continue
        mknods, others = find_mknods(text)
        hooks.append(Hook(index, key, value, file, tuple(mknods), others))
    return tuple(hooks)


def is_gpu_path(path: str, devices: tuple[str, ...] = ()) -> bool:
    """Return True for a node the hook should not make itself: an NVIDIA node
    (``/dev/nvidia*``, ``/dev/nvidia-caps/...``) or one of the ``--device`` paths."""
    return path.startswith("/dev/nvidia") or path in devices
