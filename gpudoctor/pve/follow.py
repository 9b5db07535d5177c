"""``gpudoctor fix --follow-driver``: after a driver reload, bring every CT of a node in line
with the host's devices NOW, restarting only the CTs whose devices changed.

When the NVIDIA modules are reloaded or upgraded on a running node, nvidia-uvm's (and
nvidia-caps') dynamic major may move and its nodes are re-created. A CT whose config
allows the old major gets EPERM, and a running CT keeps the node it was started with (its
bind mount holds the old inode; a devN node was made with the old numbers). This module
is what the node's own unit (``gpudoctor-follow-driver.service``, installed by
``--host-prep``, triggered by the module's udev ``add`` event and by a systemd path unit
on the nodes) runs:

* every CT of the node is planned by the per-CT fixer (:func:`gpudoctor.pve.fixer.run_fix`)
  in its "follow" form (:data:`FOLLOW_PLAN`): only the device nodes the CT's config
  ALREADY passes (bind mounts, devN entries; never a node it did not have), in rules mode
  (a missing allow rule for a major that moved; no migration to devN entries), and the
  running CT's state compared with the host's nodes now (:mod:`ctstate`: a stale node,
  a missing one, EPERM on a node the config allows);
* a CT that passes no device node is never touched; a CT whose plan is empty is not
  restarted; the others get the fixer's whole safe path (plan, client and host backup,
  the config's own lock and compare-and-swap, restart, re-check inside, rollback);
* the whole run holds one lock (:func:`follow_lock`): a second trigger waits and then
  finds nothing left to do; and it passes again (at most :data:`MAX_PASSES` times) while
  the host's devices changed during the pass (an event that came while it ran).

Nothing is written and nothing restarted when nothing changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from gpudoctor import fsio
from gpudoctor.exit_codes import ExitCode
from gpudoctor.hosts.base import Host, HostError
from gpudoctor.pve.apply import ApplyError, Layout, read_config, resolve_target
from gpudoctor.pve.config import LXC, ConfigError
from gpudoctor.pve.entries import paths_of_interest
from gpudoctor.pve.facts import look_at
from gpudoctor.pve.fixer import FixOptions, run_fix
from gpudoctor.pve.planner import RULES, FixPlanError, PlanOptions

FOLLOW_PLAN = PlanOptions(mode=RULES, include_host_nvidia=False)
"""The planner's options for following the host: the nodes the config passes, as rules."""

MAX_PASSES = 3
LOCK_WAIT_S = 900.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class FollowedCt:
    """What following the host did to one CT.

    Attributes:
        ct: the VMID or container name.
        status: ``no_devices`` (passes no device node, or has no config: not looked at
            further),
            ``unchanged`` (its devices are the host's: not touched), ``pending`` (dry run:
            what would be done), ``refused`` (a locked CT), ``error``, or the fixer's
            status when it ran (``applied``, ``applied_not_running``, ``not_fixed``,
            ``rolled_back``).
        message: one sentence.
        reasons: why it was changed: the plan's explanation (edits and restart reasons).
        restarted: the CT was restarted (its init PID changed).
    """

    ct: str
    status: str
    message: str
    reasons: tuple[str, ...] = ()
    restarted: bool = False

    @property
    def ok(self) -> bool:
        """Return True unless the CT is worse off or could not be handled."""
        return self.status not in ("not_fixed", "rolled_back", "error")

    def to_dict(self) -> dict[str, Any]:
        """Return the CT's result as JSON-ready data."""
        return {"ct": self.ct, "status": self.status, "message": self.message,
                "reasons": list(self.reasons), "restarted": self.restarted}  # fmt: skip


@dataclass(frozen=True)
class FollowResult:
    """Every CT of the node, after the last pass.

    Attributes:
        cts: one :class:`FollowedCt` per CT of the node (the last pass's word on it; a CT
            changed in an earlier pass keeps that pass's result).
        passes: how many passes ran (more than one when the host's devices changed
            during a pass).
        dry_run: nothing was written.
        unchanged_since_last: ``--if-host-changed`` found the host's devices as the last
            follow left them: no CT was looked at.
    """

    cts: tuple[FollowedCt, ...]
    passes: int
    dry_run: bool = False
    unchanged_since_last: bool = False

    @property
    def changed(self) -> tuple[FollowedCt, ...]:
        """Return the CTs that were (or, in a dry run, would be) changed."""
        return tuple(c for c in self.cts if c.status not in ("no_devices", "unchanged"))

    @property
    def exit_code(self) -> int:
        """Return 3 when a CT was not fixed, rolled back or failed; 4 for a dry run with
        pending changes; else 0."""
        if not all(c.ok for c in self.cts):
            return ExitCode.FAILED
        if self.dry_run and self.changed:
            return ExitCode.NOTHING_DONE
        return ExitCode.OK

    def summary(self) -> str:
        """Return the one-line summary (``2 CTs looked at, 1 changed ...``)."""
        if self.unchanged_since_last:
            return "nothing changed: the host's devices are as the last follow left them"
        if not self.cts:
            return "no CT found on this node: nothing to follow (is --lxcpath right?)"
        if not self.changed:
            return (
                f"nothing changed: the {len(self.cts)} CT(s) of this node have the host's devices"
            )
        verb = "would change" if self.dry_run else "changed"
        names = ", ".join(c.ct for c in self.changed)
        restarted = [c.ct for c in self.changed if c.restarted]
        tail = f"; restarted: {', '.join(restarted)}" if restarted else "; none restarted"
        return f"{len(self.cts)} CT(s) looked at, {verb}: {names}{tail}"

    def to_dict(self) -> dict[str, Any]:
        """Return the whole result as JSON-ready data."""
        return {"status": "ok" if self.exit_code == ExitCode.OK else "pending"
                if self.exit_code == ExitCode.NOTHING_DONE else "failed",
                "exit_code": int(self.exit_code), "passes": self.passes,
                "summary": self.summary(), "cts": [c.to_dict() for c in self.cts]}  # fmt: skip


