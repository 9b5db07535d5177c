"""Proxmox ``devN`` entries: which mode a CT gets, and the migration to devN. Pure.

pve-container (Proxmox VE >= 8.1) turns every ``devN: /dev/X[,gid=,uid=,mode=]``
into ``lxc.cgroup2.devices.allow = c MAJOR:MINOR rw`` for the node's CURRENT numbers
(``stat`` at every start, ``PVE::LXC::update_lxc_config``) and creates the node in the CT:
unlike a ``c 238:* rwm`` rule, it follows a major that moved (docs/fix.md has the sources).

The migration (``--mode devn``, or ``auto`` on PVE >= 8.1) gives every wanted node a devN
entry and removes exactly two kinds of lines, each only when the devN entries make it
redundant:

* a bind mount (``lxc.mount.entry``) whose source is a node that now has a devN entry, at
  the same path inside the CT (or the node directory whose char nodes all have one);
* an allow rule of an NVIDIA major (``/proc/devices`` names an ``nvidia*`` driver for it)
  when every node of that major the CT still needs is covered by a devN entry.

No other line is ever touched: rules of other majors (dri 226, ``a``), stale majors (only
``--prune`` removes those), legacy cgroup v1 lines, bind mounts of other paths.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.pve.config import LXC, Config, Kind
from gpudoctor.pve.devspec import MAX_DEVICES
from gpudoctor.pve.entries import Entries, ct_path, dev_value
from gpudoctor.pve.facts import HostFacts, HostNode

RULES = "rules"
DEVN = "devn"
AUTO = "auto"
MODES = (AUTO, DEVN, RULES)
ALIASES = {"raw": RULES}
DEVN_MIN_PVE = (8, 1)


class ModeError(ValueError):
    """The mode asked for cannot be used on this CT (the message says why)."""


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """Return ``(8, 2, 4)`` for ``8.2.4``, None when unknown."""
    if not text:
        return None
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        return None


def resolve_mode(requested: str, config: Config, pve_version: str | None) -> str:
    """Return ``devn`` or ``rules`` for the requested mode (``auto``: devN on Proxmox VE
    >= 8.1, read with ``pveversion``; rules on older PVE, unknown versions and plain LXC).
    Raise ModeError for ``devn`` where Proxmox cannot honour it."""
    mode = ALIASES.get(requested, requested)
    if mode not in MODES:
        raise ModeError(f"unknown mode {requested!r} (expected auto, devn or rules)")
    version = parse_version(pve_version)
    if mode == DEVN:
        if config.flavor == LXC:
            raise ModeError("--mode devn is a Proxmox feature; plain LXC needs --mode rules")
        if version is not None and version < DEVN_MIN_PVE:
            raise ModeError(f"--mode devn needs Proxmox VE >= 8.1 (this host runs {pve_version})")
        return DEVN
    if mode == AUTO and config.flavor != LXC and version is not None:
        return DEVN if version >= DEVN_MIN_PVE else RULES
    return RULES


def is_nvidia_major(facts: HostFacts, major: int) -> bool:
    """Return True when /proc/devices names an NVIDIA driver for char ``major``."""
    return any(name.startswith("nvidia") for name in facts.devices.char_names(major))


@dataclass(frozen=True)
class DevnPlan:
    """What the devN planning decided.

    Attributes:
        adds: ``(key, value, reason)`` of the new devN lines, in order.
        drop_mounts: ``(line index, reason)`` of the bind mounts the devN entries replace.
        drop_rules: ``(line index, reason)`` of the NVIDIA rules they make redundant.
        fallback: wanted nodes that cannot become devN entries (bind-mounted at another
            path in the CT): they keep cgroup rules.
        warnings: what the user should know.
        dev_paths: every host path with a devN entry after the plan.
    """

    adds: tuple[tuple[str, str, str], ...] = ()
    drop_mounts: tuple[tuple[int, str], ...] = ()
    drop_rules: tuple[tuple[int, str], ...] = ()
    fallback: tuple[HostNode, ...] = ()
    warnings: tuple[str, ...] = ()
    dev_paths: tuple[str, ...] = ()


def plan_devn(
    entries: Entries,
    facts: HostFacts,
    wanted: list[HostNode],
    passed: list[HostNode],
    dev_gid: int | None = None,
) -> DevnPlan:
    """Return the devN entries for ``wanted`` nodes and the lines they make redundant
    (``passed``: every node the config passes now, to keep rules still needed). Raise
    ModeError when the nodes need an index beyond dev255 (Proxmox's ``$MAX_DEVICES``)."""
    used = {dev.index for _, dev in entries.devs}
    adds: list[tuple[str, str, str]] = []
    warnings: list[str] = []
    fallback: list[HostNode] = []
    dev_paths = [dev.path for _, dev in entries.devs if dev.path]
    next_index = 0
    for node in wanted:
        moved = [c.path for c in node.char_nodes if ct_path(entries, c.path) != c.path]
        if moved:
            warnings.append(
                f"{node.path} is bind-mounted elsewhere in the CT ({ct_path(entries, moved[0])}); "
                "a devN entry would put it at its host path: kept with a cgroup rule"
            )
            fallback.append(node)
            continue
        for char in node.char_nodes:
            if char.path in dev_paths:  # an entry of the config, or one added above
                continue
            while next_index in used:
                next_index += 1
            if next_index >= MAX_DEVICES:
                raise ModeError(
                    f"{char.path} would need dev{next_index}: Proxmox knows dev0 to "
                    f"dev{MAX_DEVICES - 1} only ($MAX_DEVICES in pve-container's "
                    "src/PVE/LXC/Config.pm); pass fewer nodes (--device) or use --mode rules"
                )
            used.add(next_index)
            gid = dev_gid if dev_gid is not None else char.gid
            reason = (f"{char.path} (major {char.major}, re-read by Proxmox at every start;"
                      " cures ct.device_rules)")  # fmt: skip
            adds.append((f"dev{next_index}", dev_value(char.path, gid, char.mode), reason))
            dev_paths.append(char.path)
    covered = set(dev_paths)
    drop_mounts = _redundant_mounts(entries, facts, covered)
    drop_rules = _redundant_rules(entries, facts, covered, [*passed, *fallback])
    return DevnPlan(
        tuple(adds),
        tuple(drop_mounts),
        tuple(drop_rules),
        tuple(fallback),
        tuple(warnings),
        tuple(dict.fromkeys(dev_paths)),
    )


def _redundant_mounts(
    entries: Entries, facts: HostFacts, covered: set[str]
) -> list[tuple[int, str]]:
    """Bind mounts of a node (or node directory) at its own path, all covered by devN."""
    out = []
    for index, mount in entries.mounts:
        source = mount.source.rstrip("/")
        if not mount.is_bind or mount.target != source:
            continue
        node = facts.node(source)
        chars = node.char_nodes if node is not None else ()
        if source in covered or (chars and all(c.path in covered for c in chars)):
            out.append((index, f"replaced by devN entries for {source}"))
    return out


def _redundant_rules(
    entries: Entries, facts: HostFacts, covered: set[str], others: list[HostNode]
) -> list[tuple[int, str]]:
    """NVIDIA allow rules such that every node of theirs the CT needs has a devN entry
    (``others``: the nodes the CT gets some other way, which keep their rules)."""
    numbers = {(c.major, c.minor): c.path for n in facts.nodes for c in n.char_nodes}
    devn_numbers = {mm for mm, path in numbers.items() if path in covered}
    needed = [c for n in others for c in n.char_nodes if (c.major, c.minor) not in devn_numbers]
    out = []
    for index, rule in entries.allows:
        major = rule.major
        if rule.type != "c" or major is None or rule.trailing:
            continue
        if not is_nvidia_major(facts, major):
            continue
        if any(rule.covers(c.major, c.minor) for c in needed):
            continue
        if not any(rule.covers(mj, mn) for mj, mn in devn_numbers):
            continue  # no devN entry stands in for it: not redundant, only unused
        names = "/".join(facts.devices.char_names(major))
        out.append((index, f"its {names} nodes are passed as devN entries, which allow them"))
    return out


def first_option_index(config: Config) -> int:
    """Return the index of the first Proxmox option line of the live config (or its end)."""
    options = [i for i, ln in config.main() if ln.kind is Kind.OPTION]
    return min(options) if options else config.main_end


def dev_anchor(config: Config, entries: Entries) -> int:
    """Return the line after which new devN lines go: after the last devN line, else after
    the last option sorting before ``dev`` (Proxmox writes keys sorted), else before the
    first option."""
    devs_at = [i for i, _ in entries.devs]
    if devs_at:
        return max(devs_at)
    before = [i for i, ln in config.main() if ln.kind is Kind.OPTION and ln.key < "dev"]
    return max(before) if before else first_option_index(config) - 1
