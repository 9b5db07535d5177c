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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpudoctor.hosts.base import Host
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
    (exit code 4 for ``dry_run``/``declined`` with changes pending, else 0)."""

    status: str
    exit_code: int
    message: str
    plan: FixPlan
    unit_path: str
    backup: str = ""

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
        }


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


def _paths(root: str) -> tuple[str, str]:
    base = f"{root.rstrip('/')}/etc/systemd/system"
    return f"{base}/{UNIT_NAME}", f"{base}/{WANTED_BY}.wants/{UNIT_NAME}"


def plan_host_prep(host: Host, root: str, layout: Layout) -> tuple[FixPlan, str, str]:
    """Return (plan, unit path, SHA-1 of the current unit or ``absent``), read-only:
    ``command -v nvidia-modprobe``, ``cat`` of the unit, ``test -e`` of its wants link."""
    found = host.run(["sh", "-c", "command -v nvidia-modprobe"], timeout=15)
    modprobe = found.stdout.strip() if found.ok and found.stdout.strip() else ""
    warnings = []
    if not modprobe:
        modprobe = "/usr/bin/nvidia-modprobe"
        warnings.append(
            "nvidia-modprobe is not installed on the host (apt install nvidia-modprobe)"
        )
    unit_path, wants = _paths(root)
    try:
        data, sha = read_bytes(host, unit_path, layout)
        old = data.decode("utf-8", "replace")
    except ApplyError as exc:
        if exc.code != "missing":
            raise
        old, sha = "", "absent"
    new = unit_text(modprobe)
    explanation = []
    if new != old:
        explanation.append(
            f"write {unit_path}: runs `{modprobe} -u -c=0` before pve-guests.service, so "
            "/dev/nvidia-uvm exists when containers autostart"
        )
    enabled = _is_link(host, wants)
    if not enabled:
        explanation.append(f"enable {UNIT_NAME} (systemctl enable)")
    plan = FixPlan(
        old_text=old,
        new_text=new,
        diff=unified_diff(old, new, unit_path),
        explanation=tuple(explanation),
        warnings=tuple(warnings),
    )
    return plan, unit_path, sha


def run_host_prep(
    host: Host,
    dry_run: bool = False,
    yes: bool = False,
    confirm: Callable[[FixPlan], bool] = lambda plan: False,
    progress: Callable[[str], None] = lambda text: None,
    layout: Layout | None = None,
    root: str | None = None,
) -> HostPrepOutcome:
    """Plan and (unless dry run / declined) install and enable the unit; return the outcome."""
    layout = layout or Layout.from_env()
    root = root if root is not None else systemd_root()
    plan, unit_path, sha = plan_host_prep(host, root, layout)
    _, wants = _paths(root)
    todo = bool(plan.explanation)
    if not todo:
        return HostPrepOutcome("nothing_to_change", 0, "nothing to change", plan, unit_path)
    if dry_run:
        return HostPrepOutcome("dry_run", 4, "dry run: nothing written", plan, unit_path)
    if not yes and not confirm(plan):
        return HostPrepOutcome("declined", 4, "not applied: nothing written", plan, unit_path)
    backup = ""
    if plan.changed:
        progress(f"writing {unit_path}")
        target = Target("host", "host-prep", unit_path, f"{layout.own_lock_dir}/host-prep.lock")
        if sha != "absent":
            backup = f"{layout.backup_dir}/{backup_name(target, sha)}"
        compare_and_swap(host, target, layout, sha, plan.new_text.encode(), backup)
    progress(f"enabling {UNIT_NAME}")
    _enable(host, root)
    if not _is_link(host, wants):
        raise ApplyError("io", f"systemctl enable did not create {wants}")
    return HostPrepOutcome(
        "applied", 0, f"{UNIT_NAME} installed and enabled", plan, unit_path, backup
    )


def _enable(host: Host, root: str) -> None:
    """``systemctl daemon-reload && systemctl enable UNIT`` (``--root=DIR`` off the real root)."""
    if root.rstrip("/"):
        steps = [["systemctl", f"--root={root}", "enable", UNIT_NAME]]
    else:
        steps = [["systemctl", "daemon-reload"], ["systemctl", "enable", UNIT_NAME]]
    for argv in steps:
        result = host.run(argv, timeout=60)
        if not result.ok:
            raise ApplyError("io", f"{' '.join(argv)} failed: {_why(result)}")


def _is_link(host: Host, path: str) -> bool:
    """Return True when ``path`` is a symlink (``test -L PATH``): enabled units are links."""
    return host.run(["test", "-L", path], timeout=15).ok
