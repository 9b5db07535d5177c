"""nvml.init: NVML initialises (what ``nvidia-smi`` needs)."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor.checks.driver import MISMATCH_REMEDY

from gpudoctor.context import CheckContext
from gpudoctor.facts.cuda_errors import nvml_meaning
from gpudoctor.facts.gpu import NO_PYTHON, python_missing
from gpudoctor.model import Finding, Severity
from gpudoctor.registry import check


@check(
    id="nvml.init",
    title="NVML initialises (nvidia-smi works)",
    severity=Severity.HIGH,
    proves="libnvidia-ml loads and nvmlInit_v2 returns NVML_SUCCESS",
    remediation="Install/bind-mount libnvidia-ml.so.1 of the host's driver version; "
    "make /dev/nvidiactl openable.",
    requires=("driver.loaded",),
    after=("device.open",),
    uses_gpu_probe=True,
)
def nvml_init(ctx: CheckContext) -> Iterator[Finding]:
    """Yield the nvmlInit_v2 verdict (``nvidia-smi -L``)."""
    if python_missing(ctx.host):
        yield ctx.skip(
            "nvmlInit", f"{NO_PYTHON}: the NVML probe needs it (the device checks do not)."
        )
        return
    probe = ctx.facts.gpu_probe()
    stage = probe.stage("nvml")
    if not stage.finished:
        yield ctx.fail(
            "nvmlInit",
            "NVML did not answer within the probe's timeout: the driver is hung.",
            remediation="On the host: `dmesg | grep -i xid`; reset or reboot.",
        )
        return
    data = stage.data
    if "load_error" in data:
        yield ctx.fail(
            "libnvidia-ml.so.1",
            "libnvidia-ml.so.1 cannot be loaded: the driver's user-space libraries are missing.",
            evidence=[str(data["load_error"])],
            remediation="Install the NVIDIA user-space driver of the host's version in this system.",
        )
        return
    code = int(data.get("init", -1))
    if code != 0:
        meaning = nvml_meaning(code, data.get("error_name"))
        causes = ("device.open",) if ctx.failed("device.open") else ()
        yield ctx.fail(
            "nvmlInit",
            f"nvmlInit_v2 returned {code} {meaning.name}: {meaning.meaning}."
            + (f" Likely cause: {meaning.likely_cause}." if meaning.likely_cause else ""),
            evidence=[
                f"nvmlInit_v2 = {code} ({data.get('error_name')})",
                f"lib: {data.get('lib_path')}",
                *([probe.ran_as()] if probe.ran_as() else []),
            ],
            remediation=MISMATCH_REMEDY if code == 18 else "Fix the device checks first.",
            caused_by=causes,
        )
        return
    devices = data.get("devices", [])
    yield ctx.passed(
        "nvmlInit",
        f"NVML {data.get('nvml_version')} initialised; driver {data.get('driver_version')}; "
        f"{len(devices)} GPU(s): " + ", ".join(str(d.get("name")) for d in devices) + ".",
        evidence=[
            f"lib: {data.get('lib_path')}",
            f"nvmlInit_v2 in {data.get('elapsed_s', 0):.3f} s",
            *([probe.ran_as()] if probe.ran_as() else []),
        ],
    )
