"""host.kernel_modules and host.xid: the machine's own kernel, seen where it runs.

Both read the kernel's host (``scope="node"``): with ``--ct`` the CT's host, else the
target itself; inside a container without ``--ct`` they SKIP (a CT has no kernel of its
own: its /lib/modules and its log are not the kernel's).

- ``host.kernel_modules``: the running kernel and the kernel the next boot uses each have
  an NVIDIA module (``dkms status``, ``modinfo -k K nvidia``; the next kernel from
  ``proxmox-boot-tool kernel list`` on Proxmox, else the boot loader's default). A next
  kernel without one WARNs before the reboot, naming the commands that build or pin.
- ``host.xid``: NVIDIA Xid and "fallen off the bus" events in the kernel log since boot
  (``journalctl -k -b``, else ``dmesg``), each with NVIDIA's meaning and action.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor.context import CheckContext
from gpudoctor.facts import kernel as kernel_facts
from gpudoctor.facts.xid import read_kernel_log, summarize, xid_events
from gpudoctor.model import Finding, Severity, Status
from gpudoctor.registry import check

ON_HOST = (
    "this runs inside a container ({manager}): the kernel and its log are the host's; "
    "run `gpudoctor check` on the host, or `gpudoctor check --host HOST --ct ID`"
)


def _container(ctx: CheckContext) -> str:
    """Return the container manager when the check runs inside a container without --ct."""
    if ctx.options.ct:
        return ""
    return kernel_facts.in_container(ctx.host)


@check(
    id="host.kernel_modules",
    title="The running kernel and the next boot's kernel both have an NVIDIA module",
    severity=Severity.CRITICAL,
    proves="`modinfo -k K nvidia` (or /lib/modules/K/updates/dkms/nvidia.ko*) finds a module "
    "for `uname -r` and for the kernel the boot loader starts next",
    remediation="Build the module for that kernel (`apt install proxmox-headers-K && dkms "
    "autoinstall -k K`; linux-headers-K elsewhere), or keep booting a kernel that has one "
    "(`proxmox-boot-tool kernel pin K`).",
    scope="node",
)
def kernel_modules(ctx: CheckContext) -> Iterator[Finding]:
    """Yield one finding per kernel (running, next boot): PASS with the module's path, FAIL
    for a running kernel without one, WARN for a next-boot kernel without one (``uname -r;
    proxmox-boot-tool kernel list; dkms status; modinfo -k K nvidia``)."""
    manager = _container(ctx)
    if manager:
        yield ctx.skip("kernel", ON_HOST.format(manager=manager))
        return
    facts = ctx.facts.get("kernel_facts", lambda: kernel_facts.gather(ctx.host))
    if not facts.running:
        yield ctx.skip("kernel", "the running kernel's release could not be read (uname -r)")
        return
    good = [m for m in facts.modules.values() if m.present]
    if not good and not facts.dkms and not ctx.facts.read_optional("/proc/driver/nvidia/version"):
        yield ctx.skip("kernel", "no NVIDIA driver is installed here (no module, no DKMS entry)")
        return
    for kernel, state in facts.modules.items():
        running = kernel == facts.running
        role = "running kernel" if running else "next boot's kernel"
        evidence = [*state.evidence]
        if kernel == facts.next_boot:
            evidence.append(f"next boot: {facts.next_boot} ({facts.next_why})")
        if state.present:
            role = (
                "running kernel (and next boot's)"
                if running and kernel == facts.next_boot
                else role
            )
            yield ctx.passed(kernel, f"The {role} {kernel} has an NVIDIA module: {state.path}.",
                             evidence=evidence)  # fmt: skip
            continue
        build = kernel_facts.build_command(kernel, facts.proxmox)
        cause = _dkms_cause(facts, kernel)
        loaded = ctx.facts.read_optional("/proc/driver/nvidia/version")
        if running and loaded:  # loaded from elsewhere (a VM's image, built in): it works
            version = loaded.strip().splitlines()[0] if loaded.strip() else ""
            yield ctx.passed(kernel, f"The running kernel {kernel} has the NVIDIA driver "
                             f"loaded, from outside /lib/modules/{kernel}.",
                             evidence=[*evidence, f"/proc/driver/nvidia/version: {version}"])  # fmt: skip
            continue
        if running:
            yield ctx.fail(
                kernel,
                f"The running kernel {kernel} has no NVIDIA module{cause}: no NVIDIA driver "
                "can be loaded until one is built (or the host boots a kernel that has one).",
                evidence=evidence,
                remediation=f"{build} && modprobe nvidia",
            )
            continue
        pin = f"proxmox-boot-tool kernel pin {facts.running}" if facts.proxmox else (
            f"set GRUB_DEFAULT to the {facts.running} entry and run update-grub")  # fmt: skip
        yield ctx.warn(
            kernel,
            f"The next boot starts kernel {kernel} ({facts.next_why}), which has no NVIDIA "
            f"module{cause}: after the reboot no NVIDIA driver loads and every GPU CT fails.",
            evidence=evidence,
            remediation=f"Before rebooting, build it: {build}; or keep the running kernel: {pin}",
        )


def _dkms_cause(facts: kernel_facts.KernelFacts, kernel: str) -> str:
    """Return ``" (DKMS holds nvidia 580.x but did not build it for K)"`` or ""."""
    if not facts.dkms_versions:
        return ""
    versions = ", ".join(facts.dkms_versions)
    return f" (DKMS holds nvidia {versions} but did not build it for {kernel})"


def missing_module_cause(ctx: CheckContext) -> str:
    """Return the sentence ``driver.loaded`` adds when host.kernel_modules found that the
    running kernel has no module ("" when it did not run or found one)."""
    result = ctx.result("host.kernel_modules")
    if result is None:
        return ""
    for finding in result.findings:
        if finding.status is Status.FAIL:
            return finding.message.split(":")[0] + "."
    return ""


@check(
    id="host.xid",
    title="The kernel log holds no NVIDIA Xid or fallen-off-the-bus event since boot",
    severity=Severity.CRITICAL,
    proves="`journalctl -k -b` (or `dmesg`) has no `NVRM: Xid` line and no GPU 'fallen off the "
    "bus' message since boot",
    remediation="Follow the action NVIDIA documents for the code "
    "(https://docs.nvidia.com/deploy/xid-errors/): restart the application (13, 31, 43, 45), "
    "reset the GPU (48, 61-64, 74, 95, 119), reboot or service the node (79, 154).",
    scope="node",
)
def xid(ctx: CheckContext) -> Iterator[Finding]:
    """Yield PASS when the kernel log since boot has no Xid, else one finding per (GPU,
    code): FAIL when the GPU is unusable until reset/reboot (79, 48, 95, 119, ...), WARN
    for application faults and recoverable events (``journalctl -k -b | grep NVRM``)."""
    manager = _container(ctx)
    if manager:
        yield ctx.skip("kernel log", ON_HOST.format(manager=manager))
        return
    log = ctx.facts.get("kernel_log", lambda: read_kernel_log(ctx.host))
    if not log.source:
        yield ctx.skip("kernel log", f"the kernel log cannot be read here: {log.error}")
        return
    groups = summarize(xid_events(list(log.records)))
    if not groups:
        yield ctx.passed("kernel log", f"No NVIDIA Xid event since boot ({log.source}).",
                         evidence=[f"{log.source}: {len(log.records)} records read"])  # fmt: skip
        return
    for group in groups:
        info = group.first.info
        evidence = [
            f"events since boot: {group.count}",
            f"first: {group.first.line[:300]}",
            *([f"last: {group.last.line[:300]}"] if group.count > 1 else []),
            f"source: {log.source}",
        ]
        who = (
            f" (pid {group.last.pid} {group.last.process})".replace(" )", ")")
            if group.last.pid
            else ""
        )
        message = (
            f"Xid {group.code} on GPU {group.pci}{who}, {group.count}x since boot: {info.name}."
        )
        if info.breaks_cuda:
            message += " The GPU is unusable until it is reset or the node reboots: a GPU " \
                       "problem, not a container or config problem."  # fmt: skip
            yield ctx.fail(group.subject, message, evidence=evidence,
                           remediation=info.action[:1].upper() + info.action[1:] + ".")  # fmt: skip
        else:
            message += f" ({info.kind} fault: {info.action})."
            yield ctx.warn(group.subject, message, evidence=evidence,
                           remediation=info.action[:1].upper() + info.action[1:] + ".")  # fmt: skip


def gpu_faults(ctx: CheckContext) -> list[str]:
    """Return the subjects of host.xid's FAILs (``Xid 79 on 0000:3b:00``), for cuda.init and
    nvml.init to name as the cause of their failure; [] when it did not run or found none."""
    result = ctx.result("host.xid")
    if result is None:
        return []
    return [f.subject for f in result.findings if f.status is Status.FAIL]
