"""``gpudoctor fix --host-prep``: make /dev/nvidia-uvm exist at boot before CTs autostart.

nvidia-uvm's node is created on first CUDA use on the host; after a reboot, containers
that autostart before that see no /dev/nvidia-uvm (and bind mounts with ``optional``
silently skip it). A systemd oneshot running ``nvidia-modprobe -u -c=0`` ordered
``Before=pve-guests.service`` creates it first. Same rules as a CT fix: a plan and a diff,
a backup of any previous unit, a locked compare-and-swap write, and a second run that
changes nothing.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpudoctor.hosts.base import Host
from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve import follow_units
from gpudoctor.pve.apply import (
    ApplyError,
    Layout,
    Target,
    _why,
    backup_name,
    compare_and_swap,
    read_bytes,
)
from gpudoctor.pve.planner import FixPlan, unified_diff

UNIT_NAME = "gpudoctor-nvidia-uvm.service"
WANTED_BY = "multi-user.target"


def unit_text(nvidia_modprobe: str) -> str:
    """Return the systemd unit that creates the nvidia-uvm (and nvidia-caps) nodes at boot."""
    return (
        "[Unit]\n"
        "Description=Create /dev/nvidia-uvm before containers start (gpudoctor)\n"
        "After=systemd-modules-load.service\n"
        "Before=pve-guests.service lxc.service\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"ExecStart={nvidia_modprobe} -u -c=0\n"
        "RemainAfterExit=yes\n"
        "\n"
        "[Install]\n"
        f"WantedBy={WANTED_BY}\n"
    )


@dataclass(frozen=True)
class HostPrepOutcome:
    """What ``--host-prep`` did: ``nothing_to_change``, ``dry_run``, ``declined``, ``applied``
    (exit code 4 for ``dry_run``/``declined`` with changes pending, else 0).

    Attributes:
        backup: the backup of the boot unit's previous text ("" when none).
        backups: every file's backup made ("" entries left out).
    """

    status: str
    exit_code: int
    message: str
    plan: FixPlan
    unit_path: str
    backup: str = ""
    backups: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the outcome as JSON-ready data."""
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "message": self.message,
            "unit": self.unit_path,
            "changed": self.plan.changed,
            "diff": self.plan.diff,
            "explanation": list(self.plan.explanation),
            "warnings": list(self.plan.warnings),
            "backup": self.backup,
            "backups": list(self.backups),
        }


@dataclass(frozen=True)
class UnitFile:
    """One file ``--host-prep`` manages: its path, text now (``old``, "" when absent), the
    SHA-1 of that (``absent``) and the text it should have (``new``)."""

    path: str
    old: str
    sha: str
    new: str


@dataclass(frozen=True)
class HostPrep:
    """The plan of ``--host-prep``: the files, the units to enable and (on the real root)
    to start now; ``plan`` shows them all (one diff, one reason per step)."""

    plan: FixPlan
    files: tuple[UnitFile, ...]
    enable: tuple[str, ...]
    start: tuple[str, ...]


BOOT_NODES = ("/dev/nvidia-uvm", "/dev/nvidia-caps")


def needs_boot_nodes(dev_paths: tuple[str, ...]) -> bool:
    """Return True when a devN entry names a node that exists only once the driver's
    first user created it (nvidia-uvm, nvidia-caps): such a CT fails to start before."""
    return any(p == n or p.startswith(n + "/") or p.startswith(n + "-") for p in dev_paths
               for n in BOOT_NODES)  # fmt: skip


def systemd_root(env: dict[str, str] | None = None) -> str:
    """Return the root of the systemd tree to manage (``/``; env ``GPUDOCTOR_SYSTEMD_ROOT``
    lets tests use ``systemctl --root=DIR`` on a scratch tree)."""
    return (env if env is not None else os.environ).get("GPUDOCTOR_SYSTEMD_ROOT", "/")


