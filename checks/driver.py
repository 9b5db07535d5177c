"""driver.loaded and driver.userspace_match: the NVIDIA kernel module is loaded (shared by the
host and its containers), and the user-space libraries are its exact version."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpudoctor.checks._ct_config import read_ct_config

from gpudoctor.context import CheckContext
from gpudoctor.facts.gpu import NO_PYTHON, python_missing
from gpudoctor.facts.nodes import nvidia_majors
from gpudoctor.facts.procfs import parse_driver_version
from gpudoctor.model import Finding, Severity
from gpudoctor.registry import check

VERSION_FILE = "/proc/driver/nvidia/version"
MISMATCH_REMEDY = (
    "Make the user-space libraries match the kernel module: on the host reboot after a driver "
    "upgrade (or reload the module); in a CT install the host's exact version "
    "(NVIDIA-Linux-*.run --no-kernel-module, or libnvidia-compute-<branch>=<version>)."
)


@check(
    id="driver.loaded",
    title="The NVIDIA kernel module is loaded",
    severity=Severity.CRITICAL,
    proves="/proc/driver/nvidia/version names a loaded NVRM module and /proc/devices registers it",
    remediation="On the host: `modprobe nvidia` (install the driver if it is missing); "
    "containers share the host's kernel module, so fix the host, not the CT.",
    after=("proc.usable", "host.kernel_modules"),
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
        from gpudoctor.checks.host import missing_module_cause

        cause = missing_module_cause(ctx)
        if cause:
            evidence.append(f"host.kernel_modules: {cause}")
        yield ctx.fail(
            "kernel module",
            "No NVIDIA kernel module is loaded: /proc/driver/nvidia/version does not exist."
            + (f" Cause: {cause} DKMS did not build the module for this kernel." if cause else ""),
            evidence=evidence,
            remediation=(
                "Build the module for the running kernel (see host.kernel_modules: `dkms "
                "autoinstall -k $(uname -r)`), then `modprobe nvidia`; or boot a kernel that "
                "has one (`proxmox-boot-tool kernel pin K`)."
                if cause
                else "On the host: `modprobe nvidia && nvidia-modprobe -u -c=0` (install the "
                "driver first if `modinfo nvidia` finds none). A container cannot load it itself."
            ),
            caused_by=(*caused_by, *(("host.kernel_modules",) if cause else ())),
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
    if not libs and nvml.get("init") == 0 and nvml.get("driver_version") == kernel.version:
        yield ctx.passed(
            "driver versions",
            f"NVML initialises and reports driver {kernel.version}, the kernel module's: its "
            "library matches the module (NVML refuses to start on a mismatch).",
            evidence=[
                f"kernel module: {kernel.version}",
                f"nvmlSystemGetDriverVersion: {nvml.get('driver_version')}",
                f"libnvidia-ml: {nvml.get('lib_path')} (no version in its name: bound from the "
                "host by soname)",
            ],
        )
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
    id="driver.libs_mode",
    title="The CT's NVIDIA user-space driver follows the host's (bound, not copied)",
    severity=Severity.WARNING,
    proves="the CT config binds the host's driver files (gpudoctor fix --driver-libs bind), "
    "each bound source exists on the host now, so a host driver upgrade needs only a CT restart",
    remediation="gpudoctor fix --host HOST --ct ID --driver-libs bind (read-only bind mounts of "
    "the host's driver files; copies inside the CT break at the next host driver upgrade)",
    after=("cuda.init",),
    scope="ct_host",
    fix="gpudoctor fix --host HOST --ct ID --driver-libs bind",
)
def libs_mode(ctx: CheckContext) -> Iterator[Finding]:
    """Yield PASS when the CT binds the host's driver files (all sources present), WARN for
    copies inside the CT (fragile: the next host upgrade breaks them) or stale binds
    (``grep gpudoctor-driver /etc/pve/lxc/ID.conf``; cuda.init's libcuda path)."""
    from gpudoctor.pve import driver_libs

    read = read_ct_config(ctx)
    if isinstance(read, Finding):
        yield read
        return
    target, snap = read.target, read.snap
    bound = driver_libs.bound_entries(snap.config)
    hint = ctx.options.fix_command() + " --driver-libs bind"
    cuda = ctx.result("cuda.init")
    lib = next((e.split(": ", 1)[1] for f in (cuda.findings if cuda else ())
                for e in f.evidence if e.startswith("libcuda: ")), "")  # fmt: skip
    if bound:
        missing = [s for _, s, _ in bound if not ctx.host.exists(s)]
        evidence = [f"{target.config_path}: {len(bound)} driver bind(s) into {driver_libs.LIB_DIR}"]
        evidence += [f"bound: {s} -> /{t.lstrip('/')}" for _, s, t in bound[:6]]
        if lib:
            evidence.append(f"libcuda inside the CT: {lib}")
        if missing:
            yield ctx.warn(
                target.config_path,
                f"bind mode, but {len(missing)} bound source(s) no longer exist on the host "
                f"(an older driver's versioned files: {', '.join(missing[:3])}): LXC skips them "
                "(optional); re-run fix to bind the current driver's list.",
                evidence=evidence,
                remediation=hint,
                fix_hint=hint,
            )
            return
        yield ctx.passed(
            target.config_path,
            "bind mode: the CT uses the host's own driver files, read-only; after a host "
            "driver upgrade a restart of the CT is all it takes.",
            evidence=evidence,
        )
        return
    from gpudoctor.facts.driver_files import driver_version

    if not driver_version(ctx.host):  # issue 47: fix --driver-libs bind would refuse
        yield ctx.skip(
            target.config_path,
            "the host has no NVIDIA kernel module loaded: there is no host driver to bind"
            " (driver.loaded says why); once the host's driver is loaded, bind it with: " + hint,
            evidence=[
                f"{target.config_path}: no bind of the host's driver files",
                "host: no /proc/driver/nvidia/version",
            ],
        )
        return
    if not lib or lib == "None":
        yield ctx.warn(
            target.config_path,
            "the CT holds no NVIDIA user-space driver and binds none from the host.",
            evidence=[f"{target.config_path}: no bind of the host's driver files"],
            remediation=hint,
            fix_hint=hint,
        )
        return
    yield ctx.warn(
        target.config_path,
        f"copy mode (a fragile config): the CT uses its own copy of the driver ({lib}); the "
        "next host driver upgrade breaks it with 'Driver/library version mismatch' until the "
        "same version is installed inside again.",
        evidence=[f"libcuda inside the CT: {lib}", f"{target.config_path}: no driver bind"],
        remediation=hint,
        fix_hint=hint,
    )
