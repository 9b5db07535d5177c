"""Inside the CT: open the passed nodes and run the catalogue's device checks there,
through ``pct exec`` / ``lxc-attach`` and the gpudoctor agent (nothing installed in the CT).
"""

from __future__ import annotations

from gpudoctor.hosts.base import Host, HostError, OpenResult
from gpudoctor.pve.apply import Layout, Target


def container_host(host: Host, target: Target, layout: Layout) -> Host:
    """Return a Host for the inside of the CT (``pct exec`` / ``lxc-attach``)."""
    from gpudoctor.hosts.container import ContainerHost, enter_command

    if target.flavor == "lxc":
        return ContainerHost(host, target.ct, "lxc", layout.lxcpath)
    enter = enter_command("pve", target.ct, pct=layout.pct)
    return ContainerHost(host, target.ct, "pve", enter=enter)


def probe(ct_host: Host, paths: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Return ``(path, errno name)`` for ``open(path, O_RDWR)`` inside the CT (``OK`` on
    success; read-only nodes such as nvidia-cap1 are retried O_RDONLY; ``NOT_A_DEVICE
    (file)`` for a placeholder where a node belongs: it would open, and is no device)."""
    out = []
    for path in paths:
        try:
            kind = ct_host.stat(path).kind
        except FileNotFoundError:
            out.append((path, "ENOENT"))
            continue
        except OSError:
            kind = "char"  # unreadable: let open() say what it is
        if kind not in ("char", "block"):  # a placeholder file opens, and is no device
            out.append((path, f"NOT_A_DEVICE ({kind})"))
            continue
        result: OpenResult = ct_host.try_open(path, write=True)
        if result.errname == "EACCES":
            result = ct_host.try_open(path, write=False)
        out.append((path, result.errname))
    return tuple(out)


def worse(before: tuple[tuple[str, str], ...], after: tuple[tuple[str, str], ...]) -> list[str]:
    """Return the paths that opened before and do not open now, and those the device
    policy denies now (EPERM) but did not before (``/dev/tty`` without a controlling
    terminal gives ENXIO both times: not worse; EPERM after: the policy shrank)."""
    now = dict(after)
    return [
        p
        for p, e in before
        if (e == "OK" and now.get(p, "MISSING") != "OK")
        or (e != "EPERM" and not e.startswith("UNREACHABLE") and now.get(p) == "EPERM")
    ]


def device_checks(ct_host: Host, target: Target, paths: tuple[str, ...]) -> tuple[dict, ...]:
    """Return the catalogue's ``device`` checks run inside the CT, as finding dicts
    (empty when the catalogue cannot run there)."""
    try:
        from gpudoctor.context import CheckOptions, DeviceRequest
        from gpudoctor.runner import run_checks

        options = CheckOptions(
            devices=tuple(DeviceRequest(p) for p in paths),
            only=("device",),
            ct=target.ct,
            flavor=target.flavor,
        )
        report = run_checks(ct_host, options)
    except Exception as exc:  # the re-check is evidence, the probe above decides
        return ({"check": "device", "status": "ERROR", "message": str(exc)},)
    return tuple(f.to_dict() for f in report.findings)


def safe_probe(ct_host: Host, paths: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Return :func:`probe`'s answer, or ``UNREACHABLE (why)`` per path when the CT
    cannot be reached."""
    try:
        return probe(ct_host, paths)
    except HostError as exc:
        return tuple((p, f"UNREACHABLE ({exc})") for p in paths)
