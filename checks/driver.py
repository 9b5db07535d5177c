"""driver.loaded: the NVIDIA kernel module is loaded (shared by the host and its containers)."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor.context import CheckContext
from gpudoctor.facts.nodes import nvidia_majors
from gpudoctor.facts.procfs import parse_driver_version
from gpudoctor.model import Finding, Severity
from gpudoctor.registry import check

VERSION_FILE = "/proc/driver/nvidia/version"


@check(
    id="driver.loaded",
    title="The NVIDIA kernel module is loaded",
    severity=Severity.CRITICAL,
    proves="/proc/driver/nvidia/version names a loaded NVRM module and /proc/devices registers it",
    remediation="On the host: `modprobe nvidia` (install the driver if it is missing); "
    "containers share the host's kernel module, so fix the host, not the CT.",
    after=("proc.usable",),
)
def driver_loaded(ctx: CheckContext) -> Iterator[Finding]:
    """Yield PASS with the module version (``cat /proc/driver/nvidia/version``), FAIL, or
    WARN when /proc itself is unusable (the module may well be loaded)."""
    text = ctx.facts.read_optional(VERSION_FILE)
    majors = nvidia_majors(ctx.facts.proc_devices())
    caused_by = ("proc.usable",) if ctx.failed("proc.usable") else ()
    if text is None and caused_by:
        # No usable /proc: the module's state cannot be read from here, which is not proof
        # that it is missing. WARN (not FAIL) so that cuda.init still runs and shows the 304.
        yield ctx.warn(
            "kernel module",
            f"Cannot tell whether the NVIDIA kernel module is loaded: {VERSION_FILE} cannot be "
            "read because this process has no usable /proc (see proc.usable).",
            evidence=[f"read {VERSION_FILE}: failed", "proc.usable: FAIL"],
            remediation="Fix proc.usable first; then this check reads the module's version.",
            caused_by=caused_by,
        )
        return
    if text is None:
        evidence = [f"read {VERSION_FILE}: failed"]
        evidence.append(
            "/proc/devices: "
            + (", ".join(f"{n}={m}" for n, m in majors.items()) or "no nvidia majors")
        )
        yield ctx.fail(
            "kernel module",
            "No NVIDIA kernel module is loaded: /proc/driver/nvidia/version does not exist.",
            evidence=evidence,
            remediation="On the host: `modprobe nvidia && nvidia-modprobe -u -c=0` (install the "
            "driver first if `modinfo nvidia` finds none). A container cannot load it itself.",
            caused_by=caused_by,
        )
        return
    version = parse_driver_version(text)
    if version is None:
        yield ctx.fail(
            "kernel module",
            f"{VERSION_FILE} exists but names no NVRM version.",
            evidence=[text.strip()[:300]],
            remediation="Reinstall the NVIDIA driver on the host and reboot.",
        )
        return
    evidence = [version.line]
    evidence.append("/proc/devices: " + ", ".join(f"{n}={m}" for n, m in majors.items()))
    yield ctx.passed(
        "kernel module",
        f"NVIDIA kernel module {version.version} ({version.flavor}) is loaded.",
        evidence=evidence,
    )
