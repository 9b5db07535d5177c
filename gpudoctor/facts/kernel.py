"""Kernels and their NVIDIA modules: the running kernel, the one the next boot uses, and
whether each has an ``nvidia`` module (DKMS-built or packaged).

Parsers for real outputs (recorded ones: tests/data/recorded/kernel/SOURCES.md):

- ``dkms status``: dkms 2.x ``nvidia, 396.45, 4.17.11-200.fc28.x86_64, x86_64: installed``,
  dkms 3.x ``nvidia/535.113.01, 6.2.0-34-generic, x86_64: installed`` and
  ``nvidia/535.154.05: added`` (source added, built for no kernel);
- ``proxmox-boot-tool kernel list``: the ``Manually selected kernels:``, ``Automatically
  selected kernels:``, ``Pinned kernel:`` and ``Kernel pinned on next-boot:`` sections;
- ``/boot/grub/grub.cfg``: its first ``linux /boot/vmlinuz-K`` entry when the default is 0.

:func:`gather` reads them through a Host (so over SSH for ``--host``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpudoctor.hosts.base import Host

_DKMS3 = re.compile(
    r"^(?P<module>[\w.+-]+)/(?P<version>[^,:\s]+)(?:,\s*(?P<kernel>[^,\s]+),\s*(?P<arch>[^:\s]+))?"
    r":\s*(?P<state>\w+)(?P<note>.*)$"
)
_DKMS2 = re.compile(
    r"^(?P<module>[\w.+-]+),\s*(?P<version>[^,\s]+)(?:,\s*(?P<kernel>[^,\s]+),\s*(?P<arch>[^:\s]+))?"
    r":\s*(?P<state>\w+)(?P<note>.*)$"
)


@dataclass(frozen=True)
class DkmsEntry:
    """One line of ``dkms status``.

    Attributes:
        module: the DKMS module name (``nvidia``).
        version: its version (``535.113.01``).
        kernel: the kernel it was built for, or "" (state ``added``: built for none).
        state: ``added``, ``built`` or ``installed``.
        note: what follows the state (``(original_module exists)``), stripped.
    """

    module: str
    version: str
    kernel: str
    state: str
    note: str = ""


def parse_dkms_status(text: str) -> list[DkmsEntry]:
    """Return the entries of ``dkms status`` output (both the 2.x and the 3.x format);
    lines that are neither (warnings, ``Error! ...``) are skipped."""
    entries = []
    for raw in text.splitlines():
        line = raw.strip()
        match = _DKMS3.match(line) or _DKMS2.match(line)
        if match:
            entries.append(
                DkmsEntry(
                    match["module"],
                    match["version"],
                    match["kernel"] or "",
                    match["state"].lower(),
                    match["note"].strip(),
                )
            )
    return entries


@dataclass(frozen=True)
class BootKernels:
    """``proxmox-boot-tool kernel list``, parsed.

    Attributes:
        manual: the manually selected kernels.
        automatic: the automatically selected kernels.
        pinned: the pinned kernel, or "".
        next_boot: the kernel pinned for the next boot only, or "".
    """

    manual: tuple[str, ...] = ()
    automatic: tuple[str, ...] = ()
    pinned: str = ""
    next_boot: str = ""

    def boots_next(self) -> tuple[str, str]:
        """Return (kernel, why) for the kernel the next boot uses: the next-boot pin, else
        the pin, else the newest selected kernel (proxmox-boot-tool sorts by version)."""
        if self.next_boot:
            return (
                self.next_boot,
                "pinned for the next boot (proxmox-boot-tool kernel pin --next-boot)",
            )
        if self.pinned:
            return self.pinned, "pinned (proxmox-boot-tool kernel pin)"
        candidates = [*self.manual, *self.automatic]
        if not candidates:
            return "", ""
        return max(candidates, key=version_key), "the newest kernel proxmox-boot-tool selected"


_SECTIONS = {
    "manually selected kernels:": "manual",
    "automatically selected kernels:": "automatic",
    "pinned kernel:": "pinned",
    "kernel pinned on next-boot:": "next_boot",
}


def parse_kernel_list(text: str) -> BootKernels:
    """Return the kernels of ``proxmox-boot-tool kernel list`` output."""
    found: dict[str, list[str]] = {k: [] for k in _SECTIONS.values()}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.lower() in _SECTIONS:
            section = _SECTIONS[line.lower()]
        elif line and line != "None." and section and re.match(r"^\d[\w.+~-]*$", line):
            found[section].append(line)
    return BootKernels(
        tuple(found["manual"]),
        tuple(found["automatic"]),
        (found["pinned"] or [""])[0],
        (found["next_boot"] or [""])[0],
    )


def version_key(kernel: str) -> tuple[tuple[int, str], ...]:
    """Return a sort key ordering kernel releases as versions (``6.8.12-10-pve`` after
    ``6.8.12-9-pve``)."""
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.\-+~_]", kernel))


def grub_default(text: str) -> str:
    """Return the kernel of grub.cfg's default entry when the default is the first entry
    (``set default="0"`` or none, Debian's and Ubuntu's default), else ""."""
    default = re.search(r'^\s*set default="?([^"\s]*)"?', text, re.M)
    if default and default.group(1) not in ("0", ""):
        return ""
    first = re.search(r"^\s*linux\s+\S*/vmlinuz-(\S+)", text, re.M)
    return first.group(1) if first else ""


@dataclass(frozen=True)
class ModuleState:
    """Whether one kernel has an NVIDIA module.

    Attributes:
        kernel: the kernel release (``6.8.12-4-pve``).
        present: True when a module was found for it.
        path: where (``/lib/modules/K/updates/dkms/nvidia.ko``), or "".
        evidence: what was asked and answered.
        dkms: the nvidia DKMS entries for this kernel.
    """

    kernel: str
    present: bool
    path: str = ""
    evidence: tuple[str, ...] = ()
    dkms: tuple[DkmsEntry, ...] = ()


@dataclass(frozen=True)
class KernelFacts:
    """The kernels of a host and their NVIDIA modules.

    Attributes:
        running: ``uname -r``.
        next_boot: the kernel the next boot uses ("" when unknown).
        next_why: how that was decided.
        modules: {kernel: ModuleState} for the running and the next kernel.
        dkms: every nvidia entry of ``dkms status`` (empty without dkms).
        dkms_versions: the nvidia versions DKMS holds (built or only added).
        proxmox: True when proxmox-boot-tool answered.
    """

    running: str
    next_boot: str = ""
    next_why: str = ""
    modules: dict[str, ModuleState] = field(default_factory=dict)
    dkms: tuple[DkmsEntry, ...] = ()
    dkms_versions: tuple[str, ...] = ()
    proxmox: bool = False


MODULE_DIRS = ("updates/dkms", "extra", "updates", "kernel/drivers/video", "misc")
_KO = re.compile(r"^nvidia\.ko(\.(xz|zst|gz))?$")


def module_for(host: Host, kernel: str, dkms: tuple[DkmsEntry, ...]) -> ModuleState:
    """Return whether ``kernel`` has an nvidia module: ``modinfo -k K -F filename nvidia``,
    else a look into ``/lib/modules/K/{updates/dkms,extra,...}`` for nvidia.ko*."""
    evidence = []
    mine = tuple(e for e in dkms if e.kernel == kernel)
    result = host.run(["modinfo", "-k", kernel, "-F", "filename", "nvidia"], timeout=15)
    if result.ok and result.stdout.strip():
        path = result.stdout.strip().splitlines()[0]
        return ModuleState(kernel, True, path, (f"modinfo -k {kernel} nvidia: {path}",), mine)
    if result.returncode != 127:
        why = (result.stderr.strip() or f"exit {result.returncode}").splitlines()[-1][:200]
        evidence.append(f"modinfo -k {kernel} nvidia: {why}")
    for sub in MODULE_DIRS:
        where = f"/lib/modules/{kernel}/{sub}"
        try:
            names = host.list_dir(where)
        except OSError:
            continue
        hits = [n for n in names if _KO.match(n)]
        if hits:
            path = f"{where}/{hits[0]}"
            return ModuleState(kernel, True, path, (*evidence, f"found {path}"), mine)
    if not host.exists(f"/lib/modules/{kernel}"):
        evidence.append(f"/lib/modules/{kernel} does not exist")
    else:
        evidence.append(f"no nvidia.ko* under /lib/modules/{kernel}/{{{','.join(MODULE_DIRS)}}}")
    evidence += [f"dkms: {e.module}/{e.version}, {e.kernel}: {e.state}" for e in mine]
    return ModuleState(kernel, False, "", tuple(evidence), mine)


def _stdout(host: Host, argv: list[str]) -> str | None:
    result = host.run(argv, timeout=20)
    return result.stdout if result.ok else None


def next_boot_kernel(host: Host) -> tuple[str, str, bool]:
    """Return (kernel, why, proxmox) for the next boot: ``proxmox-boot-tool kernel list``
    on Proxmox, else grub.cfg's default entry, else the newest ``/lib/modules`` entry
    that has a ``/boot/vmlinuz-K``."""
    listing = _stdout(host, ["proxmox-boot-tool", "kernel", "list"])
    if listing is not None:
        kernel, why = parse_kernel_list(listing).boots_next()
        if kernel:
            return kernel, why, True
    try:
        kernel = grub_default(host.read_text("/boot/grub/grub.cfg", limit=4 << 20))
    except OSError:
        kernel = ""
    if kernel:
        return kernel, "the default entry of /boot/grub/grub.cfg", listing is not None
    try:
        installed = [k for k in host.list_dir("/lib/modules") if host.exists(f"/boot/vmlinuz-{k}")]
    except OSError:
        installed = []
    if installed:
        newest = max(installed, key=version_key)
        return newest, "the newest kernel in /boot (no boot loader default was readable)", False
    return "", "", listing is not None


def gather(host: Host) -> KernelFacts:
    """Return the running and next-boot kernels of ``host`` and whether each has an NVIDIA
    module (``uname -r``; ``proxmox-boot-tool kernel list``; ``dkms status``;
    ``modinfo -k K nvidia``). Raises HostError when the host cannot be reached."""
    try:
        running = host.read_text("/proc/sys/kernel/osrelease").strip()
    except OSError:
        result = host.run(["uname", "-r"], timeout=10)
        running = result.stdout.strip() if result.ok else ""
    status = _stdout(host, ["dkms", "status"])
    dkms = tuple(e for e in parse_dkms_status(status or "") if e.module.startswith("nvidia"))
    versions = tuple(dict.fromkeys(e.version for e in dkms))
    nxt, why, proxmox = next_boot_kernel(host)
    modules = {k: module_for(host, k, dkms) for k in dict.fromkeys([running, nxt]) if k}
    return KernelFacts(running, nxt, why, modules, dkms, versions, proxmox)


def build_command(kernel: str, proxmox: bool) -> str:
    """Return the commands that build the nvidia module for ``kernel`` with DKMS (the
    kernel's headers first)."""
    headers = f"proxmox-headers-{kernel}" if proxmox else f"linux-headers-{kernel}"
    return f"apt install {headers} && dkms autoinstall -k {kernel}"


# What tells a container from a host: systemd's and podman's markers, then PID 1's
# environment (LXC sets container=lxc for the CT's init).
CONTAINER_FILES = ("/run/systemd/container", "/run/host/container-manager", "/proc/1/environ")
DOCKER_MARKER = "/.dockerenv"


def in_container(host: Host) -> str:
    """Return the container manager when ``host`` is itself a container (``lxc``,
    ``docker``: ``/run/systemd/container``, ``/run/host/container-manager``), else ""."""
    for path in CONTAINER_FILES[:2]:
        try:
            text = host.read_text(path).strip()  # the default limit: what the prefetch keeps
        except OSError:
            continue
        if text:
            return text
    if host.exists(DOCKER_MARKER):
        return "docker"
    return _init_container_variable(host)


def _init_container_variable(host: Host) -> str:
    """Return ``container=`` of PID 1's environment (LXC sets ``container=lxc`` for the
    CT's init, also one without systemd: ``tr '\\0' '\\n' < /proc/1/environ``), else ""."""
    try:
        environ = host.read_text(CONTAINER_FILES[2])
    except (OSError, UnicodeDecodeError):
        return ""
    for item in environ.split("\0"):
        if item.startswith("container="):
            return item.removeprefix("container=").strip()
    return ""