def list_cts(host: Host, flavor: str, layout: Layout) -> tuple[str, ...]:
    """Return the CTs of this node: Proxmox, the ``lxc`` guests of ``.vmlist`` whose node
    is this one (``cat /etc/pve/.vmlist``; ``readlink /etc/pve/local``); plain LXC,
    ``lxc-ls -1 [-P LXCPATH]``. Raise ApplyError when they cannot be listed."""
    if flavor == LXC:
        if layout.lxcpath and not host.run(["test", "-d", layout.lxcpath], timeout=15).ok:
            # lxc-ls lists nothing for a directory that does not exist, and says nothing
            raise ApplyError("missing", f"--lxcpath {layout.lxcpath}: no such directory on"
                             " this host: no CT can be followed there")  # fmt: skip
        argv = ["lxc-ls", "-1", *(["-P", layout.lxcpath] if layout.lxcpath else [])]
        listed = host.run(argv, timeout=60)
        if not listed.ok:
            raise ApplyError("io", f"{' '.join(argv)} failed: {listed.stderr.strip()[-300:]}")
        return tuple(sorted(dict.fromkeys(listed.stdout.split())))
    vmlist_path = f"{layout.pve_root}/.vmlist"
    try:
        ids = json.loads(host.read_text(vmlist_path)).get("ids", {})
    except (OSError, ValueError):
        raise ApplyError("not_pve", f"{vmlist_path} cannot be read: not a Proxmox VE node "
                         "(plain LXC: --flavor lxc)") from None  # fmt: skip
    local = host.run(["readlink", f"{layout.pve_root}/local"], timeout=15)
    node = local.stdout.strip().rsplit("/", 1)[-1] if local.ok else ""
    if not node:  # never another node's CTs: pmxcfs shows the whole cluster's configs
        raise ApplyError("not_pve", f"cannot tell this node's name: readlink "
                         f"{layout.pve_root}/local failed")  # fmt: skip
    mine = [ct for ct, entry in ids.items()
            if entry.get("type") == "lxc" and str(entry.get("node")) == node]  # fmt: skip
    return tuple(sorted(mine, key=lambda ct: (len(ct), ct)))


def fingerprint(host: Host, paths: tuple[str, ...]) -> tuple[Any, ...]:
    """Return what the host's devices are now: ``/proc/devices`` and, per path, its kind
    and numbers (``cat /proc/devices; stat PATH...``). Two equal fingerprints: nothing
    moved in between."""
    try:
        devices = host.read_text("/proc/devices")
    except OSError:
        devices = ""
    nodes = []
    for path in paths:
        node = look_at(host, path)
        nodes.append((path, node.kind, node.major, node.minor,
                      tuple((c.path, c.major, c.minor) for c in node.children)))  # fmt: skip
    return (devices, tuple(nodes))


