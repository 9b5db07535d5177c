"""Start and stop a REAL OpenAI-compatible LLM server: ``transformers serve`` on loopback.

Not a fake: the real Hugging Face server (FastAPI/uvicorn, ``model.generate()``) serving
the tiny Llama model of ``tests/support/tiny_llm.py`` on the CPU
(docs/recipes/cpu_llm_server.md). Used by the bench tests and the benchmarks.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.http_ready import wait_healthy
from tests.support.signals import default_signals


@dataclass
class LlmServer:
    """A running ``transformers serve`` process."""

    process: subprocess.Popen[bytes]
    base_url: str
    model: str
    model_dir: Path
    log_path: Path

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (SIGTERM, SIGKILL after 15 s); safe to call twice."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_port() -> int:
    """Return a TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_llm_server(
    model_dir: Path,
    log_path: Path,
    extra_args: tuple[str, ...] = (),
    timeout_s: float = 180,
    device: str = "cpu",
) -> LlmServer:
    """Start ``transformers serve`` for ``model_dir`` on a free port; return once /health is 200.

    Shell equivalent: ``transformers serve tiny-llm --host 127.0.0.1 --port PORT --device cpu``
    run in the model's parent directory (``device``: ``cpu`` or ``cuda``). Raises RuntimeError if it exits or never gets ready.
    """
    port = free_port()
    exe = Path(sys.executable).parent / "transformers"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    log = open(log_path, "wb")  # noqa: SIM115 (kept open by the child)
    process = subprocess.Popen(
        [str(exe), "serve", model_dir.name, "--host", "127.0.0.1", "--port", str(port),
         "--device", device, *extra_args],
        cwd=model_dir.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=default_signals,  # stop() sends SIGTERM
    )  # fmt: skip
    log.close()
    server = LlmServer(process, f"http://127.0.0.1:{port}", model_dir.name, model_dir, log_path)
    if wait_healthy(process, server.base_url + "/health", timeout_s, poll_s=0.2):
        return server
    if process.poll() is not None:
        raise RuntimeError(
            f"transformers serve exited with {process.returncode}: "
            + log_path.read_text(errors="replace")[-2000:]
        )
    server.stop()
    raise RuntimeError(f"transformers serve not ready after {timeout_s} s")
