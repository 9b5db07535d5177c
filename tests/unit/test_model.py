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
