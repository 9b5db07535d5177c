"""proc.usable: the container has a working /proc (CUDA reads /proc/self and /proc/driver/nvidia)."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor.context import CheckContext
from gpudoctor.model import Finding, Severity
from gpudoctor.registry import check

PROC_REMEDY = (
    "Give the container its own procfs: in the CT config, `lxc.mount.auto: proc:rw sys:rw` "
    "(Proxmox sets proc:mixed by default; a custom lxc.mount.auto line can drop it), then restart the CT."
)


@check(
    id="proc.usable",
    title="/proc is mounted and shows this process and the NVIDIA driver",
    severity=Severity.CRITICAL,
    proves="/proc/self and /proc/driver/nvidia are readable, as libcuda needs (else cuInit = 304)",
    remediation=PROC_REMEDY,
)
def proc_usable(ctx: CheckContext) -> Iterator[Finding]:
    """Yield a FAIL when /proc/self or /proc/driver/nvidia cannot be read (``ls /proc/self``)."""
    status = ctx.facts.read_optional("/proc/self/status")
    if status is None:
        yield ctx.fail(
            "/proc/self",
            "/proc/self cannot be read: this process has no usable /proc (not mounted, or a procfs "
            "of another PID namespace). libcuda fails cuInit with 304 CUDA_ERROR_OPERATING_SYSTEM.",
            evidence=["read /proc/self/status: failed"],
            remediation=PROC_REMEDY,
        )
        return
    devices = ctx.facts.proc_devices()
    if not devices.char:
        yield ctx.fail(
            "/proc/devices",
            "/proc/devices cannot be read or is empty.",
            evidence=["read /proc/devices: failed or empty"],
            remediation=PROC_REMEDY,
        )
        return
    if devices.char_major("nvidia", "nvidia-frontend", "nvidiactl") is not None:
        try:
            entries = ctx.host.list_dir("/proc/driver/nvidia")
        except OSError as exc:
            yield ctx.fail(
                "/proc/driver/nvidia",
                f"The NVIDIA driver is registered in /proc/devices but /proc/driver/nvidia cannot "
                f"be listed ({exc.strerror}): /proc is masked or a stale copy.",
                evidence=["/proc/devices lists nvidia", f"ls /proc/driver/nvidia: {exc.strerror}"],
                remediation=PROC_REMEDY,
            )
            return
        yield ctx.passed(
            "/proc",
            "/proc/self and /proc/driver/nvidia are readable.",
            evidence=[f"/proc/driver/nvidia: {', '.join(entries)}"],
        )
        return
    yield ctx.passed("/proc", "/proc/self and /proc/devices are readable.")
