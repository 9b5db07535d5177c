"""Fixtures of the launch tests: an isolated quirks table, a shared engine --help cache,
and the options each ``gpudoctor check`` of a campaign's preflight ran with."""

from __future__ import annotations

from typing import Any

import pytest

from gpudoctor import runner as runner_mod
from tests.bench.campaign_support import help_cache, local_quirks

__all__ = ["asked", "help_cache", "local_quirks"]


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The options each ``gpudoctor check`` ran with (the real catalogue runs: a GPU count
    to expect cannot show in its findings on a machine without a GPU)."""
    seen: list[Any] = []
    real = runner_mod.run_checks

    def run_checks(host: Any, options: Any, **kw: Any) -> Any:
        seen.append(options)
        return real(host, options, **kw)

    monkeypatch.setattr(runner_mod, "run_checks", run_checks)
    return seen
