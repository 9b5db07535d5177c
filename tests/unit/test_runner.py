"""The runner and the registry: ordering, SKIP reasons, timeouts, exceptions, validation."""

from __future__ import annotations

import sys
import textwrap
import threading
import time

import pytest

from gpudoctor.context import CheckOptions
from gpudoctor.model import Severity, Status
from gpudoctor.registry import CatalogueError, CheckSpec, check, load_catalogue, validate
from gpudoctor.runner import run_checks, select
from tests.fakes.recorded_host import RecordedHost


def spec(id: str, func=None, **kw) -> CheckSpec:
    meta = dict(title=f"{id} is fine", severity=Severity.HIGH, proves="x", remediation="y")
    meta.update(kw)
    return check(id=id, **meta)(func or (lambda ctx: [ctx.passed("s", "ok")]))


def test_dependencies_run_first_and_unhealthy_requirements_skip():
    order: list[str] = []

    def record(name, status=Status.PASS):
        def fn(ctx):
            order.append(name)
            return [ctx.finding(status, "s", name)]

        return fn

    specs = validate(
        [
            spec("b.two", record("b.two"), requires=("a.one",)),
            spec("a.one", record("a.one", Status.FAIL)),
            spec("c.three", record("c.three"), after=("b.two",)),
        ]
    )
    report = run_checks(RecordedHost(), CheckOptions(), specs=specs)
    assert order == ["a.one", "c.three"]
    assert report.result("b.two").findings[0].status == Status.SKIP  # type: ignore[union-attr]
    assert report.result("b.two").findings[0].message == "not run: a.one FAIL"  # type: ignore[union-attr]
    assert report.result("c.three").status == Status.PASS  # type: ignore[union-attr]


def test_a_raising_check_becomes_error_with_traceback_only_in_debug():
    def boom(ctx):
        raise RuntimeError("kaput")

    report = run_checks(
        RecordedHost(), CheckOptions(), specs=validate([spec("x.boom", boom), spec("y.ok")])
    )
    err = report.result("x.boom").findings[0]  # type: ignore[union-attr]
    assert err.status == Status.ERROR
    assert "RuntimeError: kaput" in err.message
    assert "Traceback" in err.debug and "Traceback" not in err.message
    assert report.result("y.ok").status == Status.PASS  # type: ignore[union-attr]


def test_a_hanging_check_times_out_without_blocking_the_others():
    release = threading.Event()

    def hang(ctx):
        release.wait(30)
        return []

    started = time.monotonic()
    report = run_checks(
        RecordedHost(),
        CheckOptions(timeout_s=0.3),
        specs=validate([spec("x.hang", hang), spec("y.ok")]),
    )
    release.set()
    assert report.result("x.hang").findings[0].status == Status.ERROR  # type: ignore[union-attr]
    assert "did not finish within 0.3 s" in report.result("x.hang").findings[0].message  # type: ignore[union-attr]
    assert report.result("y.ok").status == Status.PASS  # type: ignore[union-attr]
    assert time.monotonic() - started < 25  # bounded by the timeout, not by the hang


def test_select_adds_requirements_and_rejects_unknown_ids():
    specs = load_catalogue()
    chosen = [s.id for s in select(specs, ["cuda.init"], with_ct_host=False)]
    assert "driver.loaded" in chosen and "cuda.init" in chosen and "gpu.health" not in chosen
    assert {s.id for s in select(specs, ["device"], False)} >= {"device.nodes", "device.open"}
    with pytest.raises(ValueError, match="unknown check id or family: nope"):
        select(specs, ["nope"], False)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (lambda: [spec("Bad Id")], "must look like"),
        (lambda: [spec("a.b"), spec("a.b")], "already defined"),
        (lambda: [spec("a.b", title="Check that a is b")], "healthy condition"),
        (lambda: [spec("a.b", remediation=" ")], "remediation is required"),
        (lambda: [spec("a.b", requires=("z.z",))], "unknown check"),
        (lambda: [spec("a.b", requires=("c.d",)), spec("c.d", after=("a.b",))], "cycle"),
    ],
)
def test_metadata_is_validated_at_load(bad, message):
    with pytest.raises(CatalogueError, match=message):
        validate(bad())


def test_shipped_catalogue_is_valid_and_ordered():
    specs = load_catalogue(include_plugins=False)
    ids = [s.id for s in specs]
    assert len(ids) == len(set(ids))
    for s in specs:
        for dep in s.requires + s.after:
            assert ids.index(dep) < ids.index(s.id)


def test_third_party_checks_load_through_the_entry_point_group(tmp_path, monkeypatch):
    """A real installed distribution (dist-info on sys.path) registering gpudoctor.checks."""
    pkg = tmp_path / "acme_checks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent("""
        from gpudoctor.model import Severity
        from gpudoctor.registry import check

        @check(id="acme.fan", title="The ACME fan spins", severity=Severity.WARNING,
               proves="the fan spins", remediation="Replace the fan.")
        def acme_fan(ctx):
            yield ctx.passed("fan", "spinning")
    """)
    )
    dist = tmp_path / "acme_checks-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-checks\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[gpudoctor.checks]\nacme = acme_checks\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("acme_checks", None)
    ids = [s.id for s in load_catalogue()]
    assert "acme.fan" in ids


def test_a_skipped_requirement_skips_its_dependents_without_running_them():
    ran: list[str] = []

    def dependent(ctx):
        ran.append("b.two")
        return []  # would be "nothing to report" PASS if it ran

    specs = validate(
        [
            spec("a.one", lambda ctx: [ctx.skip("s", "not applicable here")]),
            spec("b.two", dependent, requires=("a.one",)),
        ]
    )
    report = run_checks(RecordedHost(), CheckOptions(), specs=specs)
    assert ran == []
    skipped = report.result("b.two").findings  # type: ignore[union-attr]
    assert [(f.status, f.message) for f in skipped] == [(Status.SKIP, "not run: a.one SKIP")]
    assert not Status.SKIP.healthy and Status.WARN.healthy and Status.PASS.healthy
