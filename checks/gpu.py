"""gpu.count and gpu.health: the GPUs the workload needs are visible, and each is healthy.

gpu.count: TP4/TP8 runs fail in containers and VMs when GPUs are missing from the
container (a node not passed, CUDA_VISIBLE_DEVICES, a GPU fallen off the bus). gpu.health:
what NVML says about each GPU (ECC, throttling, PCIe width, persistence, foreign memory use).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpudoctor.context import CheckContext
from gpudoctor.facts.multigpu import GpuInventory, gpu_inventory
from gpudoctor.model import Finding, Severity
from gpudoctor.registry import check

HARMLESS_REASONS = {"GpuIdle"}
GIB = 1 << 30


def inventory(ctx: CheckContext) -> GpuInventory:
    """Return the shared GpuInventory of this run (GPU probe + /dev + /proc/driver/nvidia)."""
    return ctx.facts.get(
        "gpu_inventory",
        lambda: gpu_inventory(ctx.facts.gpu_probe(), ctx.host.list_dir, ctx.facts.read_optional),
    )


@check(
    id="gpu.count",
    title="As many GPUs are visible as the workload needs",
    severity=Severity.HIGH,
    proves="CUDA enumerates at least --expect-gpus GPUs here (with no expectation: reports the "
    "count), and they are all of one model",
    remediation="Pass every GPU into the container (a /dev/nvidiaN node + its bind mount per GPU) "
    "and check CUDA_VISIBLE_DEVICES; or lower the tensor parallelism to the GPUs present.",
    requires=("driver.loaded",),
    after=("nvml.init", "cuda.init"),
    uses_gpu_probe=True,
)
def gpu_count(ctx: CheckContext) -> Iterator[Finding]:
    """Yield the GPU count verdict (``nvidia-smi -L | wc -l`` vs ``--expect-gpus N``)."""
    inv = inventory(ctx)
    evidence = inv.evidence()
    visible, want = inv.visible, ctx.options.expect_gpus
    if visible is None:
        yield ctx.fail(
            "GPUs",
            "Neither CUDA nor NVML could count the GPUs (see cuda.init and nvml.init).",
            evidence=evidence,
            remediation="Fix cuda.init / nvml.init first.",
            caused_by=tuple(c for c in ("cuda.init", "nvml.init") if ctx.failed(c)),
        )
        return
    names = ", ".join(dict.fromkeys(inv.names)) or "?"
    if want is not None and visible < want:
        yield ctx.fail(
            "GPUs",
            f"{visible} GPU(s) visible, but the workload needs {want}{why_fewer(inv)}.",
            evidence=evidence,
            remediation=fewer_remedy(ctx, inv),
        )
        return
    if visible == 0:
        yield ctx.fail(
            "GPUs",
            "No GPU is visible to CUDA here.",
            evidence=evidence,
            remediation=fewer_remedy(ctx, inv),
        )
        return
    if len(set(inv.names)) > 1:
        yield ctx.warn(
            "GPUs",
            f"{visible} GPUs of different models ({names}): tensor parallelism runs at the "
            "pace of the slowest and may not fit the smallest.",
            evidence=evidence,
            remediation="Pin the job to identical GPUs with CUDA_VISIBLE_DEVICES.",
        )
        return
    need = f"; {want} needed" if want is not None else ""
    yield ctx.passed("GPUs", f"{visible} GPU(s) visible ({names}){need}.", evidence=evidence)


def why_fewer(inv: GpuInventory) -> str:
    """Return the clause explaining where the missing GPUs are (may be empty)."""
    if inv.cuda_visible_devices is not None and inv.nvml is not None and inv.nvml > (inv.cuda or 0):
        return (
            f": NVML sees {inv.nvml} but CUDA_VISIBLE_DEVICES={inv.cuda_visible_devices} hides some"
        )
    if inv.missing_nodes:
        return (
            f": the host's driver has {inv.kernel} GPUs but "
            + ", ".join(f"/dev/nvidia{n}" for n in inv.missing_nodes)
            + " are not in this system"
        )
    if inv.kernel is not None and inv.visible is not None and inv.kernel > inv.visible:
        return (
            f": the kernel driver lists {inv.kernel} GPUs, so the others are hidden or failed "
            "(a GPU that fell off the bus stays listed: `dmesg | grep -i xid`)"
        )
    return ""


def fewer_remedy(ctx: CheckContext, inv: GpuInventory) -> str:
    """Return the remedy when fewer GPUs are visible than needed."""
    if inv.cuda_visible_devices is not None and inv.nvml and inv.nvml > (inv.cuda or 0):
        return "Unset or widen CUDA_VISIBLE_DEVICES (and NVIDIA_VISIBLE_DEVICES for Docker)."
    if inv.missing_nodes:
        lines = "; ".join(
            f"lxc.mount.entry: /dev/nvidia{n} dev/nvidia{n} none bind,optional,create=file"
            for n in inv.missing_nodes
        )
        return (
            f"Add to {ctx.options.config_path()} on the host (the GPUs' major 195 must be "
            f"allowed: lxc.cgroup2.devices.allow: c 195:* rwm): {lines}; then restart the CT."
        )
    if inv.kernel is not None and inv.visible is not None and inv.kernel > inv.visible:
        return (
            "Check NVIDIA_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES, and `dmesg | grep -i -e xid "
            "-e nvrm` for a GPU that failed (Xid 79: fallen off the bus; reset or reboot)."
        )
    return "Give the machine/VM more GPUs, or plan a smaller tensor parallelism (--tp)."


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
