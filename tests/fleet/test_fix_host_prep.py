"""``fix --cluster``: a host cause found on any CT of a node is named once per node, with
its ``--host-prep`` command, in the report and in ``--json`` (issue 32 item 2)."""

from __future__ import annotations

from gpudoctor.commands.fix_cluster import report
from gpudoctor.fleet.fix import ClusterFixResult, CtFix
from gpudoctor.pve.fixer import FixOutcome
from gpudoctor.pve.planner import FixPlan

CAUSE = "the cause is on the host: /dev/nvidia-uvm ...: gpudoctor fix --host root@pve1 --host-prep"


def planned(node: str, ct: str, cause: str) -> CtFix:
    plan = FixPlan("a\n", "a\n", restart_reasons=("/dev/nvidia-uvm is a regular file",),
                   host_cause=cause)  # fmt: skip
    outcome = FixOutcome("dry_run", 4, "dry run: nothing written", plan=plan)
    return CtFix(node, ct, "dry_run", 0, outcome.message, "", outcome)


def test_the_host_cause_is_named_once_per_node() -> None:
    result = ClusterFixResult((planned("pve1", "200", CAUSE), planned("pve1", "201", CAUSE),
                               planned("pve2", "300", "")))  # fmt: skip
    assert result.host_prep == (("pve1", CAUSE),)
    assert result.to_dict()["host_prep"] == [{"node": "pve1", "why": CAUSE}]
    lines: list[str] = []
    report(result, as_json=False, dry_run=True, echo=lines.append)
    assert lines.count(f"pve1: {CAUSE}") == 1
    assert "  why: restart: /dev/nvidia-uvm is a regular file" in lines
