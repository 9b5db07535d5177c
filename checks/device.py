"""device.nodes and device.open: every GPU node exists with the current major, and opens.

The incident: after a host reboot nvidia-uvm got a new DYNAMIC major; the CT config still
allowed the old one, so the cgroup v2 eBPF device program denied open() with EPERM although
the node existed with mode 0666, and cuInit returned 999.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator

from gpudoctor.checks import _node_changes

from gpudoctor.context import CheckContext, DeviceRequest
from gpudoctor.facts import node_snapshot
from gpudoctor.facts.gpu import NO_PYTHON, python_missing
from gpudoctor.facts.idmap import OVERFLOW_UID, UID_MAP, IdMap, parse_idmap
from gpudoctor.facts.nodes import (
    NVIDIA_FAMILIES,
    a_kind,
    driver_name_for_major,
    family_major,
    family_of,
    nvidia_majors,
)
from gpudoctor.hosts.base import FileStat, OpenResult
from gpudoctor.model import Finding, Severity
from gpudoctor.registry import check

CGROUP_V1_LIST = "/sys/fs/cgroup/devices/devices.list"


def describe(st: FileStat) -> str:
    """Return ``char 511:0, mode 0666`` for a node (``stat -c '%F %t:%T %a'``)."""
    return f"{st.kind} {st.major}:{st.minor}, mode {st.mode & 0o777:04o}"


def stat_or_none(ctx: CheckContext, path: str) -> FileStat | None:
    """Return the node's stat as it was before the GPU probe ran, or None when it did not
    exist (:meth:`gpudoctor.context.FactCache.node_stat`)."""
    return ctx.facts.node_stat(path)


def node_paths(ctx: CheckContext) -> list[str]:
    """Return the NVIDIA nodes present (before the GPU probe) plus the ``--device`` paths
    (each once, in order)."""
    paths = ctx.facts.nvidia_nodes()
    extra = [d.path for d in ctx.options.devices]
    return list(dict.fromkeys([*paths, *extra]))


def mount_remedy(path: str, is_dir: bool) -> str:
    """Return the CT config line that bind-mounts a host node into the container."""
    create = "dir" if is_dir else "file"
    target = path.lstrip("/")
    return f"lxc.mount.entry: {path} {target} none bind,optional,create={create}"


@check(
    id="device.nodes",
    title="Every GPU device node exists with the major its driver has now",
    severity=Severity.CRITICAL,
    proves="each NVIDIA node that /proc/devices announces exists as a char device with the "
    "current (dynamic) major; extra --device nodes exist (and match their driver when given)",
    remediation="Create missing nodes on the host (`nvidia-modprobe -u -c=0`), bind-mount them "
    "into the CT, and restart the CT so stale nodes are re-created.",
    after=("driver.loaded",),
    fix="gpudoctor fix",
)
def device_nodes(ctx: CheckContext) -> Iterator[Finding]:
    """Yield one finding per expected node (``ls -l /dev/nvidia*`` vs ``/proc/devices``)."""
    devices = ctx.facts.proc_devices()
    present = set(node_paths(ctx))
    any_nvidia = False
    for family in NVIDIA_FAMILIES:
        major = family_major(devices, family)
        members = sorted(p for p in present if family_of(p) is family)
        if major is None:
            for path in members:
                st = stat_or_none(ctx, path)
                if st is not None and st.kind == "char":
                    yield stale(ctx, path, st, None, family.driver)
            continue
        any_nvidia = True
        for name in family.required:
            path = f"{family.directory}/{name}"
            if path not in present:
                yield missing(ctx, path, family.driver, major, family.is_dir)
        if family.at_least_one and not any(
            re.fullmatch(family.at_least_one, p.rpartition("/")[2]) for p in members
        ):
            yield ctx.fail(
                f"{family.directory}/nvidiaN",
                "No GPU node (/dev/nvidia0, /dev/nvidia1, ...) exists: no GPU is passed through.",
                evidence=[f"/proc/devices: {major} {family.driver}", "ls /dev/nvidia[0-9]*: none"],
                remediation="Bind-mount the GPU nodes into the CT: "
                + mount_remedy("/dev/nvidia0", False)
                + f" and allow them: lxc.cgroup2.devices.allow: c {major}:* rwm",
                fix_hint=ctx.options.fix_command(),
            )
        for path in members:
            st = stat_or_none(ctx, path)
            if st is None:
                continue
            yield judge_node(ctx, path, st, major, family.driver)
    for request in ctx.options.devices:
        yield from requested_node(ctx, request)
    if not any_nvidia and not ctx.options.devices:
        yield ctx.skip(
            "nvidia nodes",
            "No NVIDIA driver is registered in /proc/devices, so no NVIDIA node is expected.",
            caused_by=("driver.loaded",) if ctx.failed("driver.loaded") else (),
        )


def judge_node(ctx: CheckContext, path: str, st: FileStat, major: int, driver: str) -> Finding:
    """Return PASS for a char node with the expected major, FAIL (stale/not a node) otherwise."""
    if st.kind != "char":
        why = (
            "the host's node was missing when the container started, so the bind mount's "
            "create= left an empty placeholder."
            if st.kind in ("file", "dir")
            else "something other than the driver put it there; nothing can open it as a GPU."
        )
        return ctx.fail(
            path,
            f"{path} is {a_kind(st.kind)}, not a char device: {why}",
            evidence=[
                f"stat {path}: {a_kind(st.kind)}, mode {st.mode & 0o7777:04o}, size {st.size}",
                f"/proc/devices: {major} {driver}",
            ],
            remediation=(
                "On the host create the node (`nvidia-modprobe -u -c=0`), then restart the CT."
                if st.kind in ("file", "dir")
                else f"Remove {path} (`rm {path}`), create the node on the host "
                "(`nvidia-modprobe -u -c=0`) and restart the CT."
            ),
            fix_hint=ctx.options.fix_command(),
        )
    if st.major != major:
        return stale(ctx, path, st, major, driver)
    return ctx.passed(path, f"{path} exists ({describe(st)}); {driver} is major {major}.")


def stale(ctx: CheckContext, path: str, st: FileStat, major: int | None, driver: str) -> Finding:
    """Return the FAIL for a node whose major is not the one its driver has now."""
    now = (
        f"{driver} is major {major} now" if major is not None else f"{driver} is not registered now"
    )
    names = ctx.facts.proc_devices().char_names(st.major)
    current = (
        f"major {st.major} is {'/'.join(names)} now" if names else f"no driver has major {st.major}"
    )
    return ctx.fail(
        path,
        f"{path} is stale: it is {describe(st)} but {now} ({current}). "
        "The node was made for an earlier boot or driver load.",
        evidence=[f"stat {path}: {describe(st)}", f"/proc/devices: {now}"],
        remediation=(
            f"Re-create the node with the current major (on the host: `rm {path} && "
            + ("nvidia-modprobe -u -c=0`" if family_of(path) else f"mknod {path} c {major} N`")
            + "), then restart the CT so it sees the new node; "
            f"allow the new major in {ctx.options.config_path()}"
            + (f": lxc.cgroup2.devices.allow: c {major}:* rwm" if major is not None else "")
        ),
        # no driver has the node's family now: load it on the host; fix has nothing to pass
        fix_hint=ctx.options.fix_command() if major is not None else "",
    )


def missing(ctx: CheckContext, path: str, driver: str, major: int | None, is_dir: bool) -> Finding:
    """Return the FAIL for a node that should exist and does not."""
    evidence = [f"stat {path}: No such file or directory"]
    if major is not None:
        evidence.append(f"/proc/devices: {major} {driver}")
    if family_of(path) is None:
        host_step = f"e.g. `mknod {path} c {major if major is not None else 'MAJOR'} MINOR`"
    else:
        host_step = "`nvidia-modprobe -u -c=0`" if "uvm" in driver else "`nvidia-modprobe -c=0`"
    return ctx.fail(
        path,
        f"{path} does not exist"
        + (f" although {driver} is loaded (major {major})." if major is not None else "."),
        evidence=evidence,
        remediation=f"On the host make sure the node exists ({host_step}), then pass it into the "
        f"CT in {ctx.options.config_path()}: {mount_remedy(path, is_dir)}"
        + (f" and lxc.cgroup2.devices.allow: c {major}:* rwm" if major is not None else "")
        + "; restart the CT.",
        fix_hint=ctx.options.fix_command(),
    )


def requested_node(ctx: CheckContext, request: DeviceRequest) -> Iterator[Finding]:
    """Yield the finding for one ``--device PATH[:DRIVER]`` node."""
    devices = ctx.facts.proc_devices()
    st = stat_or_none(ctx, request.path)
    expected = devices.char_major(request.driver) if request.driver else None
    if st is None:
        yield missing(ctx, request.path, request.driver or "its driver", expected, False)
        return
    if request.driver is None:
        if st.kind not in ("char", "block"):
            yield ctx.fail(
                request.path,
                f"{request.path} is {a_kind(st.kind)}, not a device node.",
                evidence=[f"stat {request.path}: {a_kind(st.kind)}, mode {st.mode & 0o7777:04o}"],
                remediation="Pass the host's device node into the container.",
            )
            return
        yield ctx.passed(request.path, f"{request.path} exists ({describe(st)}).")
        return
    if expected is None:
        yield ctx.fail(
            request.path,
            f"No driver named {request.driver!r} is registered in /proc/devices.",
            evidence=[
                f"stat {request.path}: {describe(st)}",
                f"/proc/devices: no {request.driver}",
            ],
            remediation=f"Load the driver for {request.driver} on the host.",
        )
        return
    yield judge_node(ctx, request.path, st, expected, request.driver)


@check(
    id="device.open",
    title="Every GPU device node can be opened",
    severity=Severity.CRITICAL,
    proves="open(O_RDWR) succeeds on every node, so the cgroup device policy and the node "
    "modes allow what CUDA does at cuInit",
    remediation="Allow the node's CURRENT major in the CT config "
    "(lxc.cgroup2.devices.allow: c MAJOR:* rwm) and restart the CT; for EACCES fix the mode/group.",
    after=("device.nodes",),
    fix="gpudoctor fix",
)
def device_open(ctx: CheckContext) -> Iterator[Finding]:
    """Yield one finding per node: ``open(path, O_RDWR)`` (``exec 3<>PATH`` in a shell)."""
    devices = ctx.facts.proc_devices()
    probed = 0
    for path in node_paths(ctx):
        st = stat_or_none(ctx, path)
        if st is None or st.kind not in ("char", "block"):
            continue
        probed += 1
        result = ctx.host.try_open(path, write=True)
        if result.errno in (errno.EACCES, errno.EROFS) and not st.mode & 0o222:
            result = ctx.host.try_open(path, write=False)
        if result.errno == errno.ENOENT:
            yield ctx.fail(
                path,
                f"{path} ({describe(st)}) was there when the check began and is gone now "
                "(open: ENOENT): it vanished while the CUDA/NVML probe ran. The NVIDIA driver "
                "library, running as root, removes a node it thinks wrong (see "
                "device.unchanged).",
                evidence=[
                    f"stat {path} before the probe: {describe(st)}",
                    f"open({path}, {result.flags}) = ENOENT",
                ],
                remediation="Follow device.nodes and device.unchanged: make the node right on "
                "the host side, then restart the CT so it gets the node back.",
                fix_hint=ctx.options.fix_command(),
            )
            continue
        if not result.ok and node_failed(ctx, path):
            yield ctx.fail(
                path,
                f"{path} ({describe(st)}) cannot be opened: {result.errname}, because the node "
                "itself is wrong (see device.nodes): allowing its old major would not help.",
                evidence=[f"open({path}, {result.flags}) = {result.errname}"],
                remediation="Follow device.nodes: re-create the node with the current major, "
                "then restart the CT.",
                fix_hint=ctx.options.fix_command(),
                caused_by=("device.nodes",),
            )
            continue
        yield judge_open(ctx, path, st, result, driver_name_for_major(devices, st.major))
    if probed == 0:
        yield ctx.skip(
            "device nodes",
            "No GPU device node exists to open.",
            caused_by=("device.nodes",) if ctx.failed("device.nodes") else (),
        )


def target_idmap(ctx: CheckContext) -> IdMap:
    """Return the target's uid map (``cat /proc/self/uid_map``): unprivileged CT or not."""
    return parse_idmap(ctx.facts.read_optional(UID_MAP), ctx.facts.read_optional(OVERFLOW_UID))


