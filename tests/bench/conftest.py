"""Bench fixtures: a real ``transformers serve`` with the tiny model, shared by the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bench.llm_server import LlmServer, start_llm_server


@pytest.fixture(scope="session")
def llm_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlmServer]:
    """Yield a running real ``transformers serve`` (default mode) shared across tests."""
    log = tmp_path_factory.mktemp("llm-server") / "serve.log"
    server = start_llm_server(tiny_model_dir, log)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_llm_server(tiny_model_dir: Path, tmp_path: Path) -> Iterator[LlmServer]:
    """Yield a private real server that the test may kill (stopped afterwards in any case)."""
    server = start_llm_server(tiny_model_dir, tmp_path / "serve.log")
    try:
        yield server
    finally:
        server.stop()
