"""ct.device_rules: the CT config allows the CURRENT major of every node it passes through.

Runs on the CT's host (``gpudoctor check --host root@pve1 --ct 200``): the fixer's planner,
read-only, on the config as it is now and /proc/devices as it is now. It catches the
incident's drift (a host driver update or reboot moved nvidia-uvm to a new major) before
the CT is even restarted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from gpudoctor.checks._ct_config import read_ct_config

from gpudoctor.context import CheckContext
from gpudoctor.model import Finding, Severity
from gpudoctor.registry import check


@check(
    id="ct.device_rules",
    title="The CT config allows the current major of every device node it passes through",
    severity=Severity.CRITICAL,
    proves="for each node the CT config bind-mounts (or --device names), some "
    "lxc.cgroup2.devices.allow rule or devN entry covers the major:minor the host has NOW",
    remediation="On Proxmox VE >= 8.1 pass the nodes as devN entries, which follow a moving "
    "major (gpudoctor fix does that by default there); elsewhere add "
    "lxc.cgroup2.devices.allow: c MAJOR:* rwm for each uncovered major. Then restart the CT. "
    "A rule that pins a dynamic NVIDIA major (nvidia-uvm, nvidia-caps) is a fragile config "
    "(WARN): it breaks when the major moves; migrate with gpudoctor fix --mode devn.",
    scope="ct_host",
    fix="gpudoctor fix --host HOST --ct ID",
)
def device_rules(ctx: CheckContext) -> Iterator[Finding]:
    """Yield FAIL per node whose current major no rule allows, WARN per stale/legacy rule
    and per rule that pins a dynamic NVIDIA major (fragile), and one PASS when nothing is
    missing (``cat /etc/pve/lxc/ID.conf; cat /proc/devices; stat NODE; pveversion``)."""

    from gpudoctor.pve import facts as facts_mod
    from gpudoctor.pve.audit import device_refusal, pinned_dynamic
    from gpudoctor.pve.entries import host_path, read_entries
    from gpudoctor.pve.planner import RULES, FixPlanError, PlanOptions, paths_of_interest, plan

    read = read_ct_config(ctx)
    if isinstance(read, Finding):
        yield read
        return
    ct, target, layout, snap = ctx.options.ct, read.target, read.layout, read.snap
    options = PlanOptions(
        mode=RULES,
        devices=tuple(d.path for d in ctx.options.devices),
        include_host_nvidia=False,
        label=target.config_path,
    )
    is_pve = target.flavor == "pve"
    paths = paths_of_interest(snap.config, options)
    facts = facts_mod.gather(ctx.host, paths, is_pve, layout.pveversion)
    entries = read_entries(snap.config)
    passable = []
    for asked in options.devices:  # the planner refuses these; a check reports them
        path = host_path(entries, asked)
        node = facts.node(path)
        why = device_refusal(asked, path, node)
        if why is None:
            passable.append(asked)
            continue
        yield ctx.fail(
            asked,
            f"{why}: {target.config_path} cannot pass it into CT {ct}, and open() of it inside "
            "the CT cannot reach a device",
            evidence=(f"host: stat {path}: {_node_text(node)}",),
            remediation=f"Give --device the host's device node, not {path}; if {path} should be "
            "a device node, remove what is there and re-create the node (mknod, or the "
            "driver's nvidia-modprobe).",
        )
    options = replace(options, devices=tuple(passable))
    try:
        the_plan = plan(snap.config, facts, options)
    except FixPlanError as exc:
        yield ctx.fail(
            target.config_path,
            f"the config cannot be planned: {exc}",
            evidence=(f"config: {target.config_path}",),
            remediation="Fix the config (or the options) as the message says, then check again.",
        )
        return
    adds = [e.line for e in the_plan.edits if e.action == "add" and "devices.allow" in e.line]
    for missing in the_plan.missing:
        yield ctx.fail(
            missing.path,
            f"{missing.path} is {missing.driver} major {missing.major} on the host now, and no "
            f"rule in {target.config_path} allows it: open() inside the CT fails with EPERM "
            "after its next start",
            evidence=(
                f"host: char {missing.major}:{missing.minor} ({missing.driver})",
                *(f"config: lxc.cgroup2.devices.allow: {r.text}" for r in _rules(snap.config)),
            ),
            remediation="\n".join(adds) or "allow the major in the CT config",
            fix_hint=ctx.options.fix_command(),
        )
    for warning in the_plan.warnings:
        # fix removes a stale rule only with --prune; it leaves the other warnings' lines
        hint = f"{ctx.options.fix_command()} --prune" if "--prune" in warning else ""
        yield ctx.warn(target.config_path, warning, fix_hint=hint)
    for rule, major, driver in pinned_dynamic(read_entries(snap.config), facts):
        yield _fragile(ctx, target.config_path, rule, major, driver, is_pve, facts.pve_version)
    if not the_plan.missing:
        yield ctx.passed(
            target.config_path,
            f"every passed-through node's current major is allowed ({len(the_plan.probe_paths)} "
            "node(s))",
        )


def _fragile(
    ctx: CheckContext, path: str, rule: str, major: int, driver: str, is_pve: bool,
    version: str | None,
) -> Finding:  # fmt: skip
    """The WARN for a rule that pins a dynamic NVIDIA major, with the migration command."""
    from gpudoctor.pve.devn import DEVN_MIN_PVE, parse_version

    parsed = parse_version(version)
    devn_ok = is_pve and (parsed is None or parsed[:2] >= DEVN_MIN_PVE)
    migrate = f"{ctx.options.fix_command()} --mode devn"
    if devn_ok:
        todo = f"migrate to devN entries, which follow the major by themselves: {migrate}"
    elif is_pve:
        todo = (
            f"Proxmox VE {version} has no devN entries (>= 8.1): upgrade, then run {migrate}; "
            f"until then run {ctx.options.fix_command()} after every driver update"
        )
    else:
        todo = f"plain LXC has no devN entries: run {ctx.options.fix_command()} after every driver update"
    return ctx.warn(
        path,
        f"fragile config: `lxc.cgroup2.devices.allow: {rule}` pins the dynamic major of "
        f"{driver} ({major} now); it breaks when the major moves (driver update, module "
        f"load order). Fix: {todo}",
        evidence=(f"host: {driver} is char major {major} (dynamic: handed out at module load)",),
        remediation=todo,
        fix_hint=migrate if devn_ok else "",  # without devN, fix has nothing to change now
    )


def _node_text(node: object) -> str:
    """Return what a host path is, in words (``a FIFO, mode 0644``), for evidence."""
    from gpudoctor.facts.nodes import a_kind

    kind = getattr(node, "kind", "missing")
    if node is None or kind == "missing":
        return "No such file or directory"
    text = f"{a_kind(kind)}, mode {getattr(node, 'mode', 0) & 0o7777:04o}"
    if kind in ("char", "block"):
        text += f", {getattr(node, 'major', 0)}:{getattr(node, 'minor', 0)}"
    return text


def _rules(config: object) -> list:
    from gpudoctor.pve.entries import read_entries

    return [rule for _, rule in read_entries(config).allows]  # type: ignore[arg-type]


@check(
    id="ct.hooks",
    title="No CT hook makes GPU nodes with a fixed major",
    severity=Severity.CRITICAL,
    proves="no lxc.hook.autodev/mount/pre-start script (or inline sh -c) the CT config names "
    "mknods an NVIDIA node (or a --device path) with numbers other than the host's node has "
    "now; the hook files are read on the host, never run",
    remediation="Comment the hook line out of the CT config and pass the host's nodes instead: "
    "devN entries on Proxmox VE >= 8.1, bind mounts + allow rules for their current majors "
    "elsewhere (gpudoctor fix plans exactly that; the hook file is left as it is).",
    scope="ct_host",
    fix="gpudoctor fix --host HOST --ct ID",
)
def hooks(ctx: CheckContext) -> Iterator[Finding]:
    """Yield FAIL per hook mknod of a GPU node whose numbers differ from the host's node
    now (stale), WARN per one that matches today (a fixed major breaks when it moves) and
    per unreadable hook script, one PASS otherwise (``grep mknod HOOK; cat /proc/devices;
    stat /dev/nvidia-uvm``)."""

    from gpudoctor.pve import facts as facts_mod
    from gpudoctor.pve.hookplan import gpu_verdicts
    from gpudoctor.pve.hooks import read_hooks

    read = read_ct_config(ctx)
    if isinstance(read, Finding):
        yield read
        return
    target, snap = read.target, read.snap
    found = read_hooks(ctx.host, snap.config)
    paths = [m.path for h in found for m in h.mknods]
    facts = replace(facts_mod.gather(ctx.host, dict.fromkeys(paths)), hooks=found)
    devices = tuple(d.path for d in ctx.options.devices)
    for hook in found:
        if hook.error:
            yield ctx.warn(hook.where, f"{hook.key}: {hook.error}: its mknods are not known",
                           evidence=(f"config line {hook.index + 1}: {hook.key}: {hook.value}",))  # fmt: skip
    verdicts = gpu_verdicts(facts, devices)
    for v in verdicts:
        evidence = (
            f"{target.config_path} line {v.hook.index + 1}: {v.hook.key}: {v.hook.value}",
            f"{v.hook.where} line {v.mknod.line_no}: {v.mknod.text}",
            *([f"host: {v.source}: char {v.current[0]}:{v.current[1]} ({v.driver})"]
              if v.current else []),
        )  # fmt: skip
        todo = (
            f"comment out line {v.hook.index + 1} of {target.config_path} ({v.hook.key}) and "
            f"pass the host's {v.mknod.path} instead: {ctx.options.fix_command()}"
        )
        subject = f"{v.hook.where}:{v.mknod.line_no}"
        if v.stale:
            yield ctx.fail(subject, f"{v.describe()}: open() of it inside the CT fails",
                           evidence=evidence, remediation=todo,
                           fix_hint=ctx.options.fix_command())  # fmt: skip
        else:
            yield ctx.warn(subject, v.describe(), evidence=evidence, remediation=todo,
                           fix_hint=ctx.options.fix_command())  # fmt: skip
    if not verdicts and not any(h.error for h in found):
        names = ", ".join(h.where for h in found) or "none"
        yield ctx.passed(target.config_path, f"no hook makes GPU nodes itself (hooks: {names})")
