"""A recorded multi-GPU machine for the multi-GPU checks' tests.

:class:`MultiGpuHost` stands for a host (or container) with several NVIDIA GPUs, which this
CPU-only CI machine cannot have. Its files, device nodes and GPU probe output are recorded
(the lent H200's captures, widened to N GPUs); the P2P probe is either answered from a
recorded output (``tests/data/multigpu/*.jsonl``) or REALLY run here, as a child process,
against the fake driver ``tests/unit/fake_libcuda.c`` (``p2p_live=True``); the all-reduce
probe is answered from recorded outputs, one per call, in order.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.context import CheckOptions
from gpudoctor.facts.multigpu import probe_source
from gpudoctor.hosts.base import CommandResult, FileStat
from gpudoctor.hosts.local import run_local
from gpudoctor.model import Finding, Report, Status
from gpudoctor.runner import run_checks
from tests.fakes.recorded_host import RecordedHost
from tests.unit.scenarios import h200_host

IDS = ("gpu.count", "nccl.p2p", "nccl.allreduce")
DATA = Path(__file__).resolve().parents[1] / "data" / "multigpu"
FAKE_SOURCE = Path(__file__).with_name("fake_libcuda.c")


def recorded(name: str) -> str:
    """Return the text of a recorded probe output under tests/data/multigpu."""
    return (DATA / name).read_text()


def build_fake_libcuda(directory: Path) -> Path:
    """Compile fake_libcuda.c into ``directory/libcuda.so.1`` and ``libnvidia-ml.so.1``;
    return the directory (put it on LD_LIBRARY_PATH)."""
    for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O1", "-o", str(directory / name), str(FAKE_SOURCE)],
            check=True,
            capture_output=True,
        )
    return directory


@dataclass
class MultiGpuHost(RecordedHost):
    """A RecordedHost with N GPUs whose P2P / all-reduce probes are recorded or run for real.

    Attributes:
        p2p_stdout: the recorded P2P probe output (used unless ``p2p_live``).
        p2p_live: run the real P2P probe here (against the fake libcuda on LD_LIBRARY_PATH).
        p2p_killed: answer as if the recorded probe was killed at its timeout (a hung copy).
        allreduce_stdouts: recorded all-reduce launcher outputs, one consumed per call.
        calls: the probes run, in order (``p2p``, ``allreduce``).
        argvs: their argv (without the probe source).
    """

    p2p_stdout: str = ""
    p2p_live: bool = False
    p2p_killed: bool = False
    allreduce_stdouts: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    argvs: list[list[str]] = field(default_factory=list)

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        if probe_source("p2p_probe") in argv:
            self.calls.append("p2p")
            self.argvs.append([a for a in argv if a != probe_source("p2p_probe")])
            if self.p2p_live:
                return run_local(argv, timeout, input)
            if self.p2p_killed:
                return CommandResult(tuple(argv), -9, self.p2p_stdout, "", True, timeout)
            return CommandResult(tuple(argv), 0, self.p2p_stdout, "", False, 1.0)
        if probe_source("allreduce_probe") in argv:
            self.calls.append("allreduce")
            self.argvs.append([a for a in argv if a != probe_source("allreduce_probe")])
            stdout = self.allreduce_stdouts.pop(0) if self.allreduce_stdouts else ""
            return CommandResult(tuple(argv), 0, stdout, "", False, 5.0)
        return super().run(argv, timeout, input)


def multi_gpu_host(
    gpus: int = 8,
    nodes: int | None = None,
    kernel_gpus: int | None = None,
    name: str = "NVIDIA H200",
    cuda_visible: str | None = None,
) -> MultiGpuHost:
    """Return the recorded H200 machine widened to ``gpus`` GPUs visible to CUDA and NVML.

    ``nodes``: how many /dev/nvidiaN exist here (default ``gpus``); ``kernel_gpus``: how many
    GPUs the (host's) kernel driver lists in /proc/driver/nvidia/gpus (default ``nodes``).
    """
    base = h200_host()
    nodes = gpus if nodes is None else nodes
    kernel_gpus = nodes if kernel_gpus is None else kernel_gpus
    host = MultiGpuHost(
        files=dict(base.files), nodes=dict(base.nodes), disk=dict(base.disk), name=f"h200x{gpus}"
    )
    probe = copy.deepcopy(base.probe_lines)
    nvml_dev, cuda_dev = probe[1]["devices"][0], probe[2]["devices"][0]
    probe[1]["devices"] = [dict(nvml_dev, index=k, minor=k, name=name) for k in range(gpus)]
    probe[2]["devices"] = [dict(cuda_dev, index=k, name=name) for k in range(gpus)]
    probe[2]["device_count"] = gpus
    if cuda_visible is not None:
        probe[0]["env"] = {"CUDA_VISIBLE_DEVICES": cuda_visible}
    host.probe_lines = probe
    gpu0 = host.nodes.pop("/dev/nvidia0")
    for k in range(nodes):
        path = f"/dev/nvidia{k}"
        host.nodes[path] = FileStat(path, "char", gpu0.mode, 195, k)
    for k in range(kernel_gpus):
        bus = f"0000:{0x18 + 0x10 * k:02x}:00.0"
        host.files[f"/proc/driver/nvidia/gpus/{bus}/information"] = (
            f"Model: \t\t {name}\nDevice Minor: \t {k}\n"
        )
    return host


def run(host: RecordedHost, **options: object) -> Report:
    """Run the multi-GPU checks (or ``only=...``) on ``host`` and return the Report."""
    options.setdefault("only", IDS)
    return run_checks(host, CheckOptions(**options))


def findings(report: Report, check_id: str, status: Status | None = None) -> list[Finding]:
    """Return the findings of one check (of one status)."""
    return [
        f
        for f in report.findings
        if f.check_id == check_id and (status is None or f.status == status)
    ]


def only(report: Report, check_id: str) -> Finding:
    """Return the single finding of one check."""
    found = findings(report, check_id)
    assert len(found) == 1, found
    return found[0]
