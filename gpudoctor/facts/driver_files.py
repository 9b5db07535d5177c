"""The host's NVIDIA user-space driver files, as the installed driver lists them.

Never a hand-kept list: the list is read from the host, first source that answers wins:

1. ``nvidia-container-cli list`` (libnvidia-container: the driver's compute and utility
   files, binaries and firmware, resolved for the loaded driver);
2. the distribution's package of ``libcuda.so.VERSION`` (``dpkg -S`` then ``dpkg -L``,
   or ``rpm -qf`` then ``rpm -ql``);
3. a scan of the directory holding ``libcuda.so.VERSION`` for every ``*.so.VERSION``
   (what the ``.run`` installer puts there; it keeps no per-file manifest on the host),
   plus ``nvidia-smi`` and ``/lib/firmware/nvidia/VERSION``.

VERSION is the loaded module's (``/proc/driver/nvidia/version``). Tests and odd layouts
may name the version file and the library directories: ``GPUDOCTOR_NVIDIA_VERSION_FILE``,
``GPUDOCTOR_DRIVER_LIB_DIRS`` (``:``-separated; replaces ``ldconfig -p``) and
``GPUDOCTOR_DRIVER_BIN_DIRS``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gpudoctor.facts.procfs import parse_driver_version
from gpudoctor.hosts.base import Host

VERSION_FILE = "/proc/driver/nvidia/version"
BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin", "/usr/sbin")


@dataclass(frozen=True)
class DriverFile:
    """One file of the driver.

    Attributes:
        path: its path on the host (``/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04``).
        kind: ``lib``, ``bin`` or ``firmware``.
        stable: a path to bind that does not name the version and leads to the same file
            (the soname link ``libcuda.so.1``), or "" when the driver ships none.
    """

    path: str
    kind: str
    stable: str = ""

    @property
    def name(self) -> str:
        """Return the file name (``libcuda.so.580.159.04``)."""
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class DriverFiles:
    """The driver's user-space files on a host.

    Attributes:
        version: the loaded module's version ("" when no module is loaded).
        source: where the list came from (``nvidia-container-cli list``, ``dpkg -L
            libnvidia-compute-580``, ``scan of /usr/lib/x86_64-linux-gnu``).
        files: the files.
        error: why no list could be read ("" when one was).
    """

    version: str
    source: str = ""
    files: tuple[DriverFile, ...] = ()
    error: str = ""

    def of_kind(self, kind: str) -> list[DriverFile]:
        """Return the files of one kind."""
        return [f for f in self.files if f.kind == kind]


def _lines(host: Host, argv: list[str]) -> list[str] | None:
    result = host.run(argv, timeout=30)
    return [ln.strip() for ln in result.stdout.splitlines() if ln.strip()] if result.ok else None


def _kind(path: str, version: str) -> str:
    if path.startswith(("/lib/firmware/", "/usr/lib/firmware/")):
        return "firmware" if path.rstrip("/").endswith(f"/nvidia/{version}") else ""
    if re.search(r"\.so(\.\d[\w.]*)?$", path):
        return "lib"
    if ("/bin/" in path or "/sbin/" in path) and path.rsplit("/", 1)[-1].startswith("nvidia-"):
        return "bin"
    return ""


def driver_version(host: Host) -> str:
    """Return the loaded module's version (``cat /proc/driver/nvidia/version``), or ""."""
    path = os.environ.get("GPUDOCTOR_NVIDIA_VERSION_FILE") or VERSION_FILE
    try:
        parsed = parse_driver_version(host.read_text(path))
    except OSError:
        return ""
    return parsed.version if parsed else ""


def lib_dirs(host: Host) -> list[str]:
    """Return the directories that hold ``libcuda.so.1`` for the host's loader
    (``ldconfig -p``), or ``$GPUDOCTOR_DRIVER_LIB_DIRS``."""
    forced = os.environ.get("GPUDOCTOR_DRIVER_LIB_DIRS")
    if forced:
        return [d for d in forced.split(":") if d]
    dirs = []
    for line in _lines(host, ["ldconfig", "-p"]) or []:
        match = re.match(r"^libcuda\.so\.1 \(([^)]*)\) => (/\S+)$", line)
        if match and "64" in match.group(1):  # x86-64, AArch64: not a 32-bit (libc6) copy
            dirs.append(match.group(2).rsplit("/", 1)[0])
    return list(dict.fromkeys(dirs))


