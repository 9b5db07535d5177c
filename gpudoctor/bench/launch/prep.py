"""What a campaign does before its servers: ``gpudoctor check`` (preflight) and
``gpudoctor weights ensure`` (the model restored or downloaded into its directory)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudoctor.bench.launch.progress import PlainReporter
from gpudoctor.bench.launch.steps import CampaignError
from gpudoctor.bench.plan import Plan


def preflight(
    plan: Plan, arch: str, when: str, model_ready: bool, reporter: PlainReporter,
    record: Callable[[dict[str, Any]], None],
) -> None:  # fmt: skip
    """Run the check catalogue in-process (``gpudoctor check``); record the verdict with
    ``record``; raise CampaignError naming every FAIL with its remedy.

    ``model_ready=False`` leaves the model directory out of the checks (it is about to be
    restored by the weights step). ``expect_gpus`` defaults to the plan's largest tp."""
    from gpudoctor.context import CheckOptions
    from gpudoctor.hosts.local import LocalHost
    from gpudoctor.runner import run_checks

    pf = plan.preflight
    expect = (
        pf.expect_gpus if pf.expect_gpus is not None else (plan.max_tp if arch != "cpu" else None)
    )
    options = CheckOptions(
        only=pf.only,
        model_dirs=(plan.model.local_dir,) if model_ready else (),
        expect_gpus=expect,
    )
    report = run_checks(LocalHost(), options)
    record({
        "when": when, "status": report.status.value, "duration_s": round(report.duration_s, 3),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "findings": [f.to_dict() for f in report.findings if f.status.value != "PASS"],
    })  # fmt: skip
    failing = [f for f in report.findings if f.status.value == "FAIL"]
    if not failing:
        return
    lines = [
        f"{f.check_id} [{f.subject}]: {f.message}"
        + (f" -> {f.remediation}" if f.remediation else "")
        for f in failing
    ]
    for line in lines:
        reporter.note(f"preflight FAIL: {line}")
    raise CampaignError(f"preflight ({when}) failed: " + "; ".join(lines))


def ensure_weights(plan: Plan, reporter: PlainReporter) -> dict[str, Any] | None:
    """Make the plan's model directory complete when it names a Hub repo
    (``gpudoctor weights ensure REPO --to DIR --mirror MIRROR``); return what was done
    (``repo``, ``dir``, ``action``, ``source``, ``files``, ``at``; None without a repo).
    CampaignError on failure."""
    model = plan.model
    if not model.repo:
        return None
    from gpudoctor.weights.ensure import EnsureRequest, ensure
    from gpudoctor.weights.errors import WeightsError
    from gpudoctor.weights.progress import make_progress

    request = EnsureRequest(
        repo_id=model.repo,
        target=Path(str(model.dir)),
        revision=model.revision,
        mirror=Path(model.mirror) if model.mirror else None,
    )
    reporter.note(f"weights: ensuring {model.repo} in {model.dir}")
    try:
        result = ensure(request, make_progress())
    except WeightsError as exc:
        raise CampaignError(f"weights: {exc}") from exc
    reporter.note(f"weights: {result.action} ({result.source}, {result.files_total} files)")
    return {"repo": model.repo, "dir": str(model.dir), "action": str(result.action),
            "source": str(result.source), "files": result.files_total,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
