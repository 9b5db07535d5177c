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


def test_the_sglang_expositions_use_families_the_real_package_defines() -> None:
    """tests/bench/data/metrics/sglang-*.prom (chosen values) against the real SGLang 0.5.23:
    each family is defined in its source with the same name and help text
    (``sglang/srt/observability/metrics_collector.py``: ``name="sglang:..."`` then
    ``documentation="..."``; a Counter may be declared with or without ``_total``)."""
    import re

    from tests.bench.data.record_engines import families
    from tests.lab.sglang_pkg import sglang_python

    try:
        python = sglang_python()
    except Exception as exc:
        lab_unavailable(str(exc))
    site = next(python.parent.parent.glob("lib/python3*/site-packages"))
    source = (site / "sglang/srt/observability/metrics_collector.py").read_text()
    declared = dict(re.findall(r'name="(sglang:[\w:]+)",\s*documentation="([^"]*)"', source))
    for name in ("sglang-start.prom", "sglang-end.prom"):
        text = (HERE / "metrics" / name).read_text(encoding="utf-8")
        for family, (kind, doc, _) in families(text, "sglang:").items():
            if family.endswith("_created"):
                continue  # prometheus_client's own companion of a counter
            real = declared.get(family, declared.get(family + "_total"))
            assert real == doc, (name, family, kind, doc, real)
