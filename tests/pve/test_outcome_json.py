"""``gpudoctor fix --json``: every field a script reads from the outcome of one CT, for an
outcome that carries everything (applied, restarted, with a host-prep plan and a start log)
and for a refusal that carries nothing but its status and message."""

from __future__ import annotations

import json

from gpudoctor.pve.apply import Target, WriteResult
from gpudoctor.pve.outcome import FixOutcome
from gpudoctor.pve.planner import Edit, FixPlan

PLAN = FixPlan(
    "arch: amd64\n",
    "arch: amd64\ndev0: /dev/nvidia0,gid=44\n",
    (Edit("add", "dev0: /dev/nvidia0,gid=44", "/dev/nvidia0 (major 195)"),),
    "--- a/config\n+++ b/config\n",
    ("add dev0",),
    ("a warning",),
    stale=("c 509:* rwm",),
    mode="devn",
    pve_version="8.2.4",
    restart_reasons=("/dev/nvidia-uvm is missing inside the CT",),
    host_cause="the cause is on the host",
)
PREP = FixPlan("", "[Unit]\n", diff="+[Unit]\n", explanation=("install the boot unit",))


def test_an_applied_fix_reports_every_field() -> None:
    outcome = FixOutcome(
        "applied", 0, "applied; CT 101 restarted",
        target=Target("pve", "101", "/etc/pve/nodes/pve1/lxc/101.conf", "/run/lock/lxc/x", "pve1"),
        plan=PLAN,
        write=WriteResult("a" * 40, "b" * 40, "/var/lib/gpudoctor/backups/101.conf.1"),
        client_backup="/root/.local/state/gpudoctor/backups/101.conf.1",
        before=(("/dev/nvidia0", "EPERM"),),
        after=(("/dev/nvidia0", "OK"),),
        init_pids=(4242, 5151),
        checks=({"check": "device.open", "status": "PASS"},),
        host_prep=PREP,
        start_log=("hook /x: File exists",),
    )  # fmt: skip
    data = outcome.to_dict()
    assert json.loads(json.dumps(data)) == data  # JSON-ready as it is
    assert data == {
        "status": "applied",
        "exit_code": 0,
        "message": "applied; CT 101 restarted",
        "config": "/etc/pve/nodes/pve1/lxc/101.conf",
        "node": "pve1",
        "changed": True,
        "restart_reasons": ["/dev/nvidia-uvm is missing inside the CT"],
        "host_cause": "the cause is on the host",
        "diff": "--- a/config\n+++ b/config\n",
        "edits": [
            {
                "action": "add",
                "line": "dev0: /dev/nvidia0,gid=44",
                "reason": "/dev/nvidia0 (major 195)",
            }
        ],
        "warnings": ["a warning"],
        "stale": ["c 509:* rwm"],
        "backup": {
            "host": "/var/lib/gpudoctor/backups/101.conf.1",
            "client": "/root/.local/state/gpudoctor/backups/101.conf.1",
        },
        "sha1": {"old": "a" * 40, "new": "b" * 40},
        "probes": {"before": {"/dev/nvidia0": "EPERM"}, "after": {"/dev/nvidia0": "OK"}},
        "init_pid": {"before": 4242, "after": 5151},
        "checks": [{"check": "device.open", "status": "PASS"}],
        "mode": "devn",
        "pve_version": "8.2.4",
        "host_prep": {
            "unit": "gpudoctor-nvidia-uvm.service",
            "diff": "+[Unit]\n",
            "explanation": ["install the boot unit"],
        },
        "start_log": ["hook /x: File exists"],
    }


def test_a_refusal_before_planning_reports_empty_fields_not_an_error() -> None:
    data = FixOutcome("refused", 3, "CT 101 does not exist").to_dict()
    assert data == {
        "status": "refused",
        "exit_code": 3,
        "message": "CT 101 does not exist",
        "config": None,
        "node": None,
        "changed": False,
        "restart_reasons": [],
        "host_cause": "",
        "diff": "",
        "edits": [],
        "warnings": [],
        "stale": [],
        "backup": {"host": "", "client": ""},
        "sha1": {"old": None, "new": None},
        "probes": {"before": {}, "after": {}},
        "init_pid": {"before": None, "after": None},
        "checks": [],
        "mode": None,
        "pve_version": None,
        "host_prep": None,
        "start_log": [],
    }


def test_a_plan_that_changes_nothing_says_so() -> None:
    same = FixPlan("arch: amd64\n", "arch: amd64\n")
    data = FixOutcome("nothing_to_change", 0, "nothing to change", plan=same).to_dict()
    assert data["changed"] is False and data["mode"] == "rules" and data["pve_version"] is None
