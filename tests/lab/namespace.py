"""The lab's pure cgroup v2 world: one mount namespace per test session.

This machine mounts cgroups in hybrid mode; Proxmox runs pure cgroup v2, where LXC
enforces ``lxc.cgroup2.devices.*`` with an eBPF device program. One long-lived holder
process keeps a mount namespace whose ``/sys/fs/cgroup`` is a cgroup2 mount; every
``lxc-*`` command and the lab sshd run inside it through ``nsenter --mount``. Mounts
made on the host later still propagate into it (slave propagation), never back out.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from gpudoctor.hosts.agent.client import ProcessStream
from gpudoctor.hosts.base import CommandResult
from gpudoctor.hosts.local import LocalHost, run_local

# $1: the lab's lxcpath, bind-mounted over /var/lib/lxc (LXC's default lxcpath) inside
# the namespace only, so plain ``lxc-attach -n NAME`` (as the fixer runs it over SSH)
# finds lab containers, and real containers of this machine stay out of reach.
_HOLDER_SCRIPT = """set -e
mount --make-rslave /
umount -R /sys/fs/cgroup
mount -t cgroup2 none /sys/fs/cgroup
if [ -n "$1" ]; then mkdir -p /var/lib/lxc; mount --bind "$1" /var/lib/lxc; fi
echo ready
exec sleep infinity
"""


class LabError(RuntimeError):
    """The lab could not do what was asked (the message says what and why)."""


class PureCgroup2Namespace:
    """A long-lived mount namespace whose ``/sys/fs/cgroup`` is a pure cgroup2 mount.

    ``prefix`` is the argv prefix that runs a command inside it
    (``nsenter --mount=/proc/PID/ns/mnt --``).
    """

    def __init__(self, lxcpath: Path | None = None) -> None:
        self.lxcpath = lxcpath
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> PureCgroup2Namespace:
        """Start the holder process; return self once the cgroup2 mount is in place."""
        script_args = ["sh", "-c", _HOLDER_SCRIPT, "sh", str(self.lxcpath or "")]
        self.proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "slave", *script_args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            self.stop()
            raise LabError(f"cannot make a pure cgroup2 mount namespace: {err.strip()}")
        fstype = self.run(["stat", "-f", "-c", "%T", "/sys/fs/cgroup"], timeout).stdout.strip()
        if fstype != "cgroup2fs":
            self.stop()
            raise LabError(f"/sys/fs/cgroup in the lab namespace is {fstype}, not cgroup2fs")
        return self

    @property
    def pid(self) -> int:
        """Return the holder's PID (its /proc/PID/ns/mnt is the namespace)."""
        if self.proc is None or self.proc.poll() is not None:
            raise LabError("the pure-cgroup2 namespace holder is not running")
        return self.proc.pid

    @property
    def prefix(self) -> list[str]:
        """Return the argv prefix that runs a command inside the namespace."""
        return ["nsenter", f"--mount=/proc/{self.pid}/ns/mnt", "--"]

    def run(
        self, argv: Sequence[str], timeout: float = 60.0, input: str | None = None
    ) -> CommandResult:
        """Run ``argv`` inside the namespace (like ``nsenter --mount=... argv``)."""
        return run_local([*self.prefix, *argv], timeout, input)

    def bind_mount(self, source: str | Path, target: str | Path, read_only: bool = False) -> None:
        """Bind-mount ``source`` on ``target`` inside the namespace only (``mount --bind``;
        the target is created, as a dir or an empty file like the source). Use it to put
        stand-ins where a Proxmox host has real things (``/etc/pve``, a ``pct`` on PATH)."""
        kind = "-d" if Path(source).is_dir() else "-f"
        script = (
            f'if [ {kind} "$1" ]; then if [ {kind} = -d ]; then mkdir -p "$2"; '
            'else mkdir -p "$(dirname "$2")"; [ -e "$2" ] || : > "$2"; fi; fi; '
            'mount --bind "$1" "$2"' + (' && mount -o remount,bind,ro "$2"' if read_only else "")
        )
        result = self.run(["sh", "-c", script, "sh", str(source), str(target)], 30)
        if not result.ok:
            raise LabError(f"bind mount {source} -> {target} failed: {result.stderr.strip()}")

    def stop(self) -> None:
        """Kill the holder (the namespace goes away with its last user)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr) if self.proc else ():
            if pipe:
                pipe.close()


class LabHost(LocalHost):
    """This machine seen as a pure-cgroup2 container host (a Proxmox-like host).

    File operations are local (the files are the same); commands and command streams run
    inside the lab namespace, so ``lxc-attach`` and ``lxc-start`` see pure cgroup v2.
    """

    run_opens_session = True  # each run() enters the namespace afresh, as SSH opens a session

    def __init__(self, namespace: PureCgroup2Namespace, name: str = "lab") -> None:
        super().__init__(name=name, python="python3")
        self.namespace = namespace

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        """Run ``argv`` inside the lab namespace; the result names ``argv`` as given."""
        result = self.namespace.run(argv, timeout, input)
        return CommandResult(
            tuple(argv),
            result.returncode,
            result.stdout,
            result.stderr,
            result.timed_out,
            result.duration_s,
        )

    def open_stream(self, argv: Sequence[str]) -> ProcessStream:
        """Start ``argv`` inside the lab namespace and return its pipes."""
        return ProcessStream([*self.namespace.prefix, *argv])


def cgroup2_root() -> Path | None:
    """Return where this machine mounts the cgroup2 hierarchy (``/sys/fs/cgroup/unified``
    on a hybrid host, ``/sys/fs/cgroup`` on a pure one), or None."""
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1])
    return None


def kill_container_cgroups(name: str, timeout: float = 10.0) -> bool:
    """SIGKILL every process of LXC container ``name`` (its ``lxc.payload.NAME`` and
    ``lxc.monitor.NAME`` cgroups, through cgroup2's ``cgroup.kill``) and remove those
    cgroups, whatever lxcpath it was started with. Return True when nothing is left."""
    root = cgroup2_root()
    if root is None:
        return True
    groups = [root / f"lxc.payload.{name}", root / f"lxc.monitor.{name}"]
    groups = [group for group in groups if group.is_dir()]
    for group in groups:
        with contextlib.suppress(OSError):
            (group / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + timeout
    for group in groups:
        # Remove the tree bottom-up once its processes are gone (rmdir fails while busy).
        while group.exists() and time.monotonic() < deadline:
            for sub in sorted(group.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if sub.is_dir():
                    with contextlib.suppress(OSError):
                        sub.rmdir()
            with contextlib.suppress(OSError):
                group.rmdir()
            if group.exists():
                time.sleep(0.05)
    return not any(group.exists() for group in groups)
