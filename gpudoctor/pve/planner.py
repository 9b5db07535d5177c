"""The planner: (config, host facts, options) -> the exact edits a CT needs. Pure.

Rules (DESIGN.md section 5, issue 9):

* one ``lxc.cgroup2.devices.allow: c MAJOR:* rwm`` per major that a passed-through node
  needs and no rule covers, the major read from the host (never assumed);
* a bind mount ``lxc.mount.entry: /dev/X dev/X none bind,optional,create=file`` per
  wanted node the config does not pass yet (``create=dir`` for node directories such as
  ``/dev/nvidia-caps``);
* mode ``devn`` (the default, ``auto``, on Proxmox VE >= 8.1): ``devN: /dev/X,gid=G,mode=M``
  entries instead, which Proxmox re-stats at every start (the durable cure for moving
  majors), replacing the NVIDIA bind mounts and rules they make redundant (:mod:`devn`);
* ``--device`` accepts character devices, and directories under /dev that hold them;
* allow rules for dynamic majors that no NVIDIA driver (and no passed node) holds any
  more are flagged as stale, and removed only with ``prune``;
* legacy ``lxc.cgroup.devices.*`` lines (ignored on cgroup v2, gone in PVE 9) are flagged;
* a hook line whose script mknods a GPU node with fixed numbers is commented out and the
  node passed as above instead (:mod:`hookplan`; the hook file is never edited).

Edits go into the live section only, right after the existing lines of the same key;
nothing is appended after a ``[section]`` header and no marker comment is written
(``#`` lines are the CT's description in Proxmox).
"""

from __future__ import annotations

import re

from gpudoctor.facts.nodes import a_kind, driver_name_for_major, family_of
from gpudoctor.pve.audit import config_warnings, device_refusal, is_dynamic_major, stale_rules
from gpudoctor.pve.config import LXC, Config, Kind, Line, classify, unified_diff
from gpudoctor.pve.devn import (
    ALIASES,
    AUTO,
    DEVN,
    RULES,
    ModeError,
    dev_anchor,
    parse_version,
    plan_devn,
    resolve_mode,
)
from gpudoctor.pve.entries import (
    ALLOW_KEY,
    DENY_KEY,
    MOUNT_KEY,
    DeviceRule,
    Entries,
    allow_rule,
    bind_mount_value,
    ct_path,
    host_path,
    paths_of_interest,
    read_entries,
)
from gpudoctor.pve.facts import HostFacts, HostNode
from gpudoctor.pve.hookplan import plan_hooks
from gpudoctor.pve.plan_types import Edit, FixPlan, FixPlanError, MissingRule, PlanOptions

RAW = RULES  # the old name of the rules mode


class _Builder:
    """Collects inserts/removals against the original line indexes, plus the explanations."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.inserts: dict[int, list[Line]] = {}
        self.removes: set[int] = set()
        self.edits: list[Edit] = []
        self.explanation: list[str] = []
        self.warnings: list[str] = []

    def add(self, anchor: int, key: str, value: str, reason: str) -> None:
        """Plan ``key: value`` after line ``anchor``, styled like that line, with its reason."""
        like = self.config.lines[anchor] if anchor >= 0 else None
        line = self.config.make_line(key, value, like)
        self.inserts.setdefault(anchor, []).append(line)
        self.edits.append(Edit("add", line.text, reason))
        self.explanation.append(f"add `{line.text}`: {reason}")

    def comment(self, index: int, reason: str) -> None:
        """Plan ``#`` before line ``index`` (commented out in place), with its reason."""
        line = self.config.lines[index]
        self.removes.add(index)
        self.inserts.setdefault(index, []).insert(0, classify("#" + line.text, line.eol,
                                                              self.config.flavor))  # fmt: skip
        self.edits.append(Edit("comment", line.text, reason))
        self.explanation.append(f"comment out `{line.text}`: {reason}")

    def drop(self, index: int, reason: str) -> None:
        """Plan the removal of line ``index``, with its reason."""
        self.removes.add(index)
        text = self.config.lines[index].text
        self.edits.append(Edit("remove", text, reason))
        self.explanation.append(f"remove `{text}`: {reason}")