def node_failed(ctx: CheckContext, path: str) -> bool:
    """Return True when device.nodes already FAILed this node (stale, placeholder, ...)."""
    result = ctx.result("device.nodes")
    return result is not None and any(
        f.subject == path and f.status.rank >= 3 for f in result.findings
    )


def judge_open(
    ctx: CheckContext, path: str, st: FileStat, result: OpenResult, driver: str
) -> Finding:
    """Return the finding for one open() attempt, with the errno interpreted."""
    head = f"{path} ({describe(st)})"
    evidence = [f"stat {path}: {describe(st)}", f"open({path}, {result.flags}) = {result.errname}"]
    if result.ok:
        return ctx.passed(path, f"{head} opens ({result.flags}).", evidence=evidence)
    rule = f"lxc.cgroup2.devices.allow: c {st.major}:* rwm"
    known = bool(ctx.facts.proc_devices().char_names(st.major))
    if result.errno == errno.EPERM:
        v1 = ctx.facts.read_optional(CGROUP_V1_LIST)
        if v1 is not None:
            evidence.append(f"{CGROUP_V1_LIST}: " + " | ".join(v1.split("\n")[:12]))
        else:
            evidence.append("cgroup v2: the device policy is an eBPF program (not readable here)")
        mode_note = (
            "The node exists and its mode allows access"
            if st.world_accessible
            else "The node exists (EPERM is not a file-mode error)"
        )
        return ctx.fail(
            path,
            f"{head} cannot be opened: EPERM. {mode_note}, so the container's cgroup device "
            f"policy denies major {st.major} ({driver}).",
            evidence=evidence,
            remediation=f"On the host, allow it: {rule}   in {ctx.options.config_path()}, then "
            f"restart the CT (Docker: --device-cgroup-rule 'c {st.major}:* rwm'"
            + (f"; systemd: DeviceAllow=char-{driver.split('/')[0]} rw" if known else "")
            + ").",
            fix_hint=ctx.options.fix_command(),
        )
    if result.errno == errno.EACCES:
        idmap = target_idmap(ctx)
        if idmap.unmapped_owner(st.uid, st.gid):
            evidence.append(idmap.describe())
            return ctx.fail(
                path,
                f"{head} cannot be opened: EACCES. This is an unprivileged CT: the node's host "
                f"owner is not mapped into it (it shows as {st.uid}:{st.gid}, the overflow id), "
                f"so the CT's root counts as 'other' and only the last bits of mode "
                f"{st.mode_text} apply ({st.mode_text[6:]}). chown inside the CT cannot change that.",
                evidence=evidence,
                remediation=f"On the host give the node mode 0666 (`chmod 0666 {path}`, NVIDIA's "
                "default; with devN entries mode=0666), or map the node's host group into the CT "
                "(lxc.idmap for that gid, plus /etc/subgid).",
            )
        return ctx.fail(
            path,
            f"{head} cannot be opened: EACCES. The file mode or ownership denies this user "
            f"(mode {st.mode_text}, owner {st.uid}:{st.gid}).",
            evidence=evidence,
            remediation=f"Make the node accessible: `chmod 0666 {path}` on the host (NVIdia's default), "
            "or add the user to the node's group; with devN entries use mode=0666 or gid=.",
        )
    if result.errno in (errno.ENXIO, errno.ENODEV):
        return ctx.fail(
            path,
            f"{head} cannot be opened: {result.errname}. No driver serves major {st.major} "
            f"({driver}) now: the node is stale or the module is not loaded.",
            evidence=evidence,
            remediation="On the host: `nvidia-modprobe -u -c=0` (or reload the driver), re-create "
            "the node with the current major and restart the CT.",
            fix_hint=ctx.options.fix_command(),
        )
    return ctx.fail(
        path,
        f"{head} cannot be opened: {result.errname}.",
        evidence=evidence,
        remediation=f"Check dmesg on the host for NVRM/Xid errors about {driver}.",
    )


