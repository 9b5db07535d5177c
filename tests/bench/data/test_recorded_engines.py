"""Every recorded engine output of tests/bench/data equals what the real package at its
pinned version prints now (tests/bench/data/record_engines.py makes them): a fixture that
drifted from the real program, or that no script made from it, fails here, in CI."""

from __future__ import annotations

import pytest

from tests.bench.data.record_engines import HERE, RECORDINGS, Recording
from tests.conftest import lab_unavailable

pytestmark = pytest.mark.lab


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda r: r.name)
def test_the_recorded_file_is_what_the_real_package_prints(recording: Recording) -> None:
    try:
        recording.interpreter()
    except Exception as exc:  # the package's venv is not built here
        lab_unavailable(f"{recording.name}: {exc}")
    text = recording.make()
    recorded = (HERE / recording.name).read_text(encoding="utf-8")
    assert text == recorded, (
        f"{recording.name} differs from the real package's output: regenerate it with"
        f" python -m tests.bench.data.record_engines {recording.name}"
    )
