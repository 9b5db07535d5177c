"""nvml.init, driver.userspace_match and gpu.health: what NVML says about the driver and GPUs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from gpudoctor.context import CheckContext
from gpudoctor.facts.cuda_errors import nvml_meaning
from gpudoctor.facts.gpu import NO_PYTHON, python_missing
from gpudoctor.facts.procfs import parse_driver_version
from gpudoctor.model import Finding, Severity
from gpudoctor.registry import check

MISMATCH_REMEDY = (
    "Make the user-space libraries match the kernel module: on the host reboot after a driver "
    "upgrade (or reload the module); in a CT install the host's exact version "
    "(NVIDIA-Linux-*.run --no-kernel-module, or libnvidia-compute-<branch>=<version>)."
)
HARMLESS_REASONS = {"GpuIdle"}
GIB = 1 << 30


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
    stage = ctx.facts.gpu_probe().stage("nvml")
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
        ],
    )


def lib_version(path: str | None) -> str | None:
    """Return ``580.159.04`` from ``/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04``."""
    if not path:
        return None
    match = re.search(r"\.so\.(\d+\.\d+(?:\.\d+)?)$", path)
    return match.group(1) if match else None


@check(
    id="driver.userspace_match",
    title="The user-space driver libraries match the kernel module version",
    severity=Severity.CRITICAL,
    proves="libcuda and libnvidia-ml are the loaded kernel module's exact version "
    "(no 'Driver/library version mismatch')",
    remediation=MISMATCH_REMEDY,
    requires=("driver.loaded",),
    uses_gpu_probe=True,
)
def userspace_match(ctx: CheckContext) -> Iterator[Finding]:
    """Yield PASS when libcuda/libnvidia-ml versions equal /proc/driver/nvidia/version's."""
    if python_missing(ctx.host):
        yield ctx.skip("driver versions", f"{NO_PYTHON}: the library probe needs it.")
        return
    text = ctx.facts.read_optional("/proc/driver/nvidia/version") or ""
    kernel = parse_driver_version(text)
    probe = ctx.facts.gpu_probe()
    libs: dict[str, str] = {}
    for stage_name, label in (("cuda", "libcuda"), ("nvml", "libnvidia-ml")):
        version = lib_version(probe.stage(stage_name).data.get("lib_path"))
        if version:
            libs[label] = version
    nvml = probe.stage("nvml").data
    if nvml.get("init") == 18:
        libs.setdefault("libnvidia-ml", "?")
    if kernel is None:
        yield ctx.skip("driver versions", "The kernel module version is unknown.")
        return
    if not libs:
        yield ctx.skip(
            "driver versions",
            "No NVIDIA user-space library was found to compare (see cuda.init / nvml.init).",
        )
        return
    evidence = [f"kernel module: {kernel.version}"] + [f"{k}: {v}" for k, v in libs.items()]
    wrong = {k: v for k, v in libs.items() if v != kernel.version}
    if wrong or nvml.get("init") == 18:
        yield ctx.fail(
            "driver versions",
            "Driver/library version mismatch: "
            + ", ".join(f"{k} {v}" for k, v in wrong.items())
            + f" vs kernel module {kernel.version}.",
            evidence=evidence,
            remediation=MISMATCH_REMEDY,
        )
        return
    yield ctx.passed(
        "driver versions",
        f"{', '.join(sorted(libs))} match the kernel module {kernel.version}.",
        evidence=evidence,
    )


