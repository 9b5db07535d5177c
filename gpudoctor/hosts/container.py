"""ContainerHost: the inside of an LXC / Proxmox container, reached from its host.

The agent runs INSIDE the container, started on the container's host (a LocalHost or
an SSHHost) by ``pct exec <id> -- env -i PATH=.. LANG=C sh -c LAUNCH`` (flavor ``pve``)
or ``lxc-attach -n <name> [-P lxcpath] --clear-env --set-var PATH=.. --set-var LANG=C --
sh -c LAUNCH`` (flavor ``lxc``); its stdin/stdout carry the protocol. Every command run
in the container gets that clean, minimal environment: nothing of gpudoctor's own
(``HF_TOKEN``, ``PVE_TOKEN_SECRET``, ``PVE_PASSWORD``, ...) is passed in.

``LAUNCH`` says whether the CT has ``python3``, then starts the POSIX-sh agent
(:mod:`gpudoctor.hosts.agent.shell`: busybox ash, dash), the default: one ``sh`` per CT
answers every check, no interpreter is started. ``agent="python"`` (or ``auto``) starts the
python agent (:mod:`gpudoctor.hosts.agent.server`) where ``python3`` exists, else the sh one.
Nothing needs to be installed in the container for the device checks, not even python3;
the CUDA/NVML probe runs ``python3`` through :meth:`ContainerHost.run` where it exists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpudoctor.hosts.agent import server as agent_mod
from gpudoctor.hosts.agent.client import (
    START_TIMEOUT,
    AgentConnection,
    AgentHost,
    ByteStream,
    read_with_deadline,
)
from gpudoctor.hosts.agent.shell import SH_AGENT, ShellConnection
from gpudoctor.hosts.base import CommandResult, Host, HostError

FLAVORS = ("pve", "lxc")
# The whole environment of every process gpudoctor starts in a container.
CT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CT_LANG = "C"
AGENTS = ("auto", "python", "sh")
DEFAULT_AGENT = "sh"

# sh -c LAUNCH gpudoctor-agent PYTHON BOOTSTRAP AGENT: say which agent runs, then run it.
LAUNCH = (
    'p=0; command -v "$1" >/dev/null 2>&1 && p=1\n'
    'if [ "$p" = 1 ] && [ "$3" != sh ]; then echo gpudoctor-launch python; '
    'exec "$1" -I -c "$2"; fi\n'
    'echo "gpudoctor-launch sh $p"\n' + SH_AGENT
)


def enter_command(flavor: str, ct: str, lxcpath: str | None = None, pct: str = "pct") -> list[str]:
    """Return the argv prefix that runs a command inside the container on its host with a
    clean environment (only PATH and LANG): ``lxc-attach -n NAME [-P PATH] --clear-env
    --set-var PATH=.. --set-var LANG=C --`` or ``pct exec ID -- env -i PATH=.. LANG=C``
    (pct exec has no --clear-env; ``pct`` may name another program)."""
    if flavor == "pve":
        return [pct, "exec", str(ct), "--", "env", "-i", f"PATH={CT_PATH}", f"LANG={CT_LANG}"]
    if flavor == "lxc":
        return [
            "lxc-attach",
            "-n",
            str(ct),
            *(["-P", lxcpath] if lxcpath else []),
            "--clear-env",
            "--set-var",
            f"PATH={CT_PATH}",
            "--set-var",
            f"LANG={CT_LANG}",
            "--",
        ]
    raise HostError(f"unknown container flavor {flavor!r} (expected one of {', '.join(FLAVORS)})")


def launch_command(python: str = "python3", agent: str = "auto") -> list[str]:
    """Return the argv run in the CT that starts the python agent (``auto``/``python``,
    when ``python`` is there) or the POSIX-sh agent."""
    return ["/bin/sh", "-c", LAUNCH, "gpudoctor-agent", python, agent_mod.BOOTSTRAP, agent]


def connect_launched(stream: ByteStream, label: str) -> AgentConnection | ShellConnection:
    """Read the launcher's first line and return the connection to the agent it started;
    raise HostError (with the CT side's stderr) when none started."""
    try:
        line = read_with_deadline(stream, label, START_TIMEOUT)
    except HostError as exc:
        raise HostError(f"{exc}{stderr_tail(stream)}") from None
    words = line.decode("utf-8", "replace").split()
    if words[:2] == ["gpudoctor-launch", "python"]:
        return AgentConnection(stream, label)
    if words[:2] == ["gpudoctor-launch", "sh"]:
        return ShellConnection(stream, label, has_python=words[2:3] == ["1"])
    stream.abort()
    raise HostError(f"{label}: the agent did not start{stderr_tail(stream)}")


def stderr_tail(stream: ByteStream) -> str:
    """Return `` (LAST STDERR LINE)`` of the stream's process, or ``""``."""
    detail = stream.stderr_text().strip()
    return f" ({detail.splitlines()[-1][:300]})" if detail else ""


class ContainerHost(AgentHost):
    """A container seen from its host; every Host operation runs inside it.

    Args:
        parent: the container's host (LocalHost, SSHHost, or anything with ``open_stream``).
        ct: the Proxmox VMID (``200``) or the LXC container name.
        flavor: ``pve`` (``pct exec``) or ``lxc`` (``lxc-attach``).
        lxcpath: LXC's container directory for flavor ``lxc`` (``-P``); None = default.
        python: the interpreter inside the container.
        agent: ``sh`` (the default, :data:`DEFAULT_AGENT`: the POSIX-sh agent; commands
            and the GPU probe still use ``python`` through :meth:`run`), or ``python`` /
            ``auto`` (the python agent where ``python`` is there, else the sh agent).
        enter: the argv prefix that enters the CT (default :func:`enter_command`).

    The name is ``<host>/ct<id>`` (``pve1/ct200``) for Proxmox, ``<host>/<name>`` for
    plain LXC. After the container restarts, the next call starts a fresh agent by itself.
    """

    def __init__(
        self,
        parent: Host,
        ct: str | int,
        flavor: str = "pve",
        lxcpath: str | None = None,
        python: str = "python3",
        call_timeout: float = 30.0,
        agent: str | None = None,
        enter: Sequence[str] | None = None,
    ) -> None:
        agent = agent or DEFAULT_AGENT
        if agent not in AGENTS:
            raise HostError(f"unknown agent {agent!r} (expected one of {', '.join(AGENTS)})")
        self.parent = parent
        self.ct = str(ct)
        self.flavor = flavor
        self.lxcpath = lxcpath
        self.enter = list(enter) if enter is not None else enter_command(flavor, self.ct, lxcpath)
        argv = self.enter + launch_command(python, agent)
        super().__init__(
            lambda: parent.open_stream(argv),
            name=f"{parent.name}/ct{self.ct}" if flavor == "pve" else f"{parent.name}/{self.ct}",
            python=python,
            call_timeout=call_timeout,
            connect=connect_launched,
        )

    @property
    def agent_kind(self) -> str:
        """Return ``python`` or ``sh``: the agent serving this CT (starts it if needed)."""
        return str(self._connection().kind)

    @property
    def has_python(self) -> bool:
        """Return True when the CT has the ``python`` interpreter (``command -v python3``)."""
        return bool(self._connection().has_python)

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        """Run ``argv`` in the CT (clean environment): through the python agent, or with a
        fresh ``lxc-attach``/``pct exec`` on the parent when the sh agent serves the CT."""
        if self.agent_kind == "python":
            return super().run(argv, timeout, input)
        result = self.parent.run([*self.enter, *argv], timeout, input)
        return dataclasses.replace(result, argv=tuple(argv))
