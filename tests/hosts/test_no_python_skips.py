"""A CT without python3 (served by the POSIX-sh agent): the probe checks SKIP with the
reason, the device checks still judge (recorded H200 facts, has_python False)."""

from __future__ import annotations

from gpudoctor.context import CheckOptions
from gpudoctor.model import Status
from gpudoctor.runner import run_checks
from tests.unit.scenarios import h200_host


def test_probe_checks_skip_when_the_ct_has_no_python() -> None:
    host = h200_host()
    host.has_python = False
    report = run_checks(host, CheckOptions())
    status = {r.check_id: r.status for r in report.results}
    for check_id in ("cuda.init", "nvml.init", "driver.userspace_match"):
        assert status[check_id] == Status.SKIP, check_id
        finding = next(f for f in report.findings if f.check_id == check_id)
        assert "python3 not found in the CT" in finding.message
    for check_id in ("device.nodes", "device.open", "proc.usable", "driver.loaded"):
        assert status[check_id] == Status.PASS, check_id
    with_python = run_checks(h200_host(), CheckOptions())
    assert with_python.result("cuda.init").status == Status.PASS  # the guard is the cause
