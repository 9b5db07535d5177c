"""The planner: (config, host facts, options) -> the exact edits a CT needs. Pure.

Rules (DESIGN.md section 5, issue 9):

* one ``lxc.cgroup2.devices.allow: c MAJOR:* rwm`` per major that a passed-through node
  needs and no rule covers, the major read from the host (never assumed);
* a bind mount ``lxc.mount.entry: /dev/X dev/X none bind,optional,create=file`` per
  wanted node the config does not pass yet (``create=dir`` for node directories such as
  ``/dev/nvidia-caps``);
* ``--mode devn`` (PVE >= 8.1): ``devN: /dev/X,gid=G,mode=M`` entries instead, which
  Proxmox re-stats at every start (the durable cure for moving majors);
* allow rules for dynamic majors that no NVIDIA driver (and no passed node) holds any
  more are flagged as stale, and removed only with ``prune``;
* legacy ``lxc.cgroup.devices.*`` lines (ignored on cgroup v2, gone in PVE 9) are flagged.

Edits go into the live section only, right after the existing lines of the same key;
nothing is appended after a ``[section]`` header and no marker comment is written
(``#`` lines are the CT's description in Proxmox).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.facts.nodes import driver_name_for_major
from gpudoctor.pve.audit import config_warnings, is_dynamic_major, stale_rules
from gpudoctor.pve.config import LXC, Config, Kind, Line, unified_diff
from gpudoctor.pve.entries import (
    ALLOW_KEY,
    DENY_KEY,
    MOUNT_KEY,
    DeviceRule,
    Entries,
    allow_rule,
    bind_mount_value,
    ct_path,
    dev_value,
    host_path,
    paths_of_interest,
    read_entries,
)
from gpudoctor.pve.facts import HostFacts, HostNode

RAW = "raw"
DEVN = "devn"
MODES = (RAW, DEVN)
DEVN_MIN_PVE = (8, 1)


class PlanError(ValueError):
    """The options cannot be planned for this config/host (the message says why)."""


@dataclass(frozen=True)
class PlanOptions:
    """What the user asked for.

    Attributes:
        mode: ``raw`` (cgroup rules + bind mounts) or ``devn`` (Proxmox devN entries).
        devices: host device paths to pass (nodes or directories of nodes).
        include_host_nvidia: also pass every NVIDIA node found in the host's /dev.
        prune: remove stale NVIDIA allow rules instead of only flagging them.
        dev_gid: the ``gid=`` for devN entries (None: the host node's group).
        label: the config path shown in the diff header.
    """

    mode: str = RAW
    devices: tuple[str, ...] = ()
    include_host_nvidia: bool = True
    prune: bool = False
    dev_gid: int | None = None
    label: str = "config"


@dataclass(frozen=True)
class Edit:
    """One planned change: ``add`` or ``remove`` a line, and why."""

    action: str
    line: str
    reason: str


@dataclass(frozen=True)
class MissingRule:
    """A passed node whose CURRENT major no allow rule covers (``ct.device_rules`` FAILs)."""

    path: str
    major: int
    minor: int
    driver: str


@dataclass(frozen=True)
class Plan:
    """The planner's answer.

    Attributes:
        old_text: the config as read.
        new_text: the config after the edits (equal to ``old_text`` when nothing to do).
        edits: the changes, in file order of their reasons.
        diff: a unified diff of old -> new (empty when unchanged).
        explanation: one sentence per edit, with the fact that motivates it.
        warnings: things the user should know that the plan does not change.
        missing: nodes passed through (or requested) whose current major is not allowed.
        stale: the stale allow lines found (``c 509:* rwm``), removed or not.
        probe_paths: the char nodes as the CT sees them, to try-open before and after.
    """

    old_text: str
    new_text: str
    edits: tuple[Edit, ...] = ()
    diff: str = ""
    explanation: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    missing: tuple[MissingRule, ...] = ()
    stale: tuple[str, ...] = field(default=())
    probe_paths: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        """Return True when applying the plan changes the file."""
        return self.new_text != self.old_text


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """Return ``(8, 2, 4)`` for ``8.2.4``, None when unknown."""
    if not text:
        return None
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        return None


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

    def drop(self, index: int, reason: str) -> None:
        """Plan the removal of line ``index``, with its reason."""
        self.removes.add(index)
        text = self.config.lines[index].text
        self.edits.append(Edit("remove", text, reason))
        self.explanation.append(f"remove `{text}`: {reason}")


def plan(config: Config, facts: HostFacts, options: PlanOptions) -> Plan:
    """Return the plan that gives the CT access to the wanted nodes (pure; no I/O)."""
    if options.mode not in MODES:
        raise PlanError(f"unknown mode {options.mode!r} (expected raw or devn)")
    if options.mode == DEVN:
        _check_devn(config, facts)
    entries = read_entries(config)
    build = _Builder(config)
    if options.mode == DEVN and parse_version(facts.pve_version) is None:
        build.warnings.append("Proxmox VE version unknown (pveversion): devN entries need >= 8.1")
    build.warnings.extend(config_warnings(config, entries))
    wanted = _wanted_nodes(entries, facts, options, build)
    passed = _passed_nodes(entries, facts)
    missing = _missing_rules(entries, facts, [*wanted, *passed])
    gpu_ct = any("nvidia" in n.path for n in [*wanted, *passed])
    if options.mode == RAW:
        _plan_raw(config, facts, entries, wanted, missing, build)
    else:
        _plan_devn(config, entries, wanted, options, build)
    stale = stale_rules(entries, facts, [*wanted, *passed], gpu_ct)
    for index, rule_text, why in stale:
        if options.prune:
            build.drop(index, why)
        else:
            build.warnings.append(f"stale rule `{rule_text}`: {why} (remove it with --prune)")
    new_config = config.edit(build.inserts, build.removes)
    return Plan(
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
    )


def _check_devn(config: Config, facts: HostFacts) -> None:
    if config.flavor == LXC:
        raise PlanError("--mode devn is a Proxmox feature; plain LXC needs --mode raw")
    version = parse_version(facts.pve_version)
    if version is not None and version[:2] < DEVN_MIN_PVE:
        raise PlanError(f"--mode devn needs Proxmox VE >= 8.1 (this host runs {facts.pve_version})")


def _wanted_nodes(
    entries: Entries, facts: HostFacts, options: PlanOptions, build: _Builder
) -> list[HostNode]:
    requested = [host_path(entries, p) for p in options.devices]
    paths = [*(facts.nvidia if options.include_host_nvidia else ()), *requested]
    wanted = []
    for path in dict.fromkeys(paths):
        node = facts.node(path)
        if node is None or not node.exists:
            build.warnings.append(f"{path} does not exist on the host: not passed")
        elif node.kind not in ("char", "dir"):
            build.warnings.append(f"{path} is a {node.kind}, not a device node: not passed")
        else:
            wanted.append(node)
    return wanted


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
         "host now, and no rule allows it")
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
        build.add(mount_at, MOUNT_KEY, value, f"{node.path} is not passed into the CT")


def _plan_devn(
    config: Config,
    entries: Entries,
    wanted: list[HostNode],
    options: PlanOptions,
    build: _Builder,
) -> None:
    used = {dev.index for _, dev in entries.devs}
    next_index = 0
    devs_at = [i for i, _ in entries.devs]
    options_at = [i for i, ln in config.main() if ln.kind is Kind.OPTION and ln.key < "dev"]
    anchor = max(devs_at) if devs_at else (max(options_at) if options_at else -1)
    if anchor == -1:
        anchor = _first_option(config) - 1
    for node in wanted:
        moved = [c.path for c in node.char_nodes if ct_path(entries, c.path) != c.path]
        if moved:
            build.warnings.append(
                f"{node.path} is bind-mounted elsewhere in the CT ({ct_path(entries, moved[0])}); "
                "a devN entry would put it at its host path: kept as is, use --mode raw"
            )
            continue
        for char in node.char_nodes:
            if entries.dev_for(char.path):
                continue
            while next_index in used:
                next_index += 1
            used.add(next_index)
            gid = options.dev_gid if options.dev_gid is not None else char.gid
            build.add(
                anchor,
                f"dev{next_index}",
                dev_value(char.path, gid, char.mode),
                f"{char.path} (major {char.major}, re-read by Proxmox at every start)",
            )
        for index, mount in entries.mounts:
            if mount.is_bind and mount.source.rstrip("/") == node.path:
                build.drop(index, f"replaced by devN entries for {node.path}")


def _first_option(config: Config) -> int:
    options = [i for i, ln in config.main() if ln.kind is Kind.OPTION]
    return min(options) if options else config.main_end


__all__ = [
    "DEVN",
    "RAW",
    "Plan",
    "PlanError",
    "PlanOptions",
    "paths_of_interest",
    "plan",
    "unified_diff",
]