@contextlib.contextmanager
def follow_lock(layout: Layout, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold ``<own_lock_dir>/follow-driver.lock`` (``flock``) on the machine running this,
    the node itself when its unit runs it: one follow at a time; a second waits for the
    first (up to ``wait_s`` seconds, then ApplyError ``lock_busy``)."""
    os.makedirs(layout.own_lock_dir, mode=0o700, exist_ok=True)
    fd = fsio.open_lock(f"{layout.own_lock_dir}/follow-driver.lock", mode=0o600,
                        follow_dir_link=True)  # fmt: skip
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ApplyError("lock_busy", "another `fix --follow-driver` holds "
                                     f"{layout.own_lock_dir}/follow-driver.lock") from None  # fmt: skip
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def follow_driver(
    host: Host,
    flavor: str,
    layout: Layout,
    dry_run: bool = False,
    progress: Progress = lambda text: None,
    host_label: str = "",
    if_host_changed: bool = False,
) -> FollowResult:
    """Follow the host's devices on every CT of the node (see the module doc); return the
    per-CT result. ``if_host_changed`` (what the unit passes): do nothing when the host's
    devices (:func:`fingerprint` of every path the CTs pass) are what the last follow left
    (:func:`state_path`). Raises ApplyError when the CTs cannot be listed or the lock not
    taken, HostError when the host cannot be reached."""
    with follow_lock(layout):
        state = state_path(layout, host_label)
        results: dict[str, FollowedCt] = {}
        cts = list_cts(host, flavor, layout)
        paths = _watched_paths(host, flavor, layout, cts)
        before = _dump(fingerprint(host, paths))
        if if_host_changed and _load(state) == before:
            return FollowResult((), 0, dry_run, unchanged_since_last=True)
        for passes in range(1, MAX_PASSES + 1):
            progress(f"follow-driver: pass {passes}: {len(cts)} CT(s) on this node")
            for ct in cts:
                outcome = follow_ct(host, ct, flavor, layout, dry_run, progress, host_label)
                if outcome.status not in ("no_devices", "unchanged") or ct not in results:
                    results[ct] = outcome
            after = _dump(fingerprint(host, paths))
            if dry_run or after == before:
                break
            progress("follow-driver: the host's devices changed during the pass: again")
            cts = list_cts(host, flavor, layout)
            paths = _watched_paths(host, flavor, layout, cts)
            before = _dump(fingerprint(host, paths))
        if not dry_run:
            _save(state, after)
        ordered = tuple(results[ct] for ct in sorted(results, key=lambda c: (len(c), c)))
        return FollowResult(ordered, passes, dry_run)


STATE_LIMIT = 16 << 20  # bytes of the last follow's fingerprint read at most


def state_path(layout: Layout, host_label: str) -> str:
    """Return where the last follow's fingerprint is kept on the machine running it:
    ``<own_lock_dir>/follow-driver[-HOST].json`` (``/run/gpudoctor``: a tmpfs, so the first
    trigger after a boot always looks at every CT)."""
    safe = re.sub(r"[^A-Za-z0-9_.@-]", "_", host_label)
    return f"{layout.own_lock_dir}/follow-driver{'-' + safe if safe else ''}.json"


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _load(path: str) -> str:
    """Return the last follow's fingerprint, "" when there is none or it is not a regular
    file (a FIFO there would hold the unit: never waited on, never followed)."""
    try:
        return fsio.read_regular(path, limit=STATE_LIMIT, follow_dir_link=True).decode(
            "utf-8", "replace"
        )
    except OSError:
        return ""


def _save(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically through fsio (a new temp file, ``O_EXCL|
    O_NOFOLLOW``, renamed over whatever is there: never written through a link or FIFO)."""
    fsio.atomic_replace(path, text, mode=0o600, follow_dir_link=True, refuse_non_regular=False)


def _watched_paths(
    host: Host, flavor: str, layout: Layout, cts: tuple[str, ...]
) -> tuple[str, ...]:
    """Return the host paths the CTs' configs pass (``paths_of_interest``), for the
    fingerprint; a CT that cannot be read adds none."""
    paths: list[str] = []
    for ct in cts:
        try:
            target = resolve_target(host, flavor, ct, layout)
            config = read_config(host, target, layout).config
        except (ApplyError, ConfigError, HostError):
            continue
        paths += paths_of_interest(config, FOLLOW_PLAN)
    return tuple(dict.fromkeys(paths))


def follow_ct(
    host: Host,
    ct: str,
    flavor: str,
    layout: Layout,
    dry_run: bool = False,
    progress: Progress = lambda text: None,
    host_label: str = "",
) -> FollowedCt:
    """Return what following the host does to one CT: a read-only dry run of the fixer
    first (:data:`FOLLOW_PLAN`, the CT's state included); a CT that passes no node or whose
    plan is empty stops there; else (not ``dry_run``) the fixer applies it (``--yes``)."""
    options = FixOptions(ct=ct, flavor=flavor, plan=FOLLOW_PLAN, dry_run=True, layout=layout)
    try:
        looked = run_fix(host, options, host_label=host_label)
        plan = looked.plan
        if plan is None or not plan.probe_nodes:
            return FollowedCt(ct, "no_devices", "passes no device node: not followed")
        if looked.status == "refused":
            return FollowedCt(ct, "refused", looked.message)
        if looked.status == "nothing_to_change":
            return FollowedCt(ct, "unchanged", "its devices are the host's now: not touched")
        reasons = plan.explanation
        if dry_run:
            return FollowedCt(ct, "pending", looked.message, reasons)
        progress(f"follow-driver: CT {ct}: {'; '.join(reasons)}")
        done = run_fix(host, replace(options, dry_run=False, yes=True), progress=progress,
                       host_label=host_label)  # fmt: skip
    except ApplyError as exc:
        if exc.code == "unknown_ct":  # listed, but no config (any more): nothing to follow
            return FollowedCt(ct, "no_devices", f"not a CT with a config: {exc}")
        return FollowedCt(ct, "error", str(exc))
    except (FixPlanError, ConfigError, HostError) as exc:
        return FollowedCt(ct, "error", str(exc))
    old, new = done.init_pids if done.init_pids else (None, None)
    restarted = new is not None and new != old
    return FollowedCt(ct, done.status, done.message, reasons, restarted)
