"""The findings of device.unchanged: what the CUDA/NVML probe did to the device nodes.

Kept beside checks/device.py (whose family it serves) so that module stays one job: judging
the nodes as they were; this one words what changed while the probe ran.
"""

from __future__ import annotations

from gpudoctor.context import CheckContext
from gpudoctor.facts.gpu import GpuProbe
from gpudoctor.facts.node_snapshot import (
    PARAMS,
    STATUS,
    NodeChange,
    NodeSnapshot,
    effective_uid,
    modify_device_files,
)
from gpudoctor.facts.nodes import a_kind, family_major, family_of
from gpudoctor.hosts.base import FileStat
from gpudoctor.model import Finding

ROOT_NOTE = (
    "A check run as root can make the NVIDIA driver library rewrite device nodes; "
    "device.nodes and device.open report the nodes as they were before the probe."
)


def node_text(st: FileStat | None) -> str:
    """Return ``char 511:0, mode 0666`` (``a FIFO, mode 0644``; ``No such file or
    directory`` for None), as ``stat -c '%F %t:%T %a'`` would say it."""
    if st is None:
        return "No such file or directory"
    if st.kind in ("char", "block"):
        return f"{st.kind} {st.major}:{st.minor}, mode {st.mode & 0o7777:04o}"
    return f"{a_kind(st.kind)}, mode {st.mode & 0o7777:04o}"


def short(st: FileStat) -> str:
    """Return ``511:0`` for a node, else its kind in words."""
    return f"{st.major}:{st.minor}" if st.kind in ("char", "block") else a_kind(st.kind)


def who_did_it(before: NodeSnapshot) -> tuple[str, bool]:
    """Return (who changed the nodes, in words; True when that is the driver library): the
    driver library with its uid, or "something else" when ModifyDeviceFiles is 0."""
    files = dict(before.files)
    setting = modify_device_files(files.get(PARAMS))
    if setting is not None and setting.replace(" ", "").endswith(":0"):
        return "something other than the driver library (ModifyDeviceFiles is 0)", False
    uid = effective_uid(files.get(STATUS))
    running = (
        "running as root"
        if uid == 0
        else f"running as uid {uid}, through the setuid nvidia-modprobe"
        if uid is not None
        else "running as this user"
    )
    return f"the driver library (libcuda/libnvidia-ml, {running})", True


def evidence(change: NodeChange, before: NodeSnapshot, probe: GpuProbe) -> list[str]:
    """Return the evidence lines: the stats before and after, the driver's major now, the
    ModifyDeviceFiles setting, the uid and what cuInit returned."""
    files = dict(before.files)
    lines = [
        f"before the probe: stat {change.path}: {node_text(change.before)}",
        f"after the probe: stat {change.path}: {node_text(change.after)}",
    ]
    family = family_of(change.path)
    if family is not None:
        from gpudoctor.facts.procfs import parse_proc_devices

        major = family_major(parse_proc_devices(files.get("/proc/devices") or ""), family)
        lines.append(f"/proc/devices: {major if major is not None else 'no'} {family.driver}")
    setting = modify_device_files(files.get(PARAMS))
    lines.append(f"{PARAMS}: {setting or 'no ModifyDeviceFiles line (or not readable)'}")
    uid = effective_uid(files.get(STATUS))
    if uid is not None:
        lines.append(f"{STATUS}: uid {uid}")
    cuda = probe.stage("cuda").data
    if "init" in cuda:
        lines.append(
            f"probe: cuInit(0) = {cuda.get('init')} {cuda.get('init_name') or ''}".rstrip()
        )
    return lines


def finding(
    ctx: CheckContext, change: NodeChange, before: NodeSnapshot, probe: GpuProbe
) -> Finding:
    """Return the FAIL (a node removed) or WARN (re-created, created, re-moded) of one change."""
    who, driver = who_did_it(before)
    path = change.path
    family = family_of(path)
    files = dict(before.files)
    from gpudoctor.facts.procfs import parse_proc_devices

    devices = parse_proc_devices(files.get("/proc/devices") or "")
    major = family_major(devices, family) if family is not None else None
    tail = f" {ROOT_NOTE}" if driver else ""
    proof = evidence(change, before, probe)
    config = ctx.options.config_path()
    if change.kind == "removed":
        assert change.before is not None
        old = change.before
        wanted = f"{major}:{old.minor}" if major is not None else None
        if wanted is not None and (old.kind != "char" or old.major != major):
            lost = f" and could not create {wanted}: the cgroup denies it (mknod of major {major})"
        else:
            lost = " and nothing took its place"
        return ctx.fail(
            path,
            f"{who} removed {path} ({short(old)}){lost}. Since then this system has no "
            f"{path} until the CT restarts.{tail}",
            evidence=proof,
            remediation=(
                f"Make the CT's node right at its source, then restart the CT to get {path} "
                "back: pass the host's node (devN entry or bind mount) and allow its current "
                + (
                    f"major ({major}: lxc.cgroup2.devices.allow: c {major}:* rwm) "
                    if major
                    else "major "
                )
                + f"in {config}, and drop any hook or mknod that makes the node with an old "
                "major. To check without the driver touching nodes, run gpudoctor as a non-root "
                "user, or load nvidia with NVreg_ModifyDeviceFiles=0 on the host."
            ),
            fix_hint=ctx.options.fix_command(),
        )
    assert change.after is not None
    if change.kind == "created":
        what = f"created {path} ({node_text(change.after)}), which did not exist before the probe"
    elif change.before is not None and short(change.before) != short(change.after):
        what = f"replaced {path} ({short(change.before)}) by {short(change.after)}"
    else:
        what = f"changed {path} from {node_text(change.before)} to {node_text(change.after)}"
    return ctx.warn(
        path,
        f"{who} {what} while gpudoctor's probe ran.{tail}",
        evidence=proof,
        remediation="Nothing to undo here; fix what device.nodes reports (the CT's config), "
        "so that the CT gets the right node at its next start.",
        fix_hint=ctx.options.fix_command(),
    )
