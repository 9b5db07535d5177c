"""Fixtures of the real-vLLM tests: the pinned vLLM venv (tests/lab/vllm_cpu.py), a
scratch directory for its caches, and one running server for the tests that measure a
running server (``[engine] server_url``). A missing venv skips with its reason, or fails
under ``GPUDOCTOR_REQUIRE_LAB=1`` (CI)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bench.campaign_support import help_cache, local_quirks
from tests.bench.vllm.serve import VllmServer, start_vllm, without_chat_template
from tests.conftest import lab_unavailable
from tests.lab.vllm_cpu import VllmUnavailable, vllm_python

__all__ = ["help_cache", "local_quirks"]

pytestmark = pytest.mark.lab


@pytest.fixture(scope="session")
def vllm_py() -> Path:
    """Return the interpreter of the real vLLM venv (skip, or fail in CI, without it)."""
    try:
        return vllm_python()
    except VllmUnavailable as exc:
        lab_unavailable(str(exc))
        raise


@pytest.fixture(scope="session")
def vllm_scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return the session's directory for vLLM's caches and temporary files."""
    return tmp_path_factory.mktemp("vllm-scratch")


@pytest.fixture(scope="session")
def base_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return the tiny Llama without a chat template (a base model)."""
    return without_chat_template(tiny_model_dir, tmp_path_factory.mktemp("base") / "tiny-base")


@pytest.fixture(scope="session")
def vllm_server(vllm_py: Path, vllm_scratch: Path, base_model_dir: Path) -> Iterator[VllmServer]:
    """One real ``vllm serve`` for the session: the template-less tiny model, a KV cache of
    8 blocks of 128 tokens (1024 tokens: at most two 512-token requests at once, so load
    makes requests wait and be preempted), prefix caching on (vLLM's default)."""
    server = start_vllm(vllm_py, base_model_dir, vllm_scratch, ("--num-gpu-blocks-override", "8"))
    yield server
    server.stop()