def plan(config: Config, facts: HostFacts, options: PlanOptions) -> FixPlan:
    """Return the plan that gives the CT access to the wanted nodes (pure; no I/O)."""
    if options.dev_gid is not None and options.dev_gid < 0:
        raise FixPlanError(f"--dev-gid {options.dev_gid}: a gid is >= 0 (devN's minimum)", "usage")
    try:
        mode = resolve_mode(options.mode, config, facts.pve_version)
    except ModeError as exc:
        raise FixPlanError(str(exc)) from None
    entries = read_entries(config)
    build = _Builder(config)
    if ALIASES.get(options.mode, options.mode) == DEVN and parse_version(facts.pve_version) is None:
        build.warnings.append("Proxmox VE version unknown (pveversion): devN entries need >= 8.1")
    build.warnings.extend(config_warnings(config, entries))
    wanted = _wanted_nodes(entries, facts, options, build, mode == RULES)
    cure = plan_hooks(facts, options.devices, mode == DEVN, config.flavor != LXC)
    build.warnings.extend(cure.warnings)
    for index, reason in cure.comment_out:
        build.comment(index, reason)
    wanted += [n for n in cure.nodes if n not in wanted]
    passed = _passed_nodes(entries, facts)
    _plan_create(config, entries, facts, build)
    missing = _missing_rules(entries, facts, [*wanted, *passed])
    gpu_ct = any("nvidia" in n.path for n in [*wanted, *passed])
    dev_paths: tuple[str, ...] = tuple(d.path for _, d in entries.devs if d.path)
    if mode == RULES:
        _plan_raw(config, facts, entries, wanted, missing, build)
    else:
        try:
            dev_paths = _plan_devn(config, facts, entries, wanted, passed, options, build)
        except ModeError as exc:
            raise FixPlanError(str(exc)) from None
    stale = stale_rules(entries, facts, [*wanted, *passed], gpu_ct)
    for index, rule_text, why in stale:
        if options.prune:
            build.drop(index, why)
        else:
            build.warnings.append(f"stale rule `{rule_text}`: {why} (remove it with --prune)")
    nothing_to_pass = options.include_host_nvidia and not options.devices and not facts.nvidia
    if build.edits:  # in the same write, never a write of its own (issue 45.7)
        for index, line in entries.legacy:
            build.comment(index, f"legacy `{line.text.strip()}` is ignored on cgroup v2 hosts"
                          " (PVE >= 7) and rejected by PVE 9 (ct.device_rules)")  # fmt: skip
    new_config = config.edit(build.inserts, build.removes)
    return FixPlan(
        old_text=config.text,
        new_text=new_config.text,
        edits=tuple(build.edits),
        diff=unified_diff(config.text, new_config.text, options.label),
        explanation=tuple(build.explanation),
        warnings=tuple(build.warnings),
        missing=tuple(missing),
        stale=tuple(text for _, text, _ in stale),
        probe_paths=tuple(
            dict.fromkeys(
                ct_path(entries, c.path) for n in [*wanted, *passed] for c in n.char_nodes
            )
        ),
        mode=mode,
        pve_version=facts.pve_version,
        nothing_to_pass=nothing_to_pass,
        dev_paths=dev_paths,
        probe_nodes=tuple(
            dict.fromkeys(
                (ct_path(entries, c.path), c.major, c.minor)
                for n in [*wanted, *passed]
                for c in n.char_nodes
            )
        ),
    )


def _plan_create(config: Config, entries: Entries, facts: HostFacts, build: _Builder) -> None:
    """Plan ``create=file`` (``create=dir``) on each bind mount of a host char node (node
    directory) into the CT's /dev that has no ``create=``: LXC's /dev is a fresh tmpfs
    (autodev), so the mount has nothing to land on and an ``optional`` mount is skipped:
    the node is missing inside after every start, and a restart alone never cures it."""
    for index, mount in entries.mounts:
        node = facts.node(mount.source.rstrip("/"))
        if not mount.is_bind or node is None or node.kind not in ("char", "dir"):
            continue
        if not mount.target.startswith("/dev/") or any(
            o.startswith("create=") for o in mount.options
        ):
            continue
        fields = config.lines[index].value.split()
        fields[3] += ",create=dir" if node.kind == "dir" else ",create=file"
        why = (
            f"{mount.target} has no create=: the CT's /dev has no file for the bind mount to "
            "land on, so LXC skips it and the node is missing inside after every start"
            " (cures device.nodes)"
        )
        build.drop(index, why)
        build.add(index, MOUNT_KEY, " ".join(fields), why)


