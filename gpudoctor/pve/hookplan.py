"""What to do about hooks that mknod GPU nodes with fixed numbers (issue 21.2). Pure.

The cure (planned by :func:`plan_hooks`, applied by the planner): the hook LINE in the CT
config is commented out (the hook FILE is never edited: other CTs may run it) and the
nodes it made are passed the durable way instead, devN entries on Proxmox VE >= 8.1
(Proxmox re-reads the node's numbers at every start), bind mounts of the host's nodes
plus allow rules for their current majors elsewhere. Keeping the hook beside a bind
mount does not work: the hook's mknod meets the mounted node and fails with "File
exists", and LXC aborts the start ("Failed to run autodev hooks").
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.facts.nodes import driver_name_for_major, family_major, family_of
from gpudoctor.pve.facts import HostFacts, HostNode
from gpudoctor.pve.hooks import Hook, Mknod, is_gpu_path


@dataclass(frozen=True)
class MknodVerdict:
    """One hook mknod compared with the host.

    Attributes:
        hook: the hook it is in.
        mknod: the command.
        current: the host's numbers for that node now (``(238, 0)``), None when unknown.
        source: where ``current`` comes from (``stat /dev/nvidia-uvm``, ``/proc/devices``).
        driver: the /proc/devices name of the current major (``nvidia-uvm``).
    """

    hook: Hook
    mknod: Mknod
    current: tuple[int, int] | None
    source: str
    driver: str

    @property
    def stale(self) -> bool:
        """Return True when the hook writes other numbers than the host's node has now."""
        return self.current is not None and self.current != (self.mknod.major, self.mknod.minor)

    def describe(self) -> str:
        """Return ``FILE:LINE `mknod ...` makes /dev/X M:N, the host's is ...``."""
        m = self.mknod
        head = f"{self.hook.where}:{m.line_no} `{m.text}` makes {m.path} {m.major}:{m.minor}"
        if self.current is None:
            return f"{head}; the host has no such node and /proc/devices no major for it"
        now = f"{self.current[0]}:{self.current[1]}"
        if self.stale:
            return f"{head}, but the host's is {now} now ({self.driver}, {self.source}): stale"
        return f"{head}, as the host's now ({self.driver}); a fixed major breaks when it moves"


@dataclass(frozen=True)
class HookCure:
    """The hook part of a plan.

    Attributes:
        comment_out: ``(config line index, reason)`` of the hook lines to comment out.
        nodes: the host nodes those hooks made, to be passed the durable way instead.
        verdicts: every GPU mknod found, compared with the host.
        warnings: hooks that could not be read, nodes the host lacks.
    """

    comment_out: tuple[tuple[int, str], ...] = ()
    nodes: tuple[HostNode, ...] = ()
    verdicts: tuple[MknodVerdict, ...] = ()
    warnings: tuple[str, ...] = ()


def judge(facts: HostFacts, hook: Hook, mknod: Mknod) -> MknodVerdict:
    """Return the mknod compared with the host's node now (``stat PATH``), else with the
    major /proc/devices gives its NVIDIA family."""
    node = facts.node(mknod.path)
    if node is not None and node.kind in ("char", "block"):
        name = driver_name_for_major(facts.devices, node.major)
        return MknodVerdict(hook, mknod, (node.major, node.minor), f"stat {mknod.path}", name)
    family = family_of(mknod.path)
    major = family_major(facts.devices, family) if family is not None else None
    if major is None:
        return MknodVerdict(hook, mknod, None, "", "")
    name = driver_name_for_major(facts.devices, major)
    return MknodVerdict(hook, mknod, (major, mknod.minor), "/proc/devices", name)


def gpu_verdicts(facts: HostFacts, devices: tuple[str, ...] = ()) -> list[MknodVerdict]:
    """Return a verdict per hook mknod of an NVIDIA node (or a ``--device`` path)."""
    return [
        judge(facts, hook, m)
        for hook in facts.hooks
        for m in hook.mknods
        if is_gpu_path(m.path, devices)
    ]


def plan_hooks(facts: HostFacts, devices: tuple[str, ...], devn: bool, pve: bool) -> HookCure:
    """Return the hook lines to comment out and the nodes to pass instead (``devn``: the
    plan passes nodes as devN entries; ``pve``: ``#`` lines are the CT's description)."""
    verdicts = gpu_verdicts(facts, devices)
    warnings = [f"{h.key}: {h.error}: its mknods are not known" for h in facts.hooks if h.error]
    how = "devN entries (Proxmox re-reads their numbers at every start)" if devn else (
        "bind mounts of the host's nodes and rules for their current majors")  # fmt: skip
    comment: dict[int, list[MknodVerdict]] = {}
    nodes: list[HostNode] = []
    for verdict in verdicts:
        comment.setdefault(verdict.hook.index, []).append(verdict)
        node = facts.node(verdict.mknod.path)
        if node is None or not node.exists:
            warnings.append(f"{verdict.mknod.path} (made by {verdict.hook.where}) does not "
                            "exist on the host: not passed")  # fmt: skip
        elif node not in nodes:
            nodes.append(node)
    out = []
    for index, found in comment.items():
        hook = found[0].hook
        reason = "; ".join(v.describe() for v in found)
        reason += f". {how} pass the host's nodes instead; the hook file is not changed"
        if hook.commands:
            reason += f" (its {hook.commands} other command line(s) stop running too: check them)"
        if pve:
            reason += "; Proxmox keeps the `#` line as part of the CT's description"
        out.append((index, reason))
    return HookCure(tuple(out), tuple(nodes), tuple(verdicts), tuple(warnings))
