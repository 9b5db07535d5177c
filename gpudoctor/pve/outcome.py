"""What ``gpudoctor fix`` did to one CT: :class:`FixOutcome` and its ``--json`` form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpudoctor.pve import uvm_unit
from gpudoctor.pve.apply import Target, WriteResult
from gpudoctor.pve.planner import FixPlan


@dataclass(frozen=True)
class FixOutcome:
    """What happened.

    Attributes:
        status: ``nothing_to_change``, ``nothing_to_pass`` (no NVIDIA node on the host and
            no ``--device``), ``dry_run``, ``declined``, ``applied``,
            ``applied_not_running`` (CT stopped: rules apply at its next start),
            ``not_fixed`` (applied, CT restarted, a device still fails, nothing worse),
            ``rolled_back``, ``refused``.
        exit_code: 0 ok, 3 not applied / failed / rolled back / nothing to pass,
            4 changes pending and nothing written (dry run, declined).
        message: one sentence for humans.
        target: the config's location.
        plan: the plan (None when refused before planning).
        write: the CAS write, when one happened.
        client_backup: the backup copy on this machine.
        before, after: ``{ct path: errno name}`` probes inside the CT.
        init_pids: the CT's init PID before and after the restart.
        checks: the device checks' findings inside the CT after the restart (dicts).
        host_prep: the plan of the boot unit that creates /dev/nvidia-uvm before guests
            start, when devN entries need it and it is missing (applied with the fix).
        start_log: when the restart failed, the lines of the CT's debug start log that
            say why (a hook's error, a missing node, a bad devN value).
    """

    status: str
    exit_code: int
    message: str
    target: Target | None = None
    plan: FixPlan | None = None
    write: WriteResult | None = None
    client_backup: str = ""
    before: tuple[tuple[str, str], ...] = ()
    after: tuple[tuple[str, str], ...] = ()
    init_pids: tuple[int | None, int | None] = (None, None)
    checks: tuple[dict[str, Any], ...] = ()
    host_prep: FixPlan | None = None
    start_log: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the outcome as JSON-ready data (the ``--json`` output)."""
        plan = self.plan
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "message": self.message,
            "config": self.target.config_path if self.target else None,
            "node": self.target.node if self.target else None,
            "changed": bool(plan and plan.changed),
            "restart_reasons": list(plan.restart_reasons) if plan else [],
            "host_cause": plan.host_cause if plan else "",
            "diff": plan.diff if plan else "",
            "edits": [e.__dict__ for e in plan.edits] if plan else [],
            "warnings": list(plan.warnings) if plan else [],
            "stale": list(plan.stale) if plan else [],
            "backup": {
                "host": self.write.host_backup if self.write else "",
                "client": self.client_backup,
            },
            "sha1": {
                "old": self.write.old_sha1 if self.write else None,
                "new": self.write.new_sha1 if self.write else None,
            },
            "probes": {"before": dict(self.before), "after": dict(self.after)},
            "init_pid": {"before": self.init_pids[0], "after": self.init_pids[1]},
            "checks": list(self.checks),
            "mode": plan.mode if plan else None,
            "pve_version": plan.pve_version if plan else None,
            "host_prep": _prep_dict(self.host_prep),
            "start_log": list(self.start_log),
        }


def _prep_dict(prep: FixPlan | None) -> dict[str, Any] | None:
    if prep is None:
        return None
    return {"unit": uvm_unit.UNIT_NAME, "diff": prep.diff, "explanation": list(prep.explanation)}
