"""Parsers for the values of the config entries the fixer reads and writes.

* ``lxc.cgroup2.devices.allow`` / ``.deny`` values: ``a``, ``c 195:* rwm``, ``c 195:0 rw``
  (LXC's device rule syntax, the same as cgroup v1's ``devices.allow``).
* ``lxc.mount.entry`` values: an fstab line, ``/dev/nvidia0 dev/nvidia0 none
  bind,optional,create=file``.
* Proxmox ``devN`` values: ``/dev/nvidia0,gid=44,mode=0666`` (PVE >= 8.1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpudoctor.pve.config import LXC, Config, Kind, Line
from gpudoctor.pve.devspec import DEV_KEY, mode_text, parse_dev_value

ALLOW_KEY = "lxc.cgroup2.devices.allow"
DENY_KEY = "lxc.cgroup2.devices.deny"
LEGACY_PREFIX = "lxc.cgroup.devices."
INCLUDE_KEY = "lxc.include"
MOUNT_KEY = "lxc.mount.entry"

# ASCII digits and spaces only (LXC's parser uses isdigit/isspace on bytes)
_RULE = re.compile(r"([abc])\s+(\*|\d+):(\*|\d+)(?:\s+([rwm]+))?(.*)", re.DOTALL | re.ASCII)


@dataclass(frozen=True)
class DeviceRule:
    """One cgroup device rule.

    Attributes:
        type: ``a`` (all devices), ``c`` (char) or ``b`` (block).
        major: the major, or None for ``*``.
        minor: the minor, or None for ``*``.
        access: the access letters (``rwm``).
        trailing: anything after the rule (an inline ``# comment`` Proxmox passes on).
    """

    type: str
    major: int | None = None
    minor: int | None = None
    access: str = "rwm"
    trailing: str = ""

    def covers(self, major: int, minor: int | None = None, access: str = "rw") -> bool:
        """Return True when the rule allows ``access`` on char device ``major:minor``
        (``minor=None`` asks about every minor of the major)."""
        if self.type == "a":
            return True
        if self.type != "c" or not set(access) <= set(self.access):
            return False
        if self.major is not None and self.major != major:
            return False
        return self.minor is None or (minor is not None and self.minor == minor)

    @property
    def text(self) -> str:
        """Return the rule as LXC writes it (``c 238:* rwm``)."""
        if self.type == "a":
            return "a"
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.type} {major}:{minor} {self.access}"


def parse_rule(value: str) -> DeviceRule | None:
    """Return the device rule in an allow/deny value, or None when it is not one."""
    value = value.strip()
    if value == "a" or value.startswith(("a ", "a\t")):
        return DeviceRule("a", trailing=value[1:].strip())
    match = _RULE.fullmatch(value)
    if not match:
        return None
    kind, major, minor, access, trailing = match.groups()
    return DeviceRule(
        kind,
        None if major == "*" else int(major),
        None if minor == "*" else int(minor),
        access or "rwm",
        trailing.strip(),
    )


def allow_rule(major: int) -> DeviceRule:
    """Return the rule the fixer writes for a needed major: ``c MAJOR:* rwm``."""
    return DeviceRule("c", major, None, "rwm")


@dataclass(frozen=True)
class MountEntry:
    """One ``lxc.mount.entry`` (fstab fields).

    Attributes:
        source: the host path (``/dev/nvidia0``).
        target: the path inside the CT, made absolute (``/dev/nvidia0``).
        fstype: ``none`` for bind mounts.
        options: the mount options (``bind``, ``optional``, ``create=file``).
    """

    source: str
    target: str
    fstype: str = "none"
    options: tuple[str, ...] = ()

    @property
    def is_bind(self) -> bool:
        """Return True for bind mounts (``bind`` or ``rbind`` among the options)."""
        return "bind" in self.options or "rbind" in self.options


def parse_mount(value: str) -> MountEntry | None:
    """Return the mount entry of an ``lxc.mount.entry`` value, or None when malformed."""
    fields = value.split()
    if len(fields) < 4:
        return None
    target = "/" + fields[1].lstrip("/")
    return MountEntry(fields[0], target.rstrip("/") or "/", fields[2], tuple(fields[3].split(",")))


def bind_mount_value(host_path: str, is_dir: bool) -> str:
    """Return the mount entry the fixer writes for a node (relative target, like Proxmox)."""
    create = "dir" if is_dir else "file"
    return f"{host_path} {host_path.lstrip('/')} none bind,optional,create={create}"


@dataclass(frozen=True)
class DevEntry:
    """One Proxmox ``devN`` entry (PVE >= 8.1 creates the node and its cgroup rule at start).

    Attributes:
        index: N.
        path: the host device path (also the path in the CT), from the default key or
            ``path=`` wherever it stands in the value.
        options: ``(("gid", "44"), ("mode", "0666"), ...)``.
        problems: why Proxmox rejects the value (:mod:`devspec`); empty when it accepts it.
    """

    index: int
    path: str
    options: tuple[tuple[str, str], ...] = ()
    problems: tuple[str, ...] = ()


def parse_dev(key: str, value: str) -> DevEntry | None:
    """Return the devN entry, or None when ``key`` is not ``devN`` (ASCII digits) or the
    value names no path at all."""
    match = DEV_KEY.fullmatch(key)
    if not match or not value.strip():
        return None
    parsed = parse_dev_value(value)
    if parsed.path is None:
        return DevEntry(int(match.group(1)), "", parsed.options, parsed.problems)
    return DevEntry(int(match.group(1)), parsed.path, parsed.options, parsed.problems)


def dev_value(path: str, gid: int, mode: int) -> str:
    """Return the devN value the fixer writes: ``/dev/nvidia0,gid=0,mode=0666`` (only the
    permission bits: a setgid node's 0o2666 is written ``0666``, Proxmox's ``0[0-7]{3}``)."""
    return f"{path},gid={gid},mode={mode_text(mode)}"


@dataclass(frozen=True)
class Entries:
    """The device-related entries of a config's live section, with their line indexes.

    ``devs`` holds the line in effect per devN key (the last one: ``parse_pct_config``
    assigns ``$conf->{$key}`` line by line); ``overridden`` is ``(earlier index, index
    in effect, key)`` of every option line a later line of the same key replaces.
    ``open_policy``: a plain LXC config with no ``lxc.cgroup2.devices.*`` line and no
    ``lxc.include``: LXC then allows EVERY device (measured with LXC 4.0.6, 5.0.2, 6.0.4;
    the first allow line would turn the policy into an allow list that denies /dev/null).
    """

    allows: tuple[tuple[int, DeviceRule], ...]
    unparsed_allows: tuple[tuple[int, str], ...]
    legacy: tuple[tuple[int, Line], ...]
    mounts: tuple[tuple[int, MountEntry], ...]
    devs: tuple[tuple[int, DevEntry], ...]
    overridden: tuple[tuple[int, int, str], ...] = ()
    open_policy: bool = False

    def covered(self, major: int, minor: int | None = None) -> bool:
        """Return True when the CT may read and write ``major:minor``: some allow rule
        covers it, or the config sets no device policy at all (``open_policy``)."""
        return self.open_policy or any(rule.covers(major, minor) for _, rule in self.allows)

    def mount_for(self, path: str) -> MountEntry | None:
        """Return the bind mount that passes host ``path`` (by source or by target)."""
        for _, entry in self.mounts:
            if entry.is_bind and path in (entry.source.rstrip("/"), entry.target):
                return entry
        return None

    def dev_for(self, path: str) -> DevEntry | None:
        """Return the devN entry for ``path``, or None."""
        return next((dev for _, dev in self.devs if dev.path == path), None)


def read_entries(config: Config) -> Entries:
    """Return the device-related entries of the live config (sections are never read)."""
    allows, unparsed, legacy, mounts = [], [], [], []
    devs: dict[str, tuple[int, DevEntry]] = {}
    last: dict[str, int] = {}
    overridden = []
    for index, line in config.main():
        if line.kind is Kind.RAW and line.key == ALLOW_KEY:
            rule = parse_rule(line.value)
            if rule is None:
                unparsed.append((index, line.value))
            else:
                allows.append((index, rule))
        elif line.kind is Kind.RAW and line.key.startswith(LEGACY_PREFIX):
            legacy.append((index, line))
        elif line.kind is Kind.RAW and line.key == MOUNT_KEY:
            entry = parse_mount(line.value)
            if entry is not None:
                mounts.append((index, entry))
        elif line.kind is Kind.OPTION:
            if line.key in last and line.key != "delete":
                overridden.append((last[line.key], index, line.key))
            last[line.key] = index
            dev = parse_dev(line.key, line.value)
            devs.pop(line.key, None)
            if dev is not None:
                devs[line.key] = (index, dev)
    ordered = tuple(sorted(devs.values(), key=lambda item: item[0]))
    return Entries(tuple(allows), tuple(unparsed), tuple(legacy), tuple(mounts), ordered,
                   tuple(overridden), _open_policy(config))  # fmt: skip


def _open_policy(config: Config) -> bool:
    """Return True for a plain LXC config that sets no cgroup v2 device rule and includes
    no other file (which could): LXC then allows every device. Proxmox always writes its
    own deny-all plus allow list, so a ``pve`` config never has an open policy."""
    if config.flavor != LXC:
        return False
    keys = {ln.key for _, ln in config.main() if ln.kind is Kind.RAW}
    return not keys & {ALLOW_KEY, DENY_KEY, INCLUDE_KEY}


def host_path(entries: Entries, path: str) -> str:
    """Return the host node behind a device path: the source of a bind mount whose target
    inside the CT is ``path`` (``/dev/fakegpu`` <- ``/dev/kvm``), else ``path`` itself."""
    for _, mount in entries.mounts:
        if mount.is_bind and mount.target == path.rstrip("/"):
            return mount.source.rstrip("/")
    return path


def ct_path(entries: Entries, path: str) -> str:
    """Return where host node ``path`` appears inside the CT (a bind mount's target)."""
    for _, mount in entries.mounts:
        source = mount.source.rstrip("/")
        if mount.is_bind and path == source:
            return mount.target
        if mount.is_bind and path.startswith(source + "/"):
            return mount.target + path[len(source) :]
    return path


def paths_of_interest(config: Config, options: object) -> list[str]:
    """Return the host paths the planner needs facts about (``stat``): the sources of the
    config's bind mounts under /dev, its devN paths, and the requested devices."""
    entries = read_entries(config)
    paths = [m.source.rstrip("/") for _, m in entries.mounts if m.is_bind and m.source[:1] == "/"]
    paths += [d.path for _, d in entries.devs if d.path]
    paths += [host_path(entries, p) for p in getattr(options, "devices", ())]
    return list(dict.fromkeys(paths))