def _wanted_nodes(
    entries: Entries, facts: HostFacts, options: PlanOptions, build: _Builder, rules: bool
) -> list[HostNode]:
    """Return the host nodes to pass: ``--device``'s and the host's NVIDIA nodes; in rules
    mode, only :func:`check_needs`'s when the CT already passes check's node findings
    (devN mode migrates every NVIDIA node it passes: the cure of ct.device_rules' WARN)."""
    requested = [(p, host_path(entries, p)) for p in options.devices]
    for asked, path in requested:
        why = device_refusal(asked, path, facts.node(path))
        if why:
            raise FixPlanError(why, "usage")
    found = [(p, p) for p in (facts.nvidia if options.include_host_nvidia else ())]
    if rules and found and not requested and _check_passes(entries, facts):
        found = [(p, q) for p, q in found if check_needs(p)]  # nothing unasked beyond them
    wanted = []
    for _, path in dict.fromkeys([*found, *requested]):
        node = facts.node(path)
        if node is None or not node.exists:
            build.warnings.append(f"{path} does not exist on the host: not passed")
        elif node.kind not in ("char", "dir"):
            build.warnings.append(f"{path} is {a_kind(node.kind)}, not a device node: not passed")
        elif node not in wanted:
            wanted.append(node)
    return wanted


def check_needs(path: str) -> bool:
    """Return True for a host NVIDIA node whose absence in a GPU CT is a finding of
    ``device.nodes`` (a required node: nvidiactl, nvidia-uvm; a GPU node nvidiaN): the
    nodes a CT needs. The others (/dev/nvidia-caps for MIG, nvidia-uvm-tools,
    nvidia-modeset, NVSwitch and IMEX nodes) no check asks for: they are passed with the
    rest when a CT needs a fix anyway, never alone (issue 45.6); ``--device`` asks for them."""
    family = family_of(path)
    if family is None:
        return False
    name = path.rpartition("/")[2]
    return name in family.required or bool(
        family.at_least_one and re.fullmatch(family.at_least_one, name)
    )


def _cures(node: HostNode) -> str:
    """Return which check a bind mount of ``node`` cures: ``device.nodes`` for a node it
    requires or one ``--device`` asked for (check takes the same ``--device``); for the
    host's other NVIDIA nodes, that none requires them alone (issue 45.6)."""
    paths = [node.path, *(c.path for c in node.char_nodes)]
    if not any(family_of(p) for p in paths) or any(check_needs(p) for p in paths):
        return "cures device.nodes"
    return "no check requires it alone: passed with the nodes device.nodes requires"


def _check_passes(entries: Entries, facts: HostFacts) -> bool:
    """Return True when the config already passes every node ``device.nodes`` asks for
    (:func:`check_needs`) and allows every char node it passes (``ct.device_rules``): then
    no finding justifies passing the host's other NVIDIA nodes too (issue 45.6: a healthy
    CT was planned /dev/nvidia-caps, and ``fix --yes`` would have restarted it for that)."""
    chars = [c for n in facts.nodes if n.exists for c in n.char_nodes]
    needed = [c for c in chars if check_needs(c.path)]
    passed = [c for c in chars if _is_passed(entries, c)]
    return (
        bool(needed)
        and all(c in passed for c in needed)
        and (not _missing_rules(entries, facts, passed))
    )


def _passed_nodes(entries: Entries, facts: HostFacts) -> list[HostNode]:
    paths = [m.source for _, m in entries.mounts if m.is_bind] + [d.path for _, d in entries.devs]
    nodes = [facts.node(p.rstrip("/")) for p in paths]
    return [n for n in nodes if n is not None and n.exists]


def _missing_rules(entries: Entries, facts: HostFacts, nodes: list[HostNode]) -> list[MissingRule]:
    missing: dict[tuple[int, int], MissingRule] = {}
    for node in nodes:
        for char in node.char_nodes:
            if entries.dev_for(char.path) or entries.covered(char.major, char.minor):
                continue
            missing.setdefault(
                (char.major, char.minor),
                MissingRule(
                    char.path,
                    char.major,
                    char.minor,
                    driver_name_for_major(facts.devices, char.major),
                ),
            )
    return list(missing.values())


def _is_passed(entries: Entries, node: HostNode) -> bool:
    if entries.mount_for(node.path) or entries.dev_for(node.path):
        return True
    parent = node.path.rsplit("/", 1)[0]
    if parent not in ("", "/dev") and entries.mount_for(parent):
        return True
    kids = node.char_nodes if node.kind == "dir" else ()
    return bool(kids) and all(entries.mount_for(k.path) or entries.dev_for(k.path) for k in kids)


