"""cuda.init: cuInit(0) succeeds in a child process and sees the GPUs."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor.context import CheckContext
from gpudoctor.facts.cuda_errors import cu_meaning
from gpudoctor.facts.gpu import NO_PYTHON, python_missing
from gpudoctor.model import Finding, Severity
from gpudoctor.registry import check


def cuda_version(code: int | None) -> str:
    """Return ``13.0`` for cuDriverGetVersion's 13000 (``?`` when unknown)."""
    return f"{code // 1000}.{code % 1000 // 10}" if code else "?"


@check(
    id="cuda.init",
    title="CUDA initialises (cuInit(0) = 0) and sees the GPUs",
    severity=Severity.CRITICAL,
    proves="libcuda loads and cuInit(0) returns CUDA_SUCCESS in a fresh process, with >= 1 device",
    remediation="Fix the first failing upstream check (device.open, proc.usable, "
    "driver.userspace_match); cuInit's code alone rarely names the cause.",
    requires=("driver.loaded",),
    after=("device.open", "proc.usable", "nvml.init", "driver.userspace_match", "host.xid"),
    uses_gpu_probe=True,
    fix="gpudoctor fix",
)
def cuda_init(ctx: CheckContext) -> Iterator[Finding]:
    """Yield the cuInit(0) verdict (``python -c "from cuda.bindings import driver;
    print(driver.cuInit(0))"``), attributed to the upstream check that explains it."""
    if python_missing(ctx.host):
        yield ctx.skip(
            "cuInit", f"{NO_PYTHON}: the CUDA probe needs it (the device checks do not)."
        )
        return
    probe = ctx.facts.gpu_probe()
    stage = probe.stage("cuda")
    if not stage.finished:
        hung = probe.hung_in() == "cuda"
        yield ctx.fail(
            "cuInit",
            (
                f"cuInit(0) did not return within {probe.timeout_s:g} s: the driver is hung."
                if hung
                else f"The CUDA probe did not run (exit {probe.returncode}): {probe.stderr.strip()[-300:]}"
            )
            + gpu_faults_text(ctx),
            evidence=[f"probe stdout stages: {sorted(probe.stages)}", probe.stderr.strip()[-300:]],
            remediation="On the host: check `dmesg | grep -i -e xid -e nvrm`, `nvidia-smi`; a GPU "
            "stuck in a bad state needs `nvidia-smi -r` or a host reboot.",
            caused_by=("host.xid",) if gpu_faults_text(ctx) else (),
        )
        return
    data = stage.data
    if "load_error" in data:
        yield ctx.fail(
            "libcuda.so.1",
            "libcuda.so.1 cannot be loaded: the driver's user-space libraries are not installed "
            "in this container (or not on the loader's path).",
            evidence=[str(data["load_error"])],
            remediation="Install the user-space driver of the host's exact version in the CT "
            "(NVIDIA .run with --no-kernel-module, or libnvidia-compute-<branch>), or bind-mount "
            "the host's libraries.",
        )
        return
    code = int(data.get("init", -1))
    version = cuda_version(data.get("driver_version"))
    evidence = [
        f"cuInit(0) = {code} in {data.get('init_s', 0):.3f} s",
        f"libcuda: {data.get('lib_path')}",
    ]
    evidence.append(f"cuDriverGetVersion = {data.get('driver_version')} (CUDA {version})")
    if probe.ran_as():
        evidence.append(probe.ran_as())
    if code == 0:
        devices = data.get("devices", [])
        names = ", ".join(
            f"{d['index']}: {d['name']} (sm_{d['compute_capability'][0]}{d['compute_capability'][1]})"
            for d in devices
        )
        if not devices:
            yield ctx.fail(
                "cuInit",
                "cuInit(0) succeeded but CUDA sees no device.",
                evidence=evidence,
                remediation="Pass a GPU node (/dev/nvidiaN) into the container and check "
                "CUDA_VISIBLE_DEVICES.",
            )
            return
        yield ctx.passed(
            "cuInit",
            f"cuInit(0) = 0; CUDA {version} driver sees {len(devices)} device(s): {names}.",
            evidence=evidence,
        )
        return
    meaning = cu_meaning(code, data.get("init_name"), data.get("init_desc"))
    causes = attribute(ctx, code)
    cause_text = f" (caused by {', '.join(causes)})" if causes else ""
    why = f" Likely cause: {meaning.likely_cause}." if meaning.likely_cause and not causes else ""
    faults = gpu_faults_text(ctx) if causes == ("host.xid",) else ""
    yield ctx.fail(
        "cuInit",
        f"cuInit(0) returned {code} {meaning.name}{cause_text}: {meaning.meaning}.{why}{faults}",
        evidence=evidence,
        remediation=(
            f"Fix {causes[0]} first (see its finding); cuInit will follow."
            if causes
            else "See docs/troubleshooting.md for this code; run `gpudoctor check --json` on the "
            "host and in the CT and compare."
        ),
        fix_hint=ctx.options.fix_command() if "device.open" in causes else "",
        caused_by=causes,
    )


def gpu_faults_text(ctx: CheckContext) -> str:
    """Return the sentence that names the host's GPU faults as the cause ("" when none)."""
    from gpudoctor.checks.host import gpu_faults

    faults = gpu_faults(ctx)
    if not faults:
        return ""
    return (
        f" The host's kernel log has {', '.join(faults)} since boot: a GPU problem, not a "
        "config problem; no change to the CT config helps (see host.xid)."
    )


def attribute(ctx: CheckContext, code: int) -> tuple[str, ...]:
    """Return the upstream checks that explain a failing cuInit code, most direct first (a
    GPU-breaking Xid in the host's kernel log comes first: no config change cures it)."""
    from gpudoctor.checks.host import gpu_faults

    if gpu_faults(ctx):
        return ("host.xid",)
    order = {
        304: ("proc.usable", "device.open"),
        803: ("driver.userspace_match",),
    }.get(code, ("device.open", "proc.usable", "driver.userspace_match", "nvml.init"))
    return tuple(c for c in order if ctx.failed(c))[:1]
