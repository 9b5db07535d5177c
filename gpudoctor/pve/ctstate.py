"""The running CT's state against what its config and the host give it NOW.

A CT's devices are fixed when it starts: the bind mounts of nodes that existed then, the
cgroup device rules of its config as it was then. So a CT whose config is right can still
be broken until it restarts:

* the host had no ``/dev/nvidia-uvm`` when the CT started (nvidia-uvm loads on the first
  CUDA use, after the CTs autostart): ``bind,optional,create=file`` left an empty regular
  file where the node belongs, or no node at all;
* the node inside has numbers the host's node no longer has (made for an earlier load);
* the config was fixed but the CT never restarted (``--no-restart``, a fix interrupted
  during its restart): open() still gives EPERM though the config allows the node.

:func:`restart_reasons` reads that through the CT's agent (``stat`` and ``exec 3<>`` of
each node inside, nothing installed) and says, per node, why a restart cures it.
:data:`BASIC_DEVICES` are the nodes every CT needs; the fixer opens them before and after
its change so that a new allow list that denies them is rolled back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpudoctor.facts.nodes import a_kind
from gpudoctor.hosts.base import Host
from gpudoctor.pve import uvm_unit
from gpudoctor.pve.apply import Layout

BASIC_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/tty")
"""What every CT opens (shells redirect to /dev/null; ``exec 3<>/dev/tty`` gives ENXIO
without a controlling terminal, EPERM when the device policy denies it)."""

HOST_MADE = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-caps")
"""Nodes the host makes only when nvidia-uvm/caps is used (``nvidia-modprobe -u -c=0``), so
they are often missing when CTs autostart."""


@dataclass(frozen=True)
class StateGap:
    """One node the running CT has otherwise than its config and the host give it now.

    Attributes:
        path: the node's path inside the CT.
        kind: ``missing``, ``placeholder``, ``stale`` (other numbers) or ``rules_older``
            (EPERM although the config allows the node now).
        reason: the sentence the plan shows (why a restart cures it).
    """

    path: str
    kind: str
    reason: str

    @property
    def host_was_missing(self) -> bool:
        """Return True when the gap says the host lacked the node when the CT started."""
        return self.kind in ("missing", "placeholder")


def restart_reasons(ct_host: Host, nodes: Iterable[tuple[str, int, int]]) -> tuple[StateGap, ...]:
    """Return one gap per node inside the CT that a restart would cure: a placeholder file
    where the host's char node ``major:minor`` belongs, a missing node, a node with other
    numbers, or an EPERM on a node the config allows now (``stat PATH; exec 3<>PATH``
    inside). Empty when the CT has every node as the host gives it now; raises HostError
    when the CT cannot be entered."""
    gaps = []
    for path, major, minor in nodes:
        want = f"{major}:{minor}"
        try:
            st = ct_host.stat(path)
        except FileNotFoundError:
            gaps.append(StateGap(path, "missing",
                f"{path} does not exist inside the CT, the host's is char {want} now: it was "
                "missing on the host (or not passed yet) when the CT started"))  # fmt: skip
            continue
        if st.kind != "char":
            gaps.append(StateGap(path, "placeholder",
                f"{path} is {a_kind(st.kind)} inside the CT (mode {st.mode & 0o7777:04o}), a "
                f"placeholder where the host's char {want} belongs: the host's node was "
                "missing when the CT started, and the bind mount's create= made this instead"))  # fmt: skip
        elif (st.major, st.minor) != (major, minor):
            gaps.append(StateGap(path, "stale",
                f"{path} is char {st.major}:{st.minor} inside the CT, the host's is {want} "
                "now: the CT's node was made for an earlier driver load"))  # fmt: skip
        elif ct_host.try_open(path, write=True).errname == "EPERM":
            gaps.append(StateGap(path, "rules_older",
                f"open({path}) gives EPERM inside the CT although its config allows {want} "
                "now: the running CT's device rules are older than its config (a fix not "
                "restarted, or interrupted)"))  # fmt: skip
    return tuple(gaps)


def host_made(paths: Iterable[str]) -> list[str]:
    """Return the paths among ``paths`` that the host makes only on nvidia-uvm/caps use."""
    return [p for p in paths if p.startswith(HOST_MADE)]


def host_cause(host: Host, layout: Layout, missing: Iterable[str], host_label: str) -> str:
    """Return the host-side cause and its durable cure when nodes the host makes only on
    first use (nvidia-uvm, nvidia-caps) were missing at the CT's start and the boot unit
    of ``--host-prep`` is not installed (``systemctl cat gpudoctor-nvidia-uvm.service``);
    "" otherwise."""
    late = host_made(missing)
    if not late:
        return ""
    prep = uvm_unit.plan_host_prep(host, uvm_unit.systemd_root(), layout).plan
    if not prep.explanation:
        return ""
    return (
        f"the cause is on the host: {', '.join(late)} did not exist there when the CT started "
        "(nvidia-uvm loads on the first CUDA use, after CTs autostart); the durable cure is "
        f"the boot unit that makes them before guests start: gpudoctor fix --host "
        f"{host_label} --host-prep"
    )
