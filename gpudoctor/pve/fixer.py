"""``gpudoctor fix``: parse -> plan -> diff -> confirm -> backup -> locked CAS write ->
restart -> re-check inside -> roll back when the CT is worse than before.

This module only orchestrates; every effect on the host is in :mod:`apply` (the write)
and :mod:`restart` (the container), every decision in :mod:`planner`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpudoctor.exit_codes import ExitCode
from gpudoctor.hosts.base import Host, HostError
from gpudoctor.pve import ctstate, uvm_unit
from gpudoctor.pve import facts as facts_mod
from gpudoctor.pve.api import ApiController, ApiSettings, connect
from gpudoctor.pve.apply import (
    ApplyError,
    Layout,
    Snapshot,
    Target,
    WriteResult,
    backup_name,
    compare_and_swap,
    discard_client_copy,
    read_config,
    refusal,
    resolve_target,
    save_client_copy,
)
from gpudoctor.pve.hooks import read_hooks
from gpudoctor.pve.inside import container_host, device_checks, safe_probe, worse
from gpudoctor.pve.outcome import FixOutcome
from gpudoctor.pve.planner import DEVN, FixPlan, PlanOptions, paths_of_interest, plan
from gpudoctor.pve.restart import Controller, controller_for


@dataclass(frozen=True)
class FixOptions:
    """What ``gpudoctor fix`` was asked to do.

    Attributes:
        ct: VMID (Proxmox) or container name (plain LXC).
        flavor: ``pve`` or ``lxc``.
        plan: the planner's options (mode, devices, prune, ...).
        dry_run: show the plan and diff, change nothing.
        yes: apply without asking.
        restart: restart a running CT after the write (and re-check inside it).
        layout: where things live on the host.
        api: Proxmox API settings: status, restart and task waiting go through the API
            (the config write still goes over SSH); None = ``pct`` over SSH.
        driver_libs: ``bind`` (bind the host's driver files into the CT), ``copy`` (print
            the exact-version install), or "" (leave the CT's libraries alone).
    """

    ct: str
    flavor: str = "pve"
    plan: PlanOptions = field(default_factory=PlanOptions)
    dry_run: bool = False
    yes: bool = False
    restart: bool = True
    layout: Layout = field(default_factory=Layout)
    api: ApiSettings | None = None
    driver_libs: str = ""


Progress = Callable[[str], None]
Confirm = Callable[[FixPlan], bool]


def make_plan(host: Host, options: FixOptions) -> tuple[Target, Snapshot, FixPlan]:
    """Return the target, the config as read and the plan (read-only on the host)."""
    target = resolve_target(host, options.flavor, options.ct, options.layout)
    snap = read_config(host, target, options.layout)
    plan_options = PlanOptions(**{**options.plan.__dict__, "label": target.config_path})
    want_version = options.flavor == "pve" and plan_options.mode != "rules"
    hooks = read_hooks(host, snap.config)  # hook scripts that mknod nodes (cat FILE)
    paths = [*paths_of_interest(snap.config, plan_options),
             *(m.path for h in hooks for m in h.mknods if m.path.startswith("/dev/"))]  # fmt: skip
    facts = facts_mod.gather(host, dict.fromkeys(paths), want_version, options.layout.pveversion)
    the_plan = plan(snap.config, replace(facts, hooks=hooks), plan_options)
    if the_plan.mode == DEVN and options.api is not None and options.api.token:
        note = (
            "devN entries are refused through the API for API tokens (only root@pam may set "
            "them): gpudoctor writes them over SSH; edit them later as root@pam"
        )
        the_plan = replace(the_plan, warnings=(*the_plan.warnings, note))
    if options.driver_libs:
        the_plan = _with_driver_libs(host, options.driver_libs, the_plan, target.config_path)
    return target, snap, the_plan


def _with_driver_libs(host: Host, mode: str, the_plan: FixPlan, label: str) -> FixPlan:
    """Return the plan with ``--driver-libs`` applied (:mod:`driver_libs`); raise
    FixPlanError when the host's driver files cannot be listed."""
    from gpudoctor.facts.driver_files import read_driver_files
    from gpudoctor.pve import driver_libs
    from gpudoctor.pve.planner import FixPlanError

    files = read_driver_files(host)
    if files.error:
        raise FixPlanError(f"--driver-libs {mode}: {files.error}")
    if mode == driver_libs.BIND:
        return driver_libs.add_binds(the_plan, files, label)
    return driver_libs.add_copy(the_plan, files)


def make_controller(host: Host, target: Target, options: FixOptions, snap: Snapshot) -> Controller:
    """Return the CT's controller: the Proxmox API when configured (after checking that
    its config digest equals the SHA-1 read over SSH), else ``pct`` / ``lxc-*`` over SSH."""
    if options.api is None:
        return controller_for(host, target, options.layout)
    if target.flavor != "pve":
        raise ApplyError("usage", "--api is for Proxmox VE; plain LXC has no API")
    ctl = ApiController(host, target, options.layout, connect(options.api))
    digest = ctl.digest()
    if digest != snap.sha1:
        raise ApplyError(
            "api_mismatch",
            f"the API's config digest of CT {target.ct} ({digest[:12]}) differs from the file "
            f"read over SSH ({snap.sha1[:12]}): --api and --host do not show the same CT",
        )
    return ctl


def run_fix(
    host: Host,
    options: FixOptions,
    confirm: Confirm = lambda plan: False,
    progress: Progress = lambda text: None,
    host_label: str = "",
    on_plan: Callable[[FixPlan], None] = lambda plan: None,
) -> FixOutcome:
    """Run the whole fix on the CT's host; return the outcome (raises ApplyError for
    refusals and failed writes, HostError when the host cannot be reached).

    ``on_plan`` sees each changing plan first (the CT's, then the host prep's) to show
    it; ``confirm`` then decides unless ``options.yes``; ``progress`` gets one line per
    step. Order of effects: client backup, host prep, config write (host backup inside
    it), restart, re-check inside, rollback."""
    progress("reading the CT config and the host's devices")
    target, snap, the_plan = make_plan(host, options)
    why_not = refusal(snap.config, target)
    if why_not:
        return FixOutcome("refused", ExitCode.FAILED, why_not, target, the_plan)
    prep = _host_prep_offer(host, target, options, the_plan)
    ctl: Controller | None = None
    if not the_plan.changed and not the_plan.nothing_to_pass:
        try:
            ctl = make_controller(host, target, options, snap)
            the_plan = _with_ct_state(host, ctl, target, options, the_plan, progress, host_label)
        except ApplyError as exc:  # no pct/lxc-info answer: the config alone decides
            ctl = None
            note = f"the CT's state could not be read ({exc}): only its config was checked"
            the_plan = replace(the_plan, warnings=(*the_plan.warnings, note))
    if not the_plan.pending and prep is None:
        if the_plan.nothing_to_pass:
            message = (
                "nothing to pass through: the host has no /dev/nvidia* node (is the NVIDIA "
                "driver loaded? `nvidia-smi` on the host) and no --device was given"
            )
            return FixOutcome("nothing_to_pass", ExitCode.FAILED, message, target, the_plan)
        message = "nothing to change"
        if ctl is not None and the_plan.probe_nodes and ctl.state() != "RUNNING":
            message += f" (CT {target.ct} is stopped: it gets its devices at its next start)"
        return FixOutcome("nothing_to_change", ExitCode.OK, message, target, the_plan)
    for shown in (the_plan, prep):
        if shown is not None and (shown.pending or shown.explanation):
            on_plan(shown)
    pending = {"target": target, "plan": the_plan, "host_prep": prep}
    if options.dry_run:
        message = "dry run: nothing written"
        if the_plan.restart_reasons:
            message += (
                f"; CT {target.ct} needs a restart ({len(the_plan.restart_reasons)} reason(s))"
            )
        return FixOutcome("dry_run", ExitCode.NOTHING_DONE, message, **pending)
    if not options.yes and not confirm(the_plan):
        return FixOutcome(
            "declined", ExitCode.NOTHING_DONE, "not applied: nothing written", **pending
        )
    if prep is not None:
        progress(f"installing {uvm_unit.UNIT_NAME} (creates /dev/nvidia-uvm before guests)")
        _install_host_prep(host, options.layout, progress)
    if the_plan.changed:
        return _write_and_restart(host, options, target, snap, the_plan, prep, progress, host_label)
    if the_plan.restart_reasons and ctl is not None:
        return _restart_only(host, ctl, options, snap, pending, progress)
    message = f"{uvm_unit.UNIT_NAME} installed; the CT config needed no change"
    return FixOutcome("applied", ExitCode.OK, message, **pending)


def _with_ct_state(
    host: Host,
    ctl: Controller,
    target: Target,
    options: FixOptions,
    the_plan: FixPlan,
    progress: Progress,
    host_label: str,
) -> FixPlan:
    """Return the plan with a restart step when the RUNNING CT's devices are older than
    its config and the host's nodes (:mod:`ctstate`), and the host cause when the host
    lacked a node at the CT's start; the plan as it is otherwise."""
    if not the_plan.probe_nodes or ctl.state() != "RUNNING":
        return the_plan
    progress("looking at the devices inside the running CT")
    inside = container_host(host, target, options.layout)
    try:
        gaps = ctstate.restart_reasons(inside, the_plan.probe_nodes)
    except (HostError, OSError) as exc:
        note = f"the devices inside the running CT could not be looked at ({exc})"
        return replace(the_plan, warnings=(*the_plan.warnings, note))
    finally:
        inside.close()
    if not gaps:
        return the_plan
    reasons = tuple(g.reason for g in gaps)
    steps = tuple(f"restart CT {target.ct}: {reason}" for reason in reasons)
    late = [g.path for g in gaps if g.host_was_missing]
    cause = ctstate.host_cause(host, options.layout, late, host_label or host.name)
    return replace(the_plan, restart_reasons=reasons, host_cause=cause,
                   explanation=(*the_plan.explanation, *steps, *([cause] if cause else ())))  # fmt: skip


def _host_prep_offer(
    host: Host, target: Target, options: FixOptions, the_plan: FixPlan
) -> FixPlan | None:
    """Return the host prep's plan when the CT's devN entries need /dev/nvidia-uvm at start
    and the boot unit that creates it is missing, else None."""
    if target.flavor != "pve" or the_plan.mode != DEVN:
        return None
    if not uvm_unit.needs_boot_nodes(the_plan.dev_paths):
        return None
    prep = uvm_unit.plan_host_prep(host, uvm_unit.systemd_root(), options.layout).plan
    return prep if prep.explanation else None


def _install_host_prep(host: Host, layout: Layout, progress: Progress) -> None:
    """Install the boot unit; a concurrent fix of another CT on the same node that installs
    it first makes our compare-and-swap see a changed file: plan again once (then it is
    usually already there, and nothing is left to do)."""
    try:
        uvm_unit.run_host_prep(host, yes=True, progress=progress, layout=layout)
    except ApplyError as exc:
        if exc.code != "changed":
            raise
        uvm_unit.run_host_prep(host, yes=True, progress=progress, layout=layout)


def _probe_before(host: Host, target: Target, options: FixOptions, paths: tuple[str, ...],
                  progress: Progress) -> tuple[tuple[str, str], ...]:  # fmt: skip
    """Return the open() of the plan's nodes and of the CT's basic devices inside the
    running CT, before anything changes."""
    progress("probing the devices inside the CT before the change")
    ct_host = container_host(host, target, options.layout)
    try:
        return safe_probe(ct_host, (*paths, *ctstate.BASIC_DEVICES))
    finally:
        ct_host.close()


def _restart_only(
    host: Host,
    ctl: Controller,
    options: FixOptions,
    snap: Snapshot,
    pending: dict[str, Any],
    progress: Progress,
) -> FixOutcome:
    """Restart the running CT whose config is right but whose devices are older (the
    plan's restart reasons), then re-check inside: nothing is written."""
    target: Target = pending["target"]
    the_plan: FixPlan = pending["plan"]
    before = _probe_before(host, target, options, the_plan.probe_paths, progress)
    old_pid = ctl.init_pid()
    base = {**pending, "write": None, "client_backup": ""}
    return _restart_and_verify(host, ctl, options, snap, before, old_pid, base, progress)


def _write_and_restart(
    host: Host,
    options: FixOptions,
    target: Target,
    snap: Snapshot,
    the_plan: FixPlan,
    prep: FixPlan | None,
    progress: Progress,
    host_label: str,
) -> FixOutcome:
    """Probe inside, save the client backup, write (CAS), restart and re-check."""
    ctl = make_controller(host, target, options, snap)
    running = ctl.state() == "RUNNING"
    before: tuple[tuple[str, str], ...] = ()
    old_pid = ctl.init_pid() if running else None
    if running:
        before = _probe_before(host, target, options, the_plan.probe_paths, progress)

    relative = backup_name(target, snap.sha1)
    progress("saving the backup copy here, before anything is written")
    client_copy = save_client_copy(options.layout, host_label or host.name, relative, snap.data)
    progress(f"backing up and writing {target.config_path}")
    try:
        result = compare_and_swap(
            host,
            target,
            options.layout,
            snap.sha1,
            the_plan.new_text.encode(),
            f"{options.layout.backup_dir}/{relative}",
        )
    except ApplyError as exc:
        if exc.code in ("changed", "lock_busy", "unknown_ct", "verify"):
            discard_client_copy(options.layout, client_copy)  # the old config is in place
        raise
    base = {"target": target, "plan": the_plan, "write": result, "client_backup": client_copy,
            "host_prep": prep}  # fmt: skip
    if not running or not options.restart:
        message = "applied; the CT is stopped: the new rules apply at its next start"
        if running:
            message = (
                "applied; restart the CT for the new rules to take effect (running this "
                "fix again restarts it and re-checks inside)"
            )
        return FixOutcome("applied_not_running", ExitCode.OK, message, before=before, **base)
    return _restart_and_verify(host, ctl, options, snap, before, old_pid, base, progress)


def _restart_and_verify(
    host: Host,
    ctl: Controller,
    options: FixOptions,
    snap: Snapshot,
    before: tuple[tuple[str, str], ...],
    old_pid: int | None,
    base: dict[str, Any],
    progress: Progress,
) -> FixOutcome:
    """Restart, re-check inside (the plan's nodes, the basic devices, the CT's state), and
    roll a written config back when the CT is worse; ``base["write"]`` None: a restart
    only (nothing to roll back)."""
    target: Target = base["target"]
    the_plan: FixPlan = base["plan"]
    result: WriteResult | None = base["write"]
    verb = "applied" if result is not None else "restart planned"
    progress(f"restarting CT {target.ct}")
    try:
        _check_unlocked(host, target, options.layout)
    except ApplyError as exc:
        message = f"{verb}, but not restarted: {exc}; restart the CT when the task is done"
        return FixOutcome("applied_not_running", ExitCode.FAILED, message, before=before, **base)
    try:
        ctl.restart()
        new_pid = ctl.wait_running(old_pid)
    except ApplyError as exc:
        if result is None:
            message = (
                f"the CT did not come back after the restart ({exc}); its config was not changed"
            )
            return FixOutcome("not_fixed", ExitCode.FAILED, message, before=before,
                              start_log=exc.details, **base)  # fmt: skip
        progress(f"the CT did not come back ({exc}); rolling back")
        _rollback(
            host, ctl, target, options.layout, result, snap, f"the CT did not come back ({exc})"
        )
        return FixOutcome("rolled_back", ExitCode.FAILED, f"rolled back: {exc}", before=before,
                          start_log=exc.details, **base)  # fmt: skip
    after, checks, gaps = _recheck(host, target, options, the_plan, progress)
    pids = (old_pid, new_pid)
    lost = worse(before, after)
    if lost and result is not None:
        progress(f"{', '.join(lost)} opened before and not now; rolling back")
        _rollback(host, ctl, target, options.layout, result, snap, f"{', '.join(lost)} broke")
        message = f"rolled back: {', '.join(lost)} could be opened before the change, not after"
        return FixOutcome("rolled_back", ExitCode.FAILED, message, before=before, after=after,
                          init_pids=pids, checks=checks, **base)  # fmt: skip
    opened = dict(after)
    failing = [p for p in [*the_plan.probe_paths, *lost] if opened.get(p) != "OK"]
    if failing or gaps:
        still = "; ".join([*(f"{p} cannot be opened ({opened.get(p)})" for p in failing),
                           *(g.reason for g in gaps)])  # fmt: skip
        message = f"{verb} and CT {target.ct} restarted, but inside it: {still}"
        return FixOutcome("not_fixed", ExitCode.FAILED, message, before=before, after=after,
                          init_pids=pids, checks=checks, **base)  # fmt: skip
    message = f"fixed: CT {target.ct} restarted and every device opens inside it"
    return FixOutcome("applied", ExitCode.OK, message, before=before, after=after,
                      init_pids=pids, checks=checks, **base)  # fmt: skip


def _recheck(
    host: Host, target: Target, options: FixOptions, the_plan: FixPlan, progress: Progress
) -> tuple[tuple[tuple[str, str], ...], tuple[dict[str, Any], ...], tuple[ctstate.StateGap, ...]]:
    """Return, inside the restarted CT: the open() of the plan's nodes and the basic
    devices, the catalogue's device checks, and the state gaps left (:mod:`ctstate`)."""
    inside = container_host(host, target, options.layout)
    try:
        if options.driver_libs == "bind":
            from gpudoctor.pve.driver_libs import LIB_DIR, ldconfig_script

            progress(f"inside the CT: ld.so.conf.d names {LIB_DIR}; ldconfig")
            done = inside.run(["sh", "-c", ldconfig_script()], timeout=60)
            if not done.ok:
                progress(f"ldconfig inside the CT failed: {(done.stderr or done.stdout)[-200:]}")
        progress("re-checking the devices inside the CT")
        after = safe_probe(inside, (*the_plan.probe_paths, *ctstate.BASIC_DEVICES))
        checks = device_checks(inside, target, the_plan.probe_paths)
        try:
            gaps = ctstate.restart_reasons(inside, the_plan.probe_nodes)
        except (HostError, OSError) as exc:
            gaps = (ctstate.StateGap("", "unreachable", f"the CT cannot be looked at ({exc})"),)
    finally:
        inside.close()
    return after, checks, gaps


def _check_unlocked(host: Host, target: Target, layout: Layout) -> None:
    """``pct reboot`` skips the lock check: re-read the config and refuse a ``lock:``."""
    snap = read_config(host, target, layout)
    why_not = refusal(snap.config, target)
    if why_not:
        raise ApplyError("locked", why_not)


def _rollback(
    host: Host,
    ctl: Controller,
    target: Target,
    layout: Layout,
    written: WriteResult,
    snap: Snapshot,
    why: str,
) -> None:
    """Put the old bytes back through the same CAS (only if nobody changed the file since),
    then bring the CT up again; raise ApplyError naming the backup when the old bytes
    cannot be put back, or saying they ARE back when only the CT's start fails."""
    try:
        compare_and_swap(host, target, layout, written.new_sha1, snap.data, "")
    except ApplyError as exc:
        raise ApplyError(
            "rollback_failed",
            f"{why}, and the rollback failed too: {exc}. The old config is saved in "
            f"{written.host_backup} on the host",
        ) from None
    try:
        if ctl.state() == "RUNNING":
            ctl.restart()
        else:
            ctl.start()
        ctl.wait_running(None)
    except ApplyError as exc:
        raise ApplyError(
            "rollback_failed",
            f"{why}; the old config is back in place in {target.config_path} (a copy is in "
            f"{written.host_backup} on the host), but the CT did not start on it either: "
            f"{exc}",
            exc.details,
        ) from None