@check(
    id="device.unchanged",
    title="The CUDA/NVML probe left every GPU device node as it was",
    severity=Severity.HIGH,
    proves="every NVIDIA node stats the same after cuInit and nvmlInit as before them: the "
    "driver library did not remove, re-create or re-mode a node while gpudoctor checked. A check "
    "run as root can make the driver rewrite nodes (the nvidia module's ModifyDeviceFiles, on by "
    "default); the node checks report what was there before the probe",
    remediation="Make the node right at its source (device.nodes says how) and restart the CT "
    "to get it back (gpudoctor fix plans that restart); gpudoctor's probe drops root before the "
    "driver library loads unless GPUDOCTOR_PROBE_AS_ROOT=1, so the library cannot rewrite "
    "nodes; other CUDA programs run as root can (NVreg_ModifyDeviceFiles=0 stops that).",
    after=("driver.loaded", "cuda.init", "nvml.init"),
    fix="gpudoctor fix",
)
def device_unchanged(ctx: CheckContext) -> Iterator[Finding]:
    """Yield PASS when the nodes stat the same before and after the probe, else one finding
    per node changed (``stat /dev/nvidia*`` before and after ``cuInit``)."""
    # No probe in this run: gpudoctor disturbed nothing. That is a PASS where there are nodes
    # to watch (a SKIP would make a healthy `--only device` run read as "nothing checked"),
    # a SKIP like device.nodes' where there are none.
    if python_missing(ctx.host) or not ctx.facts.probe_started():
        why = NO_PYTHON if python_missing(ctx.host) else "--only left out the checks that need it"
        if not nvidia_majors(ctx.facts.proc_devices()) and not ctx.options.devices:
            yield ctx.skip(
                "nodes", "No NVIDIA driver is registered: no probe ran, no node to watch."
            )
        else:
            yield ctx.passed("nodes", f"No CUDA/NVML probe ran ({why}): no node was disturbed.")
        return
    before = ctx.facts.nodes_before()
    probe = ctx.facts.gpu_probe()
    after = node_snapshot.again(ctx.host, before)
    found = node_snapshot.changes(before, after)
    for change in found:
        yield _node_changes.finding(ctx, change, before, probe)
    if not found:
        how = f" ({probe.ran_as()})" if probe.ran_as() else ""
        yield ctx.passed(
            "nodes",
            f"cuInit and nvmlInit left the {len(after.paths)} device node(s) as they were "
            f"(stat before and after the probe){how}.",
        )
