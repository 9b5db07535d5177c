"""Audit of a CT config's device lines: warnings the planner reports and stale rules.

Pure functions over a parsed :class:`Config`, its :class:`Entries` and the host facts.
"""

from __future__ import annotations

import posixpath

from gpudoctor.facts.nodes import a_kind
from gpudoctor.pve.config import Config, Kind
from gpudoctor.pve.devspec import key_problem, unwritable
from gpudoctor.pve.entries import Entries
from gpudoctor.pve.facts import HostFacts, HostNode


def is_dynamic_major(major: int) -> bool:
    """Return True for majors the kernel hands out at module load (234-254, 384-511)."""
    return 234 <= major <= 254 or 384 <= major <= 511


def config_warnings(config: Config, entries: Entries) -> list[str]:
    """Return what the user should know about the live config that no edit changes:
    legacy cgroup v1 lines, unparsable or commented rules, invalid lines, pending changes,
    a lock."""
    warnings: list[str] = []
    for _, line in entries.legacy:
        warnings.append(
            f"legacy `{line.text.strip()}` is ignored on cgroup v2 hosts (PVE >= 7) and rejected "
            "by PVE 9: use lxc.cgroup2.devices.allow"
        )
    for _, value in entries.unparsed_allows:
        warnings.append(f"allow rule `{value}` is not a device rule LXC understands")
    for _, rule in entries.allows:
        if rule.trailing:
            warnings.append(
                f"allow rule `{rule.text}` carries `{rule.trailing}`: Proxmox passes it to LXC"
            )
    for index, line in config.main():
        if line.kind is Kind.INVALID:
            warnings.append(f"line {index + 1} is not valid config: `{line.text.strip()}`")
    for section in config.sections():
        if section.name.lower() == "pve:pending":
            warnings.append("the CT has pending changes: a restart applies them too")
    lock = config.get("lock")
    if lock:
        warnings.append(f"the CT is locked ({lock})")
    return warnings + option_warnings(config, entries)


def option_warnings(config: Config, entries: Entries) -> list[str]:
    """Return one warning per live-config line Proxmox would read otherwise than it looks:
    a key given twice (``parse_pct_config`` keeps the last line, without a word), a devN
    key it does not know (``dev256``), a devN value it rejects (:mod:`devspec`: the CT
    does not start)."""
    warnings = []
    for earlier, later, key in entries.overridden:
        warnings.append(
            f"line {earlier + 1}: `{config.lines[earlier].text.strip()}` has no effect: {key} "
            f"is given again on line {later + 1}, and Proxmox keeps the last one"
        )
    for index, dev in entries.devs:
        line = config.lines[index]
        where = f"line {index + 1}: `{line.text.strip()}`"
        problem = key_problem(line.key)
        if problem:
            warnings.append(f"{where}: {problem}")
        if dev.problems:
            warnings.append(
                f"{where} is a devN value Proxmox rejects ({'; '.join(dev.problems)}): "
                "the CT does not start until it is corrected"
            )
    return warnings


def stale_rules(
    entries: Entries, facts: HostFacts, nodes: list[HostNode], gpu_ct: bool
) -> list[tuple[int, str, str]]:
    """Return ``(line index, rule, why)`` for allow rules of dynamic majors that no NVIDIA
    driver and no passed node holds now (only in a GPU CT)."""
    if not gpu_ct:
        return []
    in_use = {c.major for n in nodes for c in n.char_nodes}
    stale = []
    for index, rule in entries.allows:
        major = rule.major
        if rule.type != "c" or major is None or major in in_use or not is_dynamic_major(major):
            continue
        names = facts.devices.char_names(major)
        if any(name.startswith("nvidia") for name in names):
            continue
        if names:
            why = f"major {major} now belongs to {'/'.join(names)}, not to an NVIDIA driver"
        else:
            why = f"major {major} is not registered in /proc/devices (an old NVIDIA major?)"
        stale.append((index, rule.text, why))
    return stale


def pinned_dynamic(entries: Entries, facts: HostFacts) -> list[tuple[str, int, str]]:
    """Return ``(rule, major, driver)`` for allow rules that pin a DYNAMIC major an NVIDIA
    driver holds now (``c 238:* rwm`` for nvidia-uvm): fragile, they break when the
    kernel hands that driver another major (driver update, module load order)."""
    out = []
    for _, rule in entries.allows:
        major = rule.major
        if rule.type != "c" or major is None or not is_dynamic_major(major):
            continue
        names = [n for n in facts.devices.char_names(major) if n.startswith("nvidia")]
        if names:
            out.append((rule.text, major, "/".join(names)))
    return out


def device_refusal(asked: str, path: str, node: HostNode | None) -> str | None:
    """Return why ``--device ASKED`` (host node ``path``) cannot be passed, or None: only
    char nodes and directories under /dev holding char nodes are (``--device /root`` would
    bind-mount the host's /root read-write), at paths a devN value and a mount entry can
    carry (no ``,`` ``=`` or whitespace). A path missing on the host is refused too: a
    typo must not end in "nothing to change" (issue 34.7)."""
    what = f"--device {asked}" + (f" (host {path})" if path != asked else "")
    odd = unwritable(path)
    if odd:
        return f"{what}: {odd}"
    if node is None or not node.exists:
        return (
            f"{what} does not exist on the host: check the path (ls -l {path} on the host);"
            " a device node appears once its driver is loaded"
        )
    if node.kind == "char":
        return None
    normal = posixpath.normpath(path) == path and path.startswith("/dev/")
    if node.kind == "dir" and normal and node.char_nodes:
        return None
    if node.kind == "dir" and normal:
        why = "a directory that holds no character device"
    elif node.kind == "dir":
        why = "a directory outside /dev"
    else:
        why = f"{a_kind(node.kind)}, not a character device"
    return (
        f"{what} is {why}: only character devices, or directories under /dev that hold "
        "them, can be passed into a CT"
    )
