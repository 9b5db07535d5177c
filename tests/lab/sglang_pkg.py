"""The real SGLang package (``sglang`` from PyPI, with its CUDA torch: about 11 GB) in a
venv of its own, pinned by tests/lab/sglang.lock and built once (tests/lab/engine_venv.py).

SGLang does not serve on a CPU from PyPI (its kernel package is CUDA-only), but its CLI and
its OpenAI protocol load without a GPU: ``python -m sglang.launch_server --help`` runs in
about 6 s (25 s on a busy box). tests/bench/data/record_engines.py reads both from it.

    .venv/bin/python -m tests.lab.sglang_pkg        # build (or find) it; prints its python
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.lab.engine_venv import PinnedVenv

VERSION = "0.5.23"
SGLANG = PinnedVenv(
    package="sglang",
    version=VERSION,
    lock=Path(__file__).with_name("sglang.lock"),
    import_check="sglang.srt.entrypoints.openai.protocol",
)


def sglang_python() -> Path:
    """Return the interpreter of the built SGLang venv; raise VenvUnavailable when absent."""
    return SGLANG.python()


if __name__ == "__main__":
    sys.exit(SGLANG.main())