@check(
    id="gpu.health",
    title="Every GPU is healthy (no ECC errors, throttling, degraded link or foreign memory use)",
    severity=Severity.WARNING,
    proves="NVML reports no uncorrected ECC errors, no pending page retirement/row remap, no "
    "throttling other than idle, full PCIe width, persistence mode on, no memory held by "
    "processes outside this system",
    remediation="See each finding: reset or drain the GPU, enable persistence "
    "(`nvidia-smi -pm 1` or nvidia-persistenced), reseat/check the PCIe slot.",
    requires=("nvml.init",),
    uses_gpu_probe=True,
)
def gpu_health(ctx: CheckContext) -> Iterator[Finding]:
    """Yield one finding per GPU (``nvidia-smi -q -d ECC,PERFORMANCE,PAGE_RETIREMENT``)."""
    for dev in ctx.facts.gpu_probe().stage("nvml").data.get("devices", []):
        subject = f"GPU {dev.get('index')} ({dev.get('name')})"
        problems, evidence = health_problems(dev)
        if problems:
            yield ctx.warn(
                subject,
                "; ".join(p for p, _ in problems) + ".",
                evidence=evidence,
                remediation=" ".join(dict.fromkeys(r for _, r in problems if r)),
            )
        else:
            yield ctx.passed(subject, "healthy.", evidence=evidence)


def health_problems(dev: dict[str, Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """Return ([(problem, remedy)], evidence lines) for one NVML device record."""
    problems: list[tuple[str, str]] = []
    evidence: list[str] = []
    ecc = dev.get("ecc_uncorrected_volatile")
    evidence.append(f"ECC uncorrected (volatile): {na(ecc)}")
    if ecc:
        problems.append(
            (
                f"{ecc} uncorrected ECC error(s) since boot",
                "Drain the GPU and reset it (`nvidia-smi -r`); replace it if they recur.",
            )
        )
    rows = dev.get("remapped_rows") or {}
    if rows:
        evidence.append(f"remapped rows: {rows}")
    if rows.get("pending") or dev.get("retired_pages_pending"):
        problems.append(
            (
                "memory row remap / page retirement pending",
                "Reset the GPU (`nvidia-smi -r`) or reboot to apply the remap.",
            )
        )
    if rows.get("failure"):
        problems.append(("row remapping FAILED", "The GPU needs service (RMA)."))
    names = dev.get("clocks_event_names")
    evidence.append(f"clock event reasons: {names if names is not None else 'N/A'}")
    active = [n for n in names or [] if n not in HARMLESS_REASONS]
    if active:
        problems.append(
            (
                f"clocks limited by {', '.join(active)}",
                "Check cooling and power limits (`nvidia-smi -q -d PERFORMANCE`).",
            )
        )
    width, width_max = dev.get("pcie_width_current"), dev.get("pcie_width_max")
    gen, gen_max = dev.get("pcie_gen_current"), dev.get("pcie_gen_max")
    evidence.append(f"PCIe: gen {na(gen)}/{na(gen_max)} x{na(width)}/x{na(width_max)} (cur/max)")
    if width and width_max and width < width_max:
        problems.append(
            (
                f"PCIe link x{width}, below its x{width_max}",
                "Reseat the GPU or check the slot/riser (link width does not drop at idle).",
            )
        )
    persistence = dev.get("persistence_mode")
    evidence.append(
        f"persistence mode: {'N/A' if persistence is None else ('on' if persistence else 'off')}"
    )
    if persistence == 0:
        problems.append(
            (
                "persistence mode is off (each first CUDA call re-initialises the GPU)",
                "On the host: `nvidia-smi -pm 1` or enable nvidia-persistenced.",
            )
        )
    foreign = [p for p in dev.get("processes") or [] if not p.get("visible")]
    used = dev.get("memory_used")
    if used is not None:
        evidence.append(
            f"memory used: {used / GIB:.1f} GiB of {dev.get('memory_total', 0) / GIB:.1f} GiB"
        )
    if foreign:
        held = sum(p.get("used_memory") or 0 for p in foreign)
        problems.append(
            (
                f"{len(foreign)} process(es) outside this system hold {held / GIB:.1f} GiB",
                "Find them on the host (`nvidia-smi --query-compute-apps=pid,used_memory "
                "--format=csv`) before benchmarking.",
            )
        )
    return problems, evidence


def na(value: object) -> str:
    """Return ``N/A`` for a missing NVML value, else its text (nvitop's convention)."""
    return "N/A" if value is None else str(value)
