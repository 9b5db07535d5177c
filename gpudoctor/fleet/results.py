"""What a fleet run produces: one Outcome (state + Report) per node and per CT.

States: ``checked`` (the catalogue ran), ``stopped`` and ``not_running`` (not entered),
``unreachable`` (the node could not be reached), ``timeout`` (the target's deadline
passed), ``error`` (the node answered but its CTs could not be listed, or the check
crashed), ``missing`` (listed, but not on its node). Targets not checked get a one-finding
synthetic Report whose check id is ``fleet.reach``, ``fleet.timeout`` or ``fleet.state``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.fleet.inventory import Inventory
from gpudoctor.model import CheckResult, Finding, Report, Status

REACH, TIMEOUT, STATE = "fleet.reach", "fleet.timeout", "fleet.state"
CHECKED, STOPPED_STATE, UNREACHABLE, TIMED_OUT, FAILED, MISSING, NOT_RUNNING = (
    "checked", "stopped", "unreachable", "timeout", "error", "missing", "not_running",
)  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    """What happened to one target (a node's host checks, or one CT).

    Attributes:
        node: the node's name.
        ct: the CT id/name, or None for the node itself.
        state: ``checked``, ``stopped``, ``not_running`` (frozen, ...), ``unreachable``,
            ``timeout``, ``error``, ``missing``.
        report: the Report (labels ``node`` and ``ct``); synthetic for states other than
            ``checked``, with one finding saying why.
        started_s, finished_s: seconds since the fleet run started.
    """

    node: str
    ct: str | None
    state: str
    report: Report
    started_s: float = 0.0
    finished_s: float = 0.0

    @property
    def status(self) -> Status:
        """Return the worst status of the report."""
        return self.report.status


@dataclass(frozen=True)
class FleetResult:
    """Every outcome of a fleet run.

    Attributes:
        inventory: what was asked.
        nodes: one outcome per node (its host checks), in inventory order.
        cts: one outcome per CT, in inventory order.
        duration_s: wall time of the run in seconds.
    """

    inventory: Inventory
    nodes: tuple[Outcome, ...]
    cts: tuple[Outcome, ...]
    duration_s: float = 0.0

    def reports(self) -> list[Report]:
        """Return every report: each node's, then its CTs', node by node."""
        out: list[Report] = []
        for node in self.nodes:
            out.append(node.report)
            out += [c.report for c in self.cts if c.node == node.node]
        return out

    def cts_of(self, node: str) -> tuple[Outcome, ...]:
        """Return the outcomes of node ``node``'s CTs."""
        return tuple(c for c in self.cts if c.node == node)

    def ct(self, node: str, ct: str) -> Outcome:
        """Return the outcome of one CT; raise KeyError when it was not in the run."""
        for outcome in self.cts:
            if outcome.node == node and outcome.ct == ct:
                return outcome
        raise KeyError(f"{node}/{ct}")


def synthetic_report(target: str, labels: tuple, check_id: str, status: Status,
                     subject: str, message: str, remediation: str = "") -> Report:  # fmt: skip
    """Return a one-finding Report for a target that was not (fully) checked."""
    finding = Finding(check_id, status, subject, message, remediation=remediation)
    return Report(target, (CheckResult(check_id, (finding,)),), labels=labels)


def node_labels(node: str) -> tuple[tuple[str, str], ...]:
    """Return the report labels of a node's host checks."""
    return (("node", node),)


def ct_labels(node: str, ct: str) -> tuple[tuple[str, str], ...]:
    """Return the report labels of one CT."""
    return (("node", node), ("ct", ct))
