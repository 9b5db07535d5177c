"""Wait for a server process of a test to answer its health URL (the loop the test
servers of tests/bench share: vLLM's and transformers' ``serve``)."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_healthy(
    process: subprocess.Popen, url: str, timeout_s: float, poll_s: float = 0.5
) -> bool:
    """Return True once ``GET url`` answers 200 (``curl -fs URL``), False when ``process``
    exits first or ``timeout_s`` seconds pass (the caller stops it and says why)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    return False
