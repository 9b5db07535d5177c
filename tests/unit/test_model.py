"""The result model's edges: an empty set of findings, a check that did not run."""

from __future__ import annotations

from gpudoctor.model import CheckResult, Finding, Report, Status, worst


def test_worst_of_nothing_is_pass_and_of_some_the_highest_rank() -> None:
    assert worst([]) is Status.PASS
    assert CheckResult("a.b", ()).status is Status.PASS
    assert Report("local", ()).status is Status.PASS
    assert worst([Status.SKIP, Status.ERROR, Status.WARN]) is Status.ERROR
    assert worst(iter([Status.SKIP])) is Status.SKIP


def test_result_of_a_check_that_did_not_run_is_none() -> None:
    found = CheckResult("a.b", (Finding("a.b", Status.WARN, "s", "m"),))
    report = Report("local", (found,))
    assert report.result("a.b") is found
    assert report.result("c.d") is None


def test_a_finding_as_json_has_every_field_of_the_schema() -> None:
    finding = Finding(
        "device.open",
        Status.FAIL,
        "/dev/nvidia-uvm",
        "open failed",
        evidence=("stat: char 511:0", "errno EPERM"),
        remediation="lxc.cgroup2.devices.allow: c 511:* rwm",
        fix_hint="gpudoctor fix --ct 200",
        caused_by=("device.nodes",),
        debug="Traceback ...",
    )
    assert finding.to_dict() == {
        "check": "device.open",
        "status": "FAIL",
        "subject": "/dev/nvidia-uvm",
        "message": "open failed",
        "evidence": ["stat: char 511:0", "errno EPERM"],
        "remediation": "lxc.cgroup2.devices.allow: c 511:* rwm",
        "fix_hint": "gpudoctor fix --ct 200",
        "caused_by": ["device.nodes"],
        "debug": "Traceback ...",
    }
    assert Finding("a.b", Status.PASS, "s", "m").to_dict()["evidence"] == []
