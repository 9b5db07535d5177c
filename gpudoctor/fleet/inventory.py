"""The fleet's inventory: which nodes to reach over SSH and which containers to check on each.

Two sources make the same :class:`Inventory`:

* a TOML file (``--inventory hosts.toml``, :func:`load_inventory_file`), for plain LXC hosts
  or Proxmox nodes without API access;
* a Proxmox cluster's API (``--cluster pve1``, :mod:`gpudoctor.fleet.proxmox`), which lists
  every CT and selects those passing NVIDIA devices through (:func:`gpu_passthrough_evidence`).

``--ct`` narrows either one (:meth:`Inventory.narrowed`: ids, names or globs).

The inventory file::

    [defaults]                    # optional; every key may also be set per node
    user = "root"                 # SSH login when `ssh` is not given
    flavor = "pve"                # pve (pct exec) or lxc (lxc-attach)
    known_hosts = "~/.ssh/known_hosts"
    identity_file = "~/.ssh/id_ed25519"

    [[nodes]]
    name = "pve1"                 # how reports name the node
    ssh = "root@10.0.0.11"        # default: <user>@<name> (an ~/.ssh/config alias works)
    cts = [200, 201]              # VMIDs (pve) or container names (lxc)

    [[nodes]]
    name = "box2"
    ssh = "root@10.0.0.12:2222"
    flavor = "lxc"
    lxcpath = "/var/lib/lxc"      # lxc-attach -P (default: LXC's own)
    cts = ["bench1", "bench2"]
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from gpudoctor.pve.entries import parse_dev, parse_mount, parse_rule

FLAVORS = ("pve", "lxc")
NVIDIA_MAJOR = 195  # nvidia0..N and nvidiactl: the one NVIDIA major that never moves
RUNNING, STOPPED, UNKNOWN = "running", "stopped", "unknown"


class InventoryError(ValueError):
    """The inventory cannot be built (bad file, API refused); the message says why."""


@dataclass(frozen=True)
class NodeSpec:
    """One container host (a Proxmox node or a plain LXC host).

    Attributes:
        name: how reports name it (``pve1``).
        ssh: the SSH target (``root@10.0.0.11``, ``root@h:2222``, an alias) or ``local``.
        flavor: ``pve`` (``pct exec``) or ``lxc`` (``lxc-attach``).
        lxcpath: LXC's container directory for flavor ``lxc`` (None: LXC's default).
        known_hosts: an extra known_hosts file for this node.
        identity_file: a private key file for this node.
        online: False when the cluster says the node is offline (not attempted).
    """

    name: str
    ssh: str
    flavor: str = "pve"
    lxcpath: str | None = None
    known_hosts: str | None = None
    identity_file: str | None = None
    online: bool = True


@dataclass(frozen=True)
class CtSpec:
    """One container to check.

    Attributes:
        node: the name of its node.
        ct: the VMID (``200``) or LXC container name.
        name: its hostname as the cluster reports it ("" when unknown).
        status: ``running``, ``stopped`` or ``unknown`` (asked on the node at run time).
        evidence: why it was selected (the config lines passing NVIDIA devices).
    """

    node: str
    ct: str
    name: str = ""
    status: str = UNKNOWN
    evidence: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """Return ``node/ct200`` (pve-style ids) or ``node/name`` (LXC names)."""
        return f"{self.node}/ct{self.ct}" if self.ct.isdigit() else f"{self.node}/{self.ct}"


@dataclass(frozen=True)
class Inventory:
    """Nodes and the containers to check on them.

    Attributes:
        nodes: every node, in the order given.
        cts: every container, grouped by node in node order.
        source: where it came from (``file hosts.toml``, ``cluster pve1``).
    """

    nodes: tuple[NodeSpec, ...]
    cts: tuple[CtSpec, ...] = field(default=())
    source: str = ""

    def node(self, name: str) -> NodeSpec:
        """Return the node called ``name``; raise KeyError when there is none."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def cts_of(self, node: str) -> tuple[CtSpec, ...]:
        """Return the containers of node ``node``, in inventory order."""
        return tuple(c for c in self.cts if c.node == node)

    def narrowed(self, patterns: Iterable[str]) -> Inventory:
        """Return the inventory keeping only the CTs matching one of ``patterns`` (ids,
        names or globs: ``200``, ``20?``, ``llm-*``, ``pve2/201``); all when empty. Nodes
        stay, so host checks still run on every node that keeps a CT."""
        wanted = [p.strip() for p in patterns if p.strip()]
        if not wanted:
            return self
        keep = tuple(c for c in self.cts if any(ct_matches(c, p) for p in wanted))
        nodes = tuple(n for n in self.nodes if any(c.node == n.name for c in keep))
        return replace(self, nodes=nodes, cts=keep)


def ct_matches(ct: CtSpec, pattern: str) -> bool:
    """Return True when ``pattern`` (glob) matches the CT's id, its name, or ``node/id``."""
    names = [ct.ct, f"{ct.node}/{ct.ct}"]
    if ct.name:
        names += [ct.name, f"{ct.node}/{ct.name}"]
    return any(fnmatch.fnmatchcase(n, pattern) for n in names)