def _anchor(config: Config, entries_at: list[int], fallback_keys: tuple[str, ...]) -> int:
    """Return the line after which new lines go: the last line of the same key, else the
    last line of a related key, else the last non-blank line of the live section."""
    if entries_at:
        return max(entries_at)
    main = config.main()
    for prefix in fallback_keys:
        related = [i for i, ln in main if ln.kind is Kind.RAW and ln.key.startswith(prefix)]
        if related:
            return max(related)
    content = [i for i, ln in main if ln.kind is not Kind.BLANK]
    return max(content) if content else -1


def _rules_for(missing: list[MissingRule], facts: HostFacts) -> list[tuple[DeviceRule, str]]:
    """Return one rule per needed major (``c M:* rwm``) for majors that one driver owns
    (NVIDIA's, dynamic ones); per node (``c 10:232 rwm``) for shared static majors (misc)."""
    rules: dict[DeviceRule, list[str]] = {}
    for item in missing:
        names = facts.devices.char_names(item.major)
        whole = is_dynamic_major(item.major) or any(n.startswith("nvidia") for n in names)
        rule = allow_rule(item.major) if whole else DeviceRule("c", item.major, item.minor, "rwm")
        rules.setdefault(rule, []).append(item.path)
    return [
        (rule, f"{', '.join(p)} {'is' if len(p) == 1 else 'are'} {_owner(facts, rule)} on the "
         "host now, and no rule allows it (cures device.open and ct.device_rules)")
        for rule, p in rules.items()
    ]  # fmt: skip


def _owner(facts: HostFacts, rule: DeviceRule) -> str:
    names = facts.devices.char_names(rule.major or 0)
    return f"{'/'.join(names) or 'char'} major {rule.major}"


def _plan_raw(
    config: Config,
    facts: HostFacts,
    entries: Entries,
    wanted: list[HostNode],
    missing: list[MissingRule],
    build: _Builder,
) -> None:
    # after the last allow/deny line: a later `deny = a` would wipe an allow put before it
    device_lines = [
        i for i, ln in config.main() if ln.kind is Kind.RAW and ln.key in (ALLOW_KEY, DENY_KEY)
    ]
    allow_at = _anchor(config, device_lines, ("lxc.cgroup2.", "lxc.cgroup.", "lxc."))
    for rule, paths in _rules_for(missing, facts):
        build.add(allow_at, ALLOW_KEY, rule.text, paths)
    mount_at = _anchor(config, [i for i, _ in entries.mounts], ())
    if not entries.mounts:
        mount_at = allow_at
    for node in wanted:
        if _is_passed(entries, node):
            continue
        value = bind_mount_value(node.path, node.kind == "dir")
        build.add(
            mount_at, MOUNT_KEY, value, f"{node.path} is not passed into the CT ({_cures(node)})"
        )


def _plan_devn(
    config: Config,
    facts: HostFacts,
    entries: Entries,
    wanted: list[HostNode],
    passed: list[HostNode],
    options: PlanOptions,
    build: _Builder,
) -> tuple[str, ...]:
    """Plan devN entries (and the redundant lines they replace); return the host paths
    with a devN entry afterwards. Nodes that cannot be devN entries keep cgroup rules."""
    devn = plan_devn(entries, facts, wanted, passed, options.dev_gid)
    build.warnings.extend(devn.warnings)
    anchor = dev_anchor(config, entries)
    for key, value, reason in devn.adds:
        build.add(anchor, key, value, reason)
    for index, reason in [*devn.drop_mounts, *devn.drop_rules]:
        build.drop(index, reason)
    numbers = {(c.major, c.minor) for n in facts.nodes for c in n.char_nodes
               if c.path in devn.dev_paths}  # fmt: skip
    others = [n for n in [*passed, *devn.fallback]]
    still = [m for m in _missing_rules(entries, facts, others)
             if (m.major, m.minor) not in numbers]  # fmt: skip
    device_lines = [
        i for i, ln in config.main() if ln.kind is Kind.RAW and ln.key in (ALLOW_KEY, DENY_KEY)
    ]
    allow_at = _anchor(config, device_lines, ("lxc.cgroup2.", "lxc.cgroup.", "lxc."))
    for rule, paths in _rules_for(still, facts):
        build.add(allow_at, ALLOW_KEY, rule.text, paths)
    return devn.dev_paths


__all__ = [
    "AUTO",
    "DEVN",
    "RAW",
    "RULES",
    "FixPlan",
    "FixPlanError",
    "PlanOptions",
    "paths_of_interest",
    "plan",
    "unified_diff",
]