def _unit_path(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/etc/systemd/system/{name}"


def _wants(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/etc/systemd/system/{WANTED_BY}.wants/{name}"


def _read(host: Host, path: str, layout: Layout) -> tuple[str, str]:
    """Return (text, SHA-1) of a managed file, ("", ``absent``) when it does not exist."""
    try:
        data, sha = read_bytes(host, path, layout)
    except ApplyError as exc:
        if exc.code != "missing":
            raise
        return "", "absent"
    return data.decode("utf-8", "replace"), sha


# Run with the interpreter the unit would run: where its code comes from (the gpudoctor
# package, every existing sys.path entry: the standard library, site-packages and what their
# .pth files add). Every file there runs, or may be imported, as root at every trigger.
_CODE_DIRS = (
    "import os, sys\n"
    "try:\n import gpudoctor; print(os.path.dirname(os.path.abspath(gpudoctor.__file__)))\n"
    "except Exception:\n pass\n"
    "for p in sys.path:\n"
    " if p and os.path.exists(p): print(os.path.abspath(p))\n"
)


def code_dirs(host: Host, python: list[str]) -> tuple[str, ...]:
    """Return the directories ``python`` (an argv prefix) imports gpudoctor's code from on
    ``host``: the package's, then each existing ``sys.path`` entry (``python -c ...``);
    () when it does not answer."""
    found = host.run([*python, "-c", _CODE_DIRS], timeout=30)
    lines = found.stdout.splitlines() if found.ok else []
    return tuple(dict.fromkeys(line for line in lines if line.startswith("/")))


def _shebang(host: Host, script: str) -> str:
    """Return the interpreter on ``script``'s ``#!`` line ("" when none is readable;
    ``#!/usr/bin/env python3`` is python3 as ``command -v`` finds it)."""
    try:
        head = host.read_bytes(script, 256)
    except OSError:
        return ""
    line = head.split(b"\n", 1)[0][2:] if head[:2] == b"#!" else b""
    words = line.decode("utf-8", "replace").split()
    if not words or not words[0].startswith("/"):
        return ""
    if not words[0].endswith("/env"):
        return words[0]
    if len(words) < 2:
        return ""
    found = host.run(["sh", "-c", f"command -v {shlex.quote(words[1])}"], timeout=15)
    return found.stdout.strip() if found.ok and found.stdout.strip().startswith("/") else ""


def gpudoctor_command(host: Host) -> tuple[str, tuple[str, ...]]:
    """Return how the node runs gpudoctor and the files that command runs: this very
    interpreter, isolated (``python -I -m gpudoctor``: no working directory, PYTHONPATH or
    user site on its path), the package it imports and every directory on its path, when
    the host is this machine; else ``command -v gpudoctor`` there, the interpreter of its
    ``#!`` line and that interpreter's package and path. ("", ()) when not found."""
    if isinstance(host, LocalHost):
        import gpudoctor

        package = os.path.dirname(os.path.abspath(gpudoctor.__file__))
        argv = [sys.executable, "-I", "-m", "gpudoctor"]
        dirs = code_dirs(host, [sys.executable, "-I"])
        return follow_units.command_line(argv), tuple(
            dict.fromkeys((sys.executable, package, *dirs))
        )
    found = host.run(["sh", "-c", "command -v gpudoctor"], timeout=15)
    path = found.stdout.strip() if found.ok else ""
    if not path.startswith("/"):
        return "", ()
    python = _shebang(host, path)
    return path, (path, python, *code_dirs(host, [python])) if python else (path,)


def untrusted(host: Host, paths: tuple[str, ...]) -> str:
    """Return why root should not run ``paths`` at every trigger ("" when it may): each
    path, what a link in it leads to, and every directory above either must belong to
    root and be writable by no one else (a sticky directory such as /tmp above is fine);
    and so must everything under a path that is a directory (a package's files, a
    site-packages' ``.pth`` files). ``readlink -f PATH; stat -c '%u %a %n' ...; find
    PATH... ( ! -uid 0 -o ! -type l -perm /022 ) -quit`` on the host."""
    names: list[str] = []
    for path in paths:
        real = host.run(["readlink", "-f", path], timeout=15)
        for one in dict.fromkeys([path, real.stdout.strip() if real.ok else path]):
            parts = one.rstrip("/").split("/")
            names += ["/".join(parts[:i]) or "/" for i in range(1, len(parts) + 1)]
    names = list(dict.fromkeys(names))
    listed = host.run(["stat", "-L", "-c", "%u %a %n", *names], timeout=15)
    if not listed.ok:
        return f"cannot stat {', '.join(paths)}: {_why(listed)}"
    for line in listed.stdout.splitlines():
        uid, mode, name = line.split(" ", 2)
        bits = int(mode, 8)
        sticky_dir_above = bits & 0o1000 and name not in paths
        if uid != "0" or (bits & 0o022 and not sticky_dir_above):
            return f"{name} (uid {uid}, mode {bits & 0o7777:04o}) can be changed by a user other than root"
    inside = host.run(["find", "-H", *paths, "(", "!", "-uid", "0", "-o", "(", "!", "-type", "l",
                       "-perm", "/022", ")", ")", "-printf", "%U %m %p\\n", "-quit"], timeout=60)  # fmt: skip
    if inside.stdout.strip():
        uid, mode, name = inside.stdout.splitlines()[0].split(" ", 2)
        return (
            f"{name} (uid {uid}, mode {int(mode, 8):04o}) can be changed by a user other than root"
        )
    if not inside.ok:
        return f"cannot look at every file under {', '.join(paths)}: {_why(inside)}"
    return ""


def plan_host_prep(host: Host, root: str, layout: Layout, watch: tuple[str, ...] = (),
                   follow_args: tuple[str, ...] = ()) -> HostPrep:  # fmt: skip
    """Return the plan, read-only: ``command -v nvidia-modprobe``, ``cat`` of each managed
    file, ``test -L`` of the enable links, ``systemctl is-active`` of the path unit (real
    root only). ``watch``: more paths for the path unit to watch (``--device``);
    ``follow_args``: what the follow-driver unit passes on (``--flavor lxc``)."""
    found = host.run(["sh", "-c", "command -v nvidia-modprobe"], timeout=15)
    modprobe = found.stdout.strip() if found.ok and found.stdout.strip() else ""
    warnings = []
    boot_modprobe = modprobe or "/usr/bin/nvidia-modprobe"
    if not modprobe:
        warnings.append(
            "nvidia-modprobe is not installed on the host (apt install nvidia-modprobe)"
        )
    boot_why = (
        f"runs `{boot_modprobe} -u -c=0` before pve-guests.service, so /dev/nvidia-uvm "
        "exists when containers autostart"
    )
    wanted = [(_unit_path(root, UNIT_NAME), unit_text(boot_modprobe), boot_why)]
    enable = [UNIT_NAME]
    gpudoctor, runs = gpudoctor_command(host)
    why_not = untrusted(host, runs) if gpudoctor else ""
    if why_not:
        warnings.append(
            f"not installing the unit that follows a driver reload: it would run gpudoctor as "
            f"root at every trigger, and {why_not} (install gpudoctor as root, e.g. pipx)"
        )
    if gpudoctor and not why_not:
        old_path, _ = _read(host, _unit_path(root, follow_units.PATH_UNIT), layout)
        watched = follow_units.watched_paths(old_path, watch)
        wanted += [
            (_unit_path(root, follow_units.SERVICE),
             follow_units.service_text(gpudoctor, modprobe, follow_args),
             "after a driver reload, runs `gpudoctor fix --follow-driver --yes`: every CT of "
             "this node against the host's devices now, restarting only those whose devices "
             "changed"),
            (_unit_path(root, follow_units.PATH_UNIT), follow_units.path_text(watched),
             f"starts {follow_units.SERVICE} when {', '.join(watched)} change"),
            (f"{root.rstrip('/')}/{follow_units.UDEV_RULE}", follow_units.udev_text(),
             f"starts {follow_units.SERVICE} when an NVIDIA module is loaded (udev add event)"),
        ]  # fmt: skip
        enable.append(follow_units.PATH_UNIT)
    elif not gpudoctor:
        warnings.append(
            "gpudoctor is not installed on the host (command -v gpudoctor): the unit that "
            "follows a driver reload needs it there; only the boot unit is planned"
        )
    files, explanation = [], []
    for path, new, why in wanted:
        old, sha = _read(host, path, layout)
        files.append(UnitFile(path, old, sha, new))
        if new != old:
            explanation.append(f"write {path}: {why}")
    to_enable = tuple(u for u in enable if not _is_link(host, _wants(root, u)))
    explanation += [f"enable {u} (systemctl enable)" for u in to_enable]
    to_start: tuple[str, ...] = ()
    if not root.rstrip("/") and follow_units.PATH_UNIT in enable:
        state = host.run(["systemctl", "is-active", follow_units.PATH_UNIT], timeout=15)
        if state.stdout.strip() != "active":
            to_start = (follow_units.PATH_UNIT,)
            explanation.append(f"start {follow_units.PATH_UNIT} (systemctl start)")
    old_text = "".join(f.old for f in files)
    new_text = "".join(f.new for f in files)
    plan = FixPlan(
        old_text=old_text,
        new_text=new_text,
        diff="".join(unified_diff(f.old, f.new, f.path) for f in files),
        explanation=tuple(explanation),
        warnings=tuple(warnings),
    )
    return HostPrep(plan, tuple(files), to_enable, to_start)


def run_host_prep(
    host: Host,
    dry_run: bool = False,
    yes: bool = False,
    confirm: Callable[[FixPlan], bool] = lambda plan: False,
    progress: Callable[[str], None] = lambda text: None,
    layout: Layout | None = None,
    root: str | None = None,
    watch: tuple[str, ...] = (),
    follow_args: tuple[str, ...] = (),
) -> HostPrepOutcome:
    """Plan and (unless dry run / declined) install the boot unit and the follow-driver
    triggers (their ``fix --follow-driver`` given ``follow_args``), enable and start them;
    return the outcome."""
    layout = layout or Layout.from_env()
    root = root if root is not None else systemd_root()
    prep = plan_host_prep(host, root, layout, watch, follow_args)
    plan, unit_path = prep.plan, _unit_path(root, UNIT_NAME)
    if not plan.explanation:
        return HostPrepOutcome("nothing_to_change", 0, "nothing to change", plan, unit_path)
    if dry_run:
        return HostPrepOutcome("dry_run", 4, "dry run: nothing written", plan, unit_path)
    if not yes and not confirm(plan):
        return HostPrepOutcome("declined", 4, "not applied: nothing written", plan, unit_path)
    backups: list[str] = []
    boot_backup = ""
    for unit in prep.files:
        if unit.new == unit.old:
            continue
        progress(f"writing {unit.path}")
        parent = unit.path.rsplit("/", 1)[0]
        made = host.run(["mkdir", "-p", "-m", "0755", parent], timeout=15)  # udev's rules.d
        if not made.ok:
            raise ApplyError("io", f"mkdir -p {parent} failed: {_why(made)}")
        target = Target("host", "host-prep", unit.path, f"{layout.own_lock_dir}/host-prep.lock")
        backup = ""
        if unit.sha != "absent":
            backup = f"{layout.backup_dir}/{backup_name(target, unit.sha)}"
        compare_and_swap(host, target, layout, unit.sha, unit.new.encode(), backup)
        backups.append(backup)
        boot_backup = backup if unit.path == unit_path else boot_backup
    names = [u for u in (UNIT_NAME, follow_units.PATH_UNIT) if any(
        f.path == _unit_path(root, u) for f in prep.files)]  # fmt: skip
    progress(f"enabling {', '.join(names)}")
    _enable(host, root, names, prep.start)
    for name in names:
        if not _is_link(host, _wants(root, name)):
            raise ApplyError("io", f"systemctl enable did not create {_wants(root, name)}")
    installed = " and ".join(names)
    return HostPrepOutcome("applied", 0, f"{installed} installed and enabled", plan, unit_path,
                           boot_backup, tuple(b for b in backups if b))  # fmt: skip


def _enable(host: Host, root: str, names: list[str], start: tuple[str, ...]) -> None:
    """``systemctl daemon-reload && systemctl enable UNITS && systemctl start START``
    (``--root=DIR enable`` only, off the real root); ``udevadm control --reload`` is tried
    too (udevd also re-reads changed rules at its next event)."""
    if root.rstrip("/"):
        steps = [["systemctl", f"--root={root}", "enable", *names]]
    else:
        steps = [["systemctl", "daemon-reload"], ["systemctl", "enable", *names]]
        steps += [["systemctl", "start", *start]] if start else []
    for argv in steps:
        result = host.run(argv, timeout=60)
        if not result.ok:
            raise ApplyError("io", f"{' '.join(argv)} failed: {_why(result)}")
    if not root.rstrip("/"):
        host.run(["udevadm", "control", "--reload"], timeout=30)


def _is_link(host: Host, path: str) -> bool:
    """Return True when ``path`` is a symlink (``test -L PATH``): enabled units are links."""
    return host.run(["test", "-L", path], timeout=15).ok
