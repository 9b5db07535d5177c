"""Helpers of the command-line tests: run ``python -m gpudoctor`` as a real subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The documented form of every error: the last line on stderr (gpudoctor/errors.py).
ERROR_LINE = re.compile(r"^gpudoctor: error: \S.*; \S.*$")


def gpudoctor(
    *args: str, env: dict | None = None, timeout: float = 120, **kw
) -> subprocess.CompletedProcess:
    """Run ``python -m gpudoctor ARGS`` in the repo; return the finished process (text)."""
    return subprocess.run(
        [sys.executable, "-m", "gpudoctor", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        **kw,
    )


def last_line(text: str) -> str:
    """Return the last non-empty line of ``text`` ("" when there is none)."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
