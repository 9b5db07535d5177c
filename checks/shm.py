"""shm.capacity: the tmpfs that holds the weights (and NCCL's SHM transport) is big enough."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpudoctor.checks.model import GIB, gib, missing_bytes

from gpudoctor.context import CheckContext
from gpudoctor.facts.multigpu import gpu_node_minors, nccl_shm_bytes
from gpudoctor.facts.procfs import mount_of, parse_mounts
from gpudoctor.model import Finding, Severity
from gpudoctor.registry import check

SHM = "/dev/shm"
MIN_SHM = 1 * GIB


def mem_available(text: str | None) -> int | None:
    """Return MemAvailable in bytes from ``/proc/meminfo`` text, or None."""
    match = re.search(r"^MemAvailable:\s+(\d+) kB", text or "", re.M)
    return int(match.group(1)) * 1024 if match else None


@check(
    id="shm.capacity",
    title="/dev/shm is a tmpfs large enough for the model and NCCL",
    severity=Severity.HIGH,
    proves="/dev/shm is tmpfs, at least 1 GiB, and has room for what the --model-dir "
    "manifests still need",
    remediation="Grow /dev/shm: in the CT, `mount -o remount,size=64G /dev/shm` (persist with an "
    "fstab line `tmpfs /dev/shm tmpfs defaults,size=64G 0 0`); on the host give the CT enough RAM.",
)
def shm_capacity(ctx: CheckContext) -> Iterator[Finding]:
    """Yield the /dev/shm verdict (``df -h /dev/shm; grep shm /proc/self/mounts``)."""
    mounts = parse_mounts(ctx.facts.read_optional("/proc/self/mounts") or "")
    mount = mount_of(mounts, SHM)
    try:
        usage = ctx.host.disk_usage(SHM)
    except OSError as exc:
        yield ctx.fail(
            SHM, f"{SHM} cannot be used: {exc.strerror}.", remediation="Mount a tmpfs on /dev/shm."
        )
        return
    fstype = mount.fstype if mount else "?"
    evidence = [
        f"mount: {mount.source if mount else '?'} on {SHM} type {fstype}",
        f"size {gib(usage.total)}, free {gib(usage.free)}",
    ]
    available = mem_available(ctx.facts.read_optional("/proc/meminfo"))
    if available is not None:
        evidence.append(f"MemAvailable: {gib(available)} (tmpfs pages are RAM)")
    needed = sum(missing_bytes(ctx, d) for d in ctx.options.model_dirs if d.startswith(SHM + "/"))
    gpus = ctx.options.expect_gpus or len(gpu_node_minors(ctx.host.list_dir))
    nccl_need = nccl_shm_bytes(gpus)
    if nccl_need:
        evidence.append(f"NCCL with {gpus} GPUs may need ~{nccl_need >> 20} MiB (SHM transport)")
    if fstype != "tmpfs":
        yield ctx.warn(
            SHM,
            f"{SHM} is {fstype}, not tmpfs: weights there do not live in RAM.",
            evidence=evidence,
            remediation="mount -t tmpfs -o size=64G tmpfs /dev/shm",
        )
    elif needed and needed > usage.free:
        yield ctx.fail(
            SHM,
            f"{SHM} has {gib(usage.free)} free but the model directories still need {gib(needed)}.",
            evidence=evidence,
            remediation=f"mount -o remount,size={(usage.used + needed) // GIB + 2}G {SHM}",
        )
    elif needed and available is not None and needed > available:
        yield ctx.fail(
            SHM,
            f"The model needs {gib(needed)} more in {SHM} but only {gib(available)} of RAM is "
            "available: tmpfs pages are memory.",
            evidence=evidence,
            remediation="Give the container more memory (pct set <id> -memory N) or free some.",
        )
    elif nccl_need and usage.free < needed + nccl_need:
        yield ctx.warn(
            SHM,
            f"NCCL needs ~{nccl_need >> 20} MiB in {SHM} for {gpus} GPUs (its SHM transport, used "
            f"whenever P2P is off) but only {gib(usage.free - needed)} would be left.",
            evidence=evidence,
            remediation=f"mount -o remount,size={(usage.used + needed + nccl_need) // GIB + 2}G {SHM}",
        )
    elif usage.total < MIN_SHM:
        yield ctx.warn(
            SHM,
            f"{SHM} is only {gib(usage.total)}: NCCL and PyTorch need more (Docker's 64 MiB "
            "default breaks multi-GPU runs).",
            evidence=evidence,
            remediation=f"mount -o remount,size=16G {SHM}",
        )
    else:
        yield ctx.passed(
            SHM,
            f"{SHM} is tmpfs, {gib(usage.total)} with {gib(usage.free)} free.",
            evidence=evidence,
        )
