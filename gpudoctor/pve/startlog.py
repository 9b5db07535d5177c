"""Why a container did not start: the few lines of LXC's debug log that say it. Pure.

``lxc-start -d`` alone only says "The container failed to start ... Additional
information can be obtained by setting the --logfile and --logpriority options". The
restart code starts the CT again with ``lxc-start -l DEBUG -o FILE`` (Proxmox: ``pct
start VMID --debug``, which prints the same log) and :func:`why_lines` keeps what names
the cause: the hooks' own output (LXC logs it as ``Script exec HOOK ... produced output:
mknod: ...: File exists``) and the ERROR lines, without LXC's generic epilogue.
"""

from __future__ import annotations

import re

MAX_LINES = 8
_LINE = re.compile(
    r"(?:\S+ ){0,3}(?P<level>ERROR|WARN|NOTICE|INFO|DEBUG|TRACE)\s+\S+ - (?P<where>\S+) - "
    r"(?P<message>.*)",
    re.ASCII,
)
_HOOK_OUTPUT = re.compile(r"Script exec (?P<hook>\S+) .*? produced output: (?P<output>.*)")
_GENERIC = (
    "Additional information can be obtained",
    "To get more details, run the container in foreground",
    "The container failed to start",
    "Received container state",
    "An error occurred in another process",
    "Failed to spawn container",
    "Failed to send SIGKILL",
)


def why_lines(log: str, limit: int = MAX_LINES) -> tuple[str, ...]:
    """Return at most ``limit`` lines of an LXC log that say why the start failed:
    ``hook HOOK: OUTPUT`` for hook output, ``ERROR file.c:function: MESSAGE`` for errors
    (LXC's closing boilerplate dropped), in log order, each once."""
    out: list[str] = []
    for raw in log.splitlines():
        match = _LINE.search(raw)
        if match is None:
            continue
        message = match.group("message").strip()
        hook = _HOOK_OUTPUT.search(message)
        if hook:
            line = f"hook {hook.group('hook')}: {hook.group('output').strip()}"
        elif match.group("level") == "ERROR" and not any(g in message for g in _GENERIC):
            where = ":".join(match.group("where").rpartition("/")[2].split(":")[:2])
            line = f"ERROR {where}: {message}"
        else:
            continue
        if line not in out:
            out.append(line)
    return tuple(out[:limit])
