"""The result model shared by every part of gpudoctor: statuses, severities, findings.

All result types are frozen dataclasses so that a finding, once made, cannot be
changed by whoever reports it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Status(str, enum.Enum):
    """The verdict of one finding, ordered from best to worst by :attr:`rank`."""

    PASS = "PASS"
    SKIP = "SKIP"
    WARN = "WARN"
    FAIL = "FAIL"
    ERROR = "ERROR"

    @property
    def rank(self) -> int:
        """Return how bad the status is (0 = PASS ... 4 = ERROR), for picking the worst."""
        return _RANK[self]

    @property
    def healthy(self) -> bool:
        """Return True for statuses that let dependent checks run (PASS and WARN)."""
        return self in (Status.PASS, Status.WARN)


_RANK = {Status.PASS: 0, Status.SKIP: 1, Status.WARN: 2, Status.FAIL: 3, Status.ERROR: 4}


class Severity(str, enum.Enum):
    """How much a failing check matters: CRITICAL breaks CUDA, WARNING degrades it."""

    CRITICAL = "critical"
    HIGH = "high"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One verdict of one check about one subject.

    Attributes:
        check_id: the id of the check that made it (``device.open``).
        status: PASS/WARN/FAIL/SKIP/ERROR.
        subject: what the verdict is about (``/dev/nvidia-uvm``, ``GPU 0``, ``host``).
        message: one or two plain sentences: what is wrong (or right) and why.
        evidence: the raw facts that prove it, one per line (``stat: char 511:0 mode 0666``).
        remediation: the exact remedy (a config line, a command); empty when healthy.
        fix_hint: the gpudoctor command that applies the remedy, when one exists.
        caused_by: ids of upstream checks this finding is attributed to.
        debug: machine-only detail (a traceback): in ``--json``, never in human output.
    """

    check_id: str
    status: Status
    subject: str
    message: str
    evidence: tuple[str, ...] = ()
    remediation: str = ""
    fix_hint: str = ""
    caused_by: tuple[str, ...] = ()
    debug: str = ""

    def to_dict(self) -> dict[str, object]:
        """Return the finding as a JSON-ready dict (the ``findings[]`` items of the schema)."""
        return {
            "check": self.check_id,
            "status": self.status.value,
            "subject": self.subject,
            "message": self.message,
            "evidence": list(self.evidence),
            "remediation": self.remediation,
            "fix_hint": self.fix_hint,
            "caused_by": list(self.caused_by),
            "debug": self.debug,
        }


@dataclass(frozen=True)
class CheckResult:
    """Everything one check produced in one run.

    Attributes:
        check_id: the check's id.
        findings: its findings (at least one: a check that finds nothing says PASS).
        duration_s: wall time of the check in seconds.
    """

    check_id: str
    findings: tuple[Finding, ...]
    duration_s: float = 0.0

    @property
    def status(self) -> Status:
        """Return the worst status among the findings (PASS when there are none)."""
        return worst(f.status for f in self.findings)


@dataclass(frozen=True)
class Report:
    """The outcome of one ``gpudoctor check`` run on one target.

    Attributes:
        target: where the checks ran (``local``, ``root@pve1:ct/200``).
        results: one :class:`CheckResult` per check, in catalogue order.
        duration_s: wall time of the whole run in seconds.
        labels: extra labels for machine output (``node``, ``ct``) in fleet runs.
    """

    target: str
    results: tuple[CheckResult, ...]
    duration_s: float = 0.0
    labels: tuple[tuple[str, str], ...] = field(default=())

    @property
    def findings(self) -> tuple[Finding, ...]:
        """Return every finding of every check, in order."""
        return tuple(f for r in self.results for f in r.findings)

    @property
    def status(self) -> Status:
        """Return the worst status of the whole report."""
        return worst(f.status for f in self.findings)

    def result(self, check_id: str) -> CheckResult | None:
        """Return the result of one check by id, or None when it did not run."""
        return next((r for r in self.results if r.check_id == check_id), None)


def worst(statuses: object) -> Status:
    """Return the worst of an iterable of statuses (PASS for an empty one)."""
    return max(statuses, key=lambda s: s.rank, default=Status.PASS)  # type: ignore[arg-type]
