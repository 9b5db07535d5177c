"""What a campaign does before its servers: the engine's flags checked against its
``--help`` (with its version, the GPU arch and the quirks), the GPU pool, ``gpudoctor
check`` (preflight) and ``gpudoctor weights ensure`` (the model restored or downloaded
into its directory). The dry run does the same first steps."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.bench.engines import Engine
from gpudoctor.bench.launch.progress import PlainReporter
from gpudoctor.bench.launch.slots import GpuPool, cap_gpus, discover_gpus, read_topology
from gpudoctor.bench.launch.steps import CampaignError, validate_flags
from gpudoctor.bench.plan import Plan
from gpudoctor.bench.plan import quirks as quirks_mod


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


@dataclass(frozen=True)
class Preflight:
    """``gpudoctor check`` before the campaign and before each configuration's server
    (``enabled`` False: ``--no-preflight``); each verdict goes to ``record``."""

    plan: Plan
    arch: str
    enabled: bool
    reporter: PlainReporter
    record: Callable[[dict[str, Any]], None]

    def __call__(self, when: str, model_ready: bool = True) -> None:
        """Run the preflight ``when`` (``campaign``, ``config LABEL``); raise CampaignError
        on a FAIL (see :func:`preflight`)."""
        if self.enabled and self.plan.preflight.enabled:
            preflight(self.plan, self.arch, when, model_ready, self.reporter, self.record)


@dataclass(frozen=True)
class Inspection:
    """What the launch learnt before anything runs: the engine's ``--help`` text and
    version, the GPU architecture, the quirks table."""

    help_text: str
    version: str | None
    arch: str
    quirks: list[quirks_mod.Quirk]


def inspect_engine(plan: Plan, engine: Engine, help_cache: Path | None,
                   quirks_path: Path) -> Inspection:  # fmt: skip
    """Validate every flag against the engine's ``--help`` (it runs), learn its version,
    the GPU architecture and the quirks; return them. CampaignError on a bad flag, an
    engine not installed or an unreadable quirks table. A plan's running server
    (``engine.server_url``) has no flags to check and no install to ask: its version is
    ``engine.version`` when the plan gives one."""
    if plan.engine.server_url:
        help_text, version = "", plan.engine.version
    else:
        help_text = validate_flags(plan, engine, help_cache)
        version = engine.version()
    arch = quirks_mod.detect_arch()
    try:
        quirk_list = quirks_mod.load_quirks(quirks_path)
    except quirks_mod.QuirksError as exc:
        raise CampaignError(str(exc)) from exc
    return Inspection(help_text, version, arch, quirk_list)


def gpu_pool(plan: Plan) -> tuple[GpuPool | None, str | None]:
    """Return the pool of the host's GPUs (NVML, or ``$GPUDOCTOR_FAKE_GPUS``) capped by the
    plan's ``[hardware]``, and where they were learnt; (None, None) without a GPU (one
    server at a time). CampaignError when ``[hardware]`` asks for GPUs that are not there.
    A plan's running server (``engine.server_url``) is placed by nobody: (None, None)."""
    if plan.engine.server_url:
        return None, None
    gpus, source = discover_gpus()
    hw = plan.hardware
    if not gpus:
        if hw.gpus is not None or hw.count is not None:
            raise CampaignError("[hardware] gpus is set, but no GPU was found (NVML)")
        return None, None
    try:
        gpus = cap_gpus(gpus, hw.gpus, hw.count)
    except ValueError as exc:
        raise CampaignError(f"{plan.source}: {exc}") from exc
    return GpuPool(gpus, read_topology()), source