def split_patterns(values: Iterable[str]) -> tuple[str, ...]:
    """Return the ``--ct`` patterns from repeated and comma-separated values."""
    return tuple(p.strip() for v in values for p in v.split(",") if p.strip())


# -- the TOML file ------------------------------------------------------------------------


def _toml_loads(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib.loads(text)


NODE_KEYS = {"name", "ssh", "user", "flavor", "lxcpath", "known_hosts", "identity_file", "cts"}


def parse_inventory(text: str, source: str = "inventory") -> Inventory:
    """Return the Inventory described by TOML ``text``; raise InventoryError naming the
    bad node and key."""
    try:
        data = _toml_loads(text)
    except ValueError as exc:
        raise InventoryError(f"{source}: not valid TOML: {exc}") from None
    defaults = data.get("defaults", {})
    nodes_data = data.get("nodes")
    if not isinstance(defaults, dict):
        raise InventoryError(f"{source}: [defaults] must be a table")
    if not isinstance(nodes_data, list) or not nodes_data:
        raise InventoryError(f"{source}: no [[nodes]] entries")
    nodes: list[NodeSpec] = []
    cts: list[CtSpec] = []
    for index, raw in enumerate(nodes_data, 1):
        node, node_cts = _parse_node(raw, defaults, f"{source}: node #{index}")
        if any(n.name == node.name for n in nodes):
            raise InventoryError(f"{source}: node {node.name!r} is listed twice")
        nodes.append(node)
        cts += node_cts
    return Inventory(tuple(nodes), tuple(cts), source)


def _parse_node(raw: Any, defaults: dict[str, Any], where: str) -> tuple[NodeSpec, list[CtSpec]]:
    if not isinstance(raw, dict):
        raise InventoryError(f"{where}: must be a table")
    unknown = sorted(set(raw) - NODE_KEYS)
    if unknown:
        raise InventoryError(f"{where}: unknown key(s) {', '.join(unknown)}")
    merged = {**{k: v for k, v in defaults.items() if k != "cts"}, **raw}
    name = merged.get("name")
    if not isinstance(name, str) or not name:
        raise InventoryError(f"{where}: `name` is required")
    where = where.split(": ")[0] + f": node {name!r}"
    flavor = merged.get("flavor", "pve")
    if flavor not in FLAVORS:
        raise InventoryError(f"{where}: flavor {flavor!r} is not one of {', '.join(FLAVORS)}")
    ssh = merged.get("ssh") or f"{merged.get('user', 'root')}@{name}"
    ids = raw.get("cts", [])
    if not isinstance(ids, list) or not all(isinstance(c, (int, str)) for c in ids):
        raise InventoryError(f"{where}: `cts` must be a list of ids or names")
    if flavor == "pve":
        bad = [c for c in ids if not str(c).isdigit()]
        if bad:
            raise InventoryError(f"{where}: Proxmox CT ids are numbers, not {bad[0]!r}")
    node = NodeSpec(
        name=name,
        ssh=str(ssh),
        flavor=flavor,
        lxcpath=_path_or_none(merged.get("lxcpath")),
        known_hosts=_path_or_none(merged.get("known_hosts")),
        identity_file=_path_or_none(merged.get("identity_file")),
    )
    return node, [CtSpec(node=name, ct=str(c)) for c in dict.fromkeys(ids)]


def _path_or_none(value: Any) -> str | None:
    return os.path.expanduser(str(value)) if value else None


def load_inventory_file(path: str) -> Inventory:
    """Return the Inventory in the TOML file at ``path`` (``cat hosts.toml``); raise
    InventoryError when it cannot be read or is malformed."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise InventoryError(f"cannot read inventory {path}: {exc.strerror}") from None
    return parse_inventory(text, f"file {path}")


# -- which CT configs pass NVIDIA devices through -------------------------------------------


def gpu_passthrough_evidence(
    pairs: Iterable[tuple[str, str]], pattern: str = "nvidia"
) -> tuple[str, ...]:
    """Return the config lines (``key: value``) that pass a device matching ``pattern``
    (``nvidia``) into the CT: ``lxc.mount.entry`` whose source or target names it,
    ``devN`` entries with such a path, and ``lxc.cgroup2.devices.allow`` rules for the
    fixed NVIDIA major 195 (only counted with ``pattern`` ``nvidia``). Empty: no GPU."""
    found: list[str] = []
    for key, value in pairs:
        if key == "lxc.mount.entry":
            entry = parse_mount(value)
            if entry and (pattern in entry.source or pattern in entry.target):
                found.append(f"{key}: {value}")
        elif key in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow"):
            rule = parse_rule(value)
            if pattern == "nvidia" and rule is not None and rule.major == NVIDIA_MAJOR:
                found.append(f"{key}: {value}")
        else:
            dev = parse_dev(key, value)
            if dev is not None and pattern in dev.path:
                found.append(f"{key}: {value}")
    return tuple(found)
