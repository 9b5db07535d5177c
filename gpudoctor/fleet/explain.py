"""Attribute CT findings to a finding on their node: fix the host once, not N containers.

Containers share their node's kernel module and device nodes, so a host problem shows up
again in every CT: "nvidia-uvm missing on node pve3 -> 6 CTs fail". A CT finding (FAIL or
ERROR) is explained by a host finding (FAIL or ERROR) on the same node when

* it is the same check about the same subject (``device.nodes`` on ``/dev/nvidia-uvm``), or
* the host check is one of :data:`CASCADE`'s causes and the CT check one of its effects
  (no NVIDIA module on the host -> no NVML, no CUDA in any of its CTs), or
* the node could not be reached at all (its CTs were not reached either).

A CT that fails on its own (its config lacks the major: ``device.open`` EPERM while the host
opens the node) is never explained away: the host has no failing finding about it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.fleet.results import FleetResult
from gpudoctor.model import Finding, Status

BAD = (Status.FAIL, Status.ERROR)
_DRIVER_EFFECTS = frozenset(
    {"driver.loaded", "driver.userspace_match", "nvml.init", "cuda.init", "gpu.health",
     "gpu.count", "nccl.p2p", "nccl.allreduce"}
)  # fmt: skip
# host check id -> CT check ids it explains whatever their subject.
CASCADE: dict[str, frozenset[str]] = {
    "driver.loaded": _DRIVER_EFFECTS,
    "driver.userspace_match": frozenset({"driver.userspace_match", "nvml.init", "cuda.init"}),
    "device.nodes": frozenset({"nvml.init", "cuda.init"}),
    "nvml.init": frozenset({"nvml.init", "gpu.health", "gpu.count"}),
    "cuda.init": frozenset({"cuda.init", "nccl.p2p", "nccl.allreduce"}),
    "fleet.reach": frozenset({"fleet.reach"}),
    "fleet.timeout": frozenset({"fleet.reach"}),
}


@dataclass(frozen=True)
class Explanation:
    """One host finding and the CT findings it explains.

    Attributes:
        node: the node's name.
        cause: the host's finding.
        cts: the CTs with at least one finding explained, in fleet order.
        effects: ``(ct, check id, subject)`` of every explained CT finding.
    """

    node: str
    cause: Finding
    cts: tuple[str, ...]
    effects: tuple[tuple[str, str, str], ...]

    @property
    def headline(self) -> str:
        """Return one line: ``<what> on node <n> -> <k> CT(s) fail (<checks>)``."""
        checks = ", ".join(dict.fromkeys(check for _, check, _ in self.effects))
        what = _what(self.cause)
        plural = "CT fails" if len(self.cts) == 1 else "CTs fail"
        return f"{what} on node {self.node} -> {len(self.cts)} {plural} ({checks})"

    def to_dict(self) -> dict[str, object]:
        """Return the explanation as JSON-ready data."""
        return {
            "node": self.node,
            "headline": self.headline,
            "cause": self.cause.to_dict(),
            "cts": list(self.cts),
            "effects": [{"ct": c, "check": k, "subject": s} for c, k, s in self.effects],
        }


def _what(f: Finding) -> str:
    subject = "" if f.subject in ("", "check", "node") else f"{f.subject}: "
    return f"{subject}{f.check_id} {f.status.value}"


def explains(cause: Finding, effect: Finding) -> bool:
    """Return True when host finding ``cause`` accounts for CT finding ``effect``."""
    if cause.status not in BAD or effect.status not in BAD:
        return False
    if cause.check_id == effect.check_id and cause.subject == effect.subject:
        return True
    return effect.check_id in CASCADE.get(cause.check_id, frozenset())


def explain(result: FleetResult) -> tuple[Explanation, ...]:
    """Return, per node, each failing host finding that explains findings of its CTs
    (host findings explaining nothing are left out: they show in the node's own report)."""
    out: list[Explanation] = []
    for node in result.nodes:
        causes = [f for f in node.report.findings if f.status in BAD]
        for cause in causes:
            effects = tuple(
                (ct.ct or "", f.check_id, f.subject)
                for ct in result.cts_of(node.node)
                for f in ct.report.findings
                if explains(cause, f)
            )
            if effects:
                cts = tuple(dict.fromkeys(c for c, _, _ in effects))
                out.append(Explanation(node.node, cause, cts, effects))
    return tuple(out)


def explained_keys(explanations: tuple[Explanation, ...]) -> set[tuple[str, str, str, str]]:
    """Return ``(node, ct, check id, subject)`` of every explained CT finding."""
    return {(e.node, ct, check, subject) for e in explanations for ct, check, subject in e.effects}
