"""The Proxmox VE 9 stage: the test suite on Debian 13's own Python 3.13, in a chroot.

Proxmox VE 9 users pip-install gpudoctor on a Debian 13 host (Python 3.13); this machine
is Debian 12 (3.11). So ``tests/run.sh`` runs this stage after the main suite:

    .venv/bin/python -m tests.lab.python313 prepare   # set-up: the chroot (cached)
    .venv/bin/python -m tests.lab.python313 run [PYTEST ARGS]

``prepare`` (set-up; the only downloads) unpacks Debian 13's rootfs (tests/lab/
debian_rootfs.py, built by ``debootstrap`` from the apt mirror), copies this machine's
extra CA certificates (``/usr/local/share/ca-certificates``) into its trust store (the
package registry is reached through a proxy that re-signs TLS), writes a pip config
trusting that store, makes a venv with Debian's ``python3`` and installs gpudoctor with
its dependencies and the ``[test]`` extra but :data:`HEAVY` (torch and transformers: on
PyPI, torch for Linux brings the CUDA stack, about 3 GB; its CPU build lives on
download.pytorch.org, out of reach here; the two tests that run torch skip with that reason,
``GPUDOCTOR_TEST_WITHOUT_ENGINES=1``). The prepared root is cached in
``/var/cache/gpudoctor-tests`` under a digest of pyproject.toml and the rootfs.

``run`` bind-mounts the checkout read-only at ``/src`` (with private ``/proc``, ``/dev``,
``/sys``, ``/tmp`` mounts in a private mount namespace: ``unshare --mount``, nothing
leaks) and runs pytest there with DeprecationWarnings as errors, on :data:`SUITE` unless
other arguments are given. Only loopback is used.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import tomllib

from tests.lab.debian_rootfs import CACHE, RootfsUnavailable, unpack
from tests.lab.pve_generations import PY313

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers")
"""Requirements of the [test] extra left out of the chroot (see the module docstring)."""
SUITE = ("tests/unit", "-m", "not lab and not slow and not gpu")
"""What runs on 3.13 by default: the unit tests (the lab's remote programs run on Debian 11
and 13 stand-in hosts: tests/lab/test_pve_generations.py). Other folders run with
``run tests/cli tests/pve -m "not lab and not slow"`` (27 min here beside other work;
CI's budget keeps the stage to the unit tests)."""
VENV = "/opt/gpudoctor-venv"
EXTRA_CA = Path("/usr/local/share/ca-certificates")


def requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """Return the project's dependencies plus its ``[test]`` extra, without :data:`HEAVY`
    (a requirement is dropped when its name, before any ``[``/version, is in HEAVY)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"]]

    def name(req: str) -> str:
        for stop in "[<>=!~; ":
            req = req.split(stop, 1)[0]
        return req.lower()

    return [req for req in wanted if name(req) not in HEAVY]


def prepared_root() -> Path:
    """Return the path of the prepared chroot for this pyproject.toml (built or not)."""
    key = f"{PY313.tarball.name}\n{(REPO / 'pyproject.toml').read_text()}"
    return CACHE / f"py313-root-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def _chroot(root: Path, script: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``sh -c script`` chrooted in ``root`` with /proc, /dev, /sys and a fresh /tmp
    mounted, the checkout read-only at /src, in a private mount namespace; the output
    goes to this process's stdout and stderr."""
    mounts = " && ".join([
        f"mount -t proc proc {root}/proc", f"mount --rbind /dev {root}/dev",
        f"mount --rbind /sys {root}/sys", f"mount -t tmpfs tmpfs {root}/tmp",
        f"mkdir -p {root}/src", f"mount --bind {REPO} {root}/src",
        f"mount -o remount,bind,ro {root}/src",
    ])  # fmt: skip
    env = ["env", "-i", f"PATH={VENV}/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
           "LANG=C.UTF-8", "GPUDOCTOR_TEST_WITHOUT_ENGINES=1", "PYTHONDONTWRITEBYTECODE=1"]  # fmt: skip
    inner = f"{mounts} && exec chroot {root} {shlex.join(env)} sh -c {shlex.quote(script)}"
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", inner],
        text=True, timeout=timeout, check=False,
    )  # fmt: skip


def prepare() -> Path:
    """Build the prepared chroot when missing (see the module docstring); return it.
    Raise RootfsUnavailable when it cannot be built (the reason in the message)."""
    root = prepared_root()
    if (root / VENV.lstrip("/") / "bin/pytest").exists():
        return root
    partial = root.with_name(root.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    unpack(PY313, partial)
    for cert in EXTRA_CA.glob("*.crt"):
        shutil.copy(cert, partial / "usr/local/share/ca-certificates" / cert.name)
    shutil.copy("/etc/resolv.conf", partial / "etc/resolv.conf")
    (partial / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    reqs = " ".join(shlex.quote(r) for r in requirements())
    script = (
        "set -e; update-ca-certificates >/dev/null; "
        f"python3 -m venv {VENV}; {VENV}/bin/python -m pip install -q --upgrade pip; "
        f"{VENV}/bin/python -m pip install -q {reqs}; "
        f"{VENV}/bin/python -m pip install -q --no-deps /src"
    )
    done = _chroot(partial, script, timeout=1500)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise RootfsUnavailable(
            f"installing gpudoctor on Python 3.13 failed (rc {done.returncode})"
        )
    for stale in CACHE.glob("py313-root-*"):  # an older pyproject's root
        if stale != partial:
            shutil.rmtree(stale, ignore_errors=True)
    partial.rename(root)
    return root


def run(pytest_args: list[str]) -> int:
    """Run pytest on Python 3.13 in the prepared chroot (DeprecationWarnings as errors);
    return its exit status."""
    root = prepare()
    args = pytest_args or list(SUITE)
    script = (
        f"cd /src && python3 --version && {VENV}/bin/python -m pytest -q -p no:cacheprovider "
        f"-W error::DeprecationWarning {shlex.join(args)}"
    )
    return _chroot(root, script, timeout=3000).returncode


def main(argv: list[str]) -> int:
    """``prepare`` or ``run [PYTEST ARGS]``; return the exit status (1: set-up failed)."""
    started = time.monotonic()
    try:
        if argv[:1] == ["prepare"]:
            print(f"tests/lab/python313: {prepare()}")
            return 0
        if argv[:1] == ["run"]:
            status = run(argv[1:])
            print(f"tests/lab/python313: pytest on 3.13 exited {status} "
                  f"after {time.monotonic() - started:.0f} s")  # fmt: skip
            return status
    except RootfsUnavailable as exc:
        print(f"tests/lab/python313: {exc}", file=sys.stderr)
        return 1
    print("usage: python -m tests.lab.python313 prepare | run [PYTEST ARGS]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