def _stable(names: set[str], name: str, version: str) -> str:
    """Return the soname link beside ``name`` (``libcuda.so.1`` for libcuda.so.V), or ""."""
    if not name.endswith(f".so.{version}"):
        return ""
    base = name[: -len(version)]
    links = sorted(n for n in names if n.startswith(base) and re.fullmatch(r"\d+", n[len(base) :]))
    return links[0] if links else ""


def _with_stable(host: Host, paths: list[str], version: str) -> tuple[DriverFile, ...]:
    listings: dict[str, set[str]] = {}
    files = []
    for path in dict.fromkeys(paths):
        kind = _kind(path, version)
        if not kind:
            continue
        folder, name = path.rsplit("/", 1)
        if kind == "lib" and folder not in listings:
            try:
                listings[folder] = set(host.list_dir(folder))
            except OSError:
                listings[folder] = set()
        stable = _stable(listings.get(folder, set()), name, version) if kind == "lib" else ""
        if kind == "lib" and not name.endswith(f".so.{version}") and not stable:
            continue  # a soname link or a .so dev link: its target is listed itself
        files.append(DriverFile(path, kind, f"{folder}/{stable}" if stable else ""))
    return tuple(files)


def read_driver_files(host: Host) -> DriverFiles:
    """Return the host's driver files (see the module docstring for the order of sources);
    ``error`` says why when none could be read."""
    version = driver_version(host)
    if not version:
        return DriverFiles("", error="no NVIDIA kernel module is loaded (no driver version)")
    if not os.environ.get("GPUDOCTOR_DRIVER_LIB_DIRS"):
        listed = _lines(host, ["nvidia-container-cli", "list"])
        if listed:
            files = [
                p for p in listed if p.startswith("/") and not p.startswith(("/dev/", "/run/"))
            ]
            found = _with_stable(host, files, version)
            if found:
                return DriverFiles(version, "nvidia-container-cli list", found)  # lists smi too
    dirs = lib_dirs(host)
    anchor = next((d for d in dirs if host.exists(f"{d}/libcuda.so.{version}")), "")
    if not anchor:
        where = ", ".join(dirs) or "no directory (ldconfig -p knows no libcuda.so.1)"
        return DriverFiles(version, error=f"libcuda.so.{version} is not in {where}")
    packaged = _package_files(host, f"{anchor}/libcuda.so.{version}")
    if packaged:
        source, paths = packaged
    else:
        names = host.list_dir(anchor)
        source = f"scan of {anchor} for *.so.{version}"
        paths = [f"{anchor}/{n}" for n in names if n.endswith(f".so.{version}")]
    bins = os.environ.get("GPUDOCTOR_DRIVER_BIN_DIRS", ":".join(BIN_DIRS)).split(":")
    smi = next((f"{d}/nvidia-smi" for d in bins if d and host.exists(f"{d}/nvidia-smi")), "")
    if smi and not any(p.endswith("/nvidia-smi") for p in paths):
        paths.append(smi)
    found = _with_stable(host, paths, version)
    firmware = f"/lib/firmware/nvidia/{version}"
    if host.exists(firmware) and not any(f.kind == "firmware" for f in found):
        found = (*found, DriverFile(firmware, "firmware"))
    return DriverFiles(version, source, found)


def _package_files(host: Host, lib: str) -> tuple[str, list[str]] | None:
    """Return (source, paths) of the package owning ``lib`` (dpkg, else rpm), or None."""
    owner = _lines(host, ["dpkg", "-S", lib])
    if owner:
        package = owner[0].split(":", 1)[0].split(",")[0].strip()
        listed = _lines(host, ["dpkg", "-L", package])
        if listed:
            return f"dpkg -L {package}", listed
    owner = _lines(host, ["rpm", "-qf", lib])
    if owner and "not owned" not in owner[0]:
        listed = _lines(host, ["rpm", "-ql", owner[0]])
        if listed:
            return f"rpm -ql {owner[0]}", listed
    return None
