"""Run the GPU probe (NVML + CUDA in a child process) on a host and parse what it printed."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpudoctor import early_probe
from gpudoctor.hosts.base import CommandResult, Host

STAGES = early_probe.STAGES
NO_PYTHON = "python3 not found in the CT"


def python_missing(host: Host) -> bool:
    """Return True when the host says it has no python3 (a CT served by the POSIX-sh
    agent); the CUDA/NVML probe cannot run there."""
    return not host.has_python


@lru_cache(maxsize=1)
def probe_source() -> str:
    """Return the probe script's source (sent as ``python3 -I -S -c SOURCE`` to any host)."""
    return (Path(__file__).parent.parent / "probes" / "gpu_probe.py").read_text()


@dataclass(frozen=True)
class StageResult:
    """One probe stage's outcome.

    Attributes:
        name: ``env``, ``nvml`` or ``cuda``.
        data: what the stage printed (empty when it never finished).
        started: True when the stage began.
        finished: True when it printed its result.
    """

    name: str
    data: dict[str, Any] = field(default_factory=dict)
    started: bool = False
    finished: bool = False


@dataclass(frozen=True)
class GpuProbe:
    """The parsed output of one probe run.

    Attributes:
        stages: {stage name: StageResult}.
        timed_out: True when the probe was killed at its timeout.
        returncode: the child's exit status.
        stderr: the child's stderr (tail).
        duration_s: wall time of the child in seconds.
        timeout_s: the timeout it ran under.
    """

    stages: dict[str, StageResult]
    timed_out: bool = False
    returncode: int = 0
    stderr: str = ""
    duration_s: float = 0.0
    timeout_s: float = 0.0

    def stage(self, name: str) -> StageResult:
        """Return a stage's result (an empty, not-started one when absent)."""
        return self.stages.get(name, StageResult(name))

    def ran_as(self) -> str:
        """Return how the probe ran, in words: ``as uid 65534 (nobody) with groups 0,195
        (root dropped ...)``, ``as root (...)`` or ``as uid N``; "" when it did not say."""
        data = self.stage("privilege").data
        if not data:
            return ""
        groups = ",".join(str(g) for g in data.get("groups", [])) or "none"
        if data.get("dropped"):
            return (
                f"the CUDA/NVML probe ran as uid {data.get('uid')} (nobody) with groups {groups}: "
                "root dropped before the driver library loaded, so it cannot rewrite device nodes"
            )
        if data.get("uid") == 0:
            return (
                f"the CUDA/NVML probe ran as root (dropping to nobody failed: "
                f"{data.get('error', '?')}): the driver library may rewrite device nodes"
            )
        return f"the CUDA/NVML probe ran as uid {data.get('uid')} with groups {groups}"

    def hung_in(self) -> str | None:
        """Return the stage that was running when the probe was killed, or None."""
        if not self.timed_out:
            return None
        return next((s.name for s in self.stages.values() if s.started and not s.finished), None)


def parse_probe_output(stdout: str) -> dict[str, StageResult]:
    """Return the stages found in the probe's JSON-lines stdout (bad lines ignored)."""
    stages: dict[str, StageResult] = {}
    for line in stdout.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict) or "stage" not in obj:
            continue
        name = str(obj.pop("stage"))
        if obj.get("started") is True and len(obj) == 1:
            stages[name] = StageResult(name, started=True)
        else:
            stages[name] = StageResult(name, obj, started=True, finished=True)
    return stages


def run_gpu_probe(host: Host, timeout_s: float) -> GpuProbe:
    """Run the probe on ``host`` in a child interpreter; return what it found.

    Equivalent: ``python3 -I -S gpudoctor/probes/gpu_probe.py`` (with ``timeout``).
    """
    if python_missing(host):
        return GpuProbe(stages={}, returncode=127, stderr=NO_PYTHON, timeout_s=timeout_s)
    argv = [host.python, "-I", "-S", "-c", probe_source(), *early_probe.probe_stages()]
    early = adopt_early_probe(host, argv, timeout_s)
    result = early if early is not None else host.run(argv, timeout=timeout_s)
    return GpuProbe(
        stages=parse_probe_output(result.stdout),
        timed_out=result.timed_out,
        returncode=result.returncode,
        stderr=result.stderr[-2000:],
        duration_s=result.duration_s,
        timeout_s=timeout_s,
    )


def adopt_early_probe(host: Host, argv: list[str], timeout_s: float) -> CommandResult | None:
    """Return the result of the probe child that :mod:`gpudoctor.early_probe` started at
    process start when it runs exactly ``argv`` on this machine (a LocalHost); else None."""
    from gpudoctor.hosts.local import LocalHost

    if not isinstance(host, LocalHost):
        return None
    outcome = early_probe.adopt(argv, timeout_s)
    return None if outcome is None else CommandResult(argv=tuple(argv), **outcome)
