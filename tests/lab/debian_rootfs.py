"""Debian root filesystems built by Debian's own ``debootstrap``, cached as tarballs.

Set-up, not a test: ``tests/run.sh`` builds each one once from the mirror this machine's
apt uses (the only download), and keeps it in :data:`CACHE` (``/var/cache/gpudoctor-tests``);
tests only unpack the cached tarball and use nothing but loopback. A tarball's name holds
a digest of the suite and package list, so changing either builds a new one.

Used by the systemd drill (tests/ops/systemd_ct.py: Debian 12 with systemd as PID 1) and
by the Proxmox-generation stand-in hosts (tests/lab/pve_generations.py: Debian 11 and 13,
the userlands of Proxmox VE 7 and 9, with their own python3 and sshd).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("GPUDOCTOR_TEST_CACHE", "/var/cache/gpudoctor-tests"))
DEFAULT_MIRROR = "http://deb.debian.org/debian"


class RootfsUnavailable(Exception):
    """The rootfs could not be built here (no debootstrap, or the mirror failed); the
    message says why."""


@dataclass(frozen=True)
class DebianRelease:
    """A Debian release to debootstrap: ``suite`` (codename), ``version`` (11, 12, 13),
    the ``packages`` installed on top of ``--variant=minbase``, and the cache ``label``."""

    suite: str
    version: int
    packages: tuple[str, ...]
    label: str

    @property
    def tarball(self) -> Path:
        """Return the cache path of this release's rootfs tarball (built or not)."""
        digest = hashlib.sha256(f"{self.suite} {','.join(self.packages)}".encode()).hexdigest()
        return CACHE / f"debian{self.version}-{self.label}-{digest[:10]}.tar"


def debian_mirror() -> str:
    """Return the Debian archive URI this machine's apt uses (one-line ``deb URI SUITE ...``
    lists or deb822 ``URIs:`` stanzas; the main archive, not ``-security``), else
    deb.debian.org. Every release's suite is served from the same archive URI."""
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.is_file() and path.suffix in (".list", ".sources", ""):
            texts.append(path.read_text(errors="replace"))
    for text in texts:
        for match in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+([a-z]+)\s", text, re.M):
            return match.group(1)
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            main_suite = suites and any("-" not in s for s in suites.group(1).split())
            if uris and main_suite and "security" not in uris.group(1):
                return uris.group(1)
    return DEFAULT_MIRROR


def rootfs_tarball(release: DebianRelease) -> Path:
    """Return ``release``'s cached rootfs tarball, built the first time with ``debootstrap
    --variant=minbase --include=PACKAGES SUITE DIR MIRROR`` (a few minutes with a
    reachable mirror). Raise :class:`RootfsUnavailable` when debootstrap is missing or
    fails. Concurrent builders each write a private file and rename it into place."""
    if release.tarball.is_file():
        return release.tarball
    if shutil.which("debootstrap") is None:
        raise RootfsUnavailable(
            "debootstrap missing (apt-get install debootstrap; tests/run.sh does)"
        )
    CACHE.mkdir(parents=True, exist_ok=True)
    work = CACHE / f"build-{release.suite}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    mirror = debian_mirror()
    try:
        done = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(release.packages)}",
             release.suite, str(work / "rootfs"), mirror],
            capture_output=True, text=True, timeout=1500,
        )  # fmt: skip
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            raise RootfsUnavailable(
                f"debootstrap {release.suite} from {mirror} failed: {' | '.join(tail)}"
            )
        partial = CACHE / f".{release.tarball.name}.{os.getpid()}"
        with tarfile.open(partial, "w") as tar:
            tar.add(work / "rootfs", arcname=".")
        os.replace(partial, release.tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return release.tarball


def unpack(release: DebianRelease, target: Path) -> Path:
    """Unpack ``release``'s cached rootfs into ``target`` (created); return ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-xf", str(rootfs_tarball(release)), "-C", str(target)],
                   check=True, timeout=600)  # fmt: skip
    return target
