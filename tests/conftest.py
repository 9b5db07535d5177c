"""Shared pytest configuration: lab fixtures, the tiny LLM, and the lab-required switch.

``GPUDOCTOR_REQUIRE_LAB=1`` (set by .ci/run) turns every "lab cannot start" skip into a
failure, so CI can never go green with the real-system tests silently skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.lab.fixtures"]

REQUIRE_LAB = os.environ.get("GPUDOCTOR_REQUIRE_LAB") == "1"


def lab_unavailable(reason: str) -> None:
    """Skip the calling test with ``reason``, or fail it when the lab is required (CI)."""
    if REQUIRE_LAB:
        pytest.fail(f"lab required (GPUDOCTOR_REQUIRE_LAB=1) but unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a directory holding the tiny Llama model (built once per test session)."""
    from tests.support.tiny_llm import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llm")
