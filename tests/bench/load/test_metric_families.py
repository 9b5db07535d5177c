"""The expositions the loopback tests serve (tests/bench/data/metrics/*.prom, written by
record_metrics.py with chosen values) use the families a REAL vLLM 0.32.0 serves: same
names, types, help texts and label names as its recorded ``/metrics``
(tests/bench/data/metrics/vllm-0.32.0-metrics.prom, made by ``python -m
tests.bench.data.record_engines --metrics`` from a real server), and every vLLM name
the signals read is one the real server serves."""

from __future__ import annotations

import pytest

from gpudoctor.bench.load.signal_names import DIALECTS
from tests.bench.data.record_engines import METRICS, families

REAL = families(METRICS.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["vllm-start.prom", "vllm-end.prom"])
def test_the_loopback_expositions_use_the_real_families(name: str) -> None:
    ours = families((METRICS.parent / name).read_text(encoding="utf-8"))
    assert ours, name
    for family, (kind, doc, labels) in ours.items():
        assert family in REAL, f"{name}: {family} is not served by the real vLLM"
        real_kind, real_doc, real_labels = REAL[family]
        assert (kind, doc) == (real_kind, real_doc), family
        assert labels == real_labels, (family, labels, real_labels)


def test_every_vllm_name_the_signals_read_is_served_by_the_real_server() -> None:
    samples = set()
    for line in METRICS.read_text(encoding="utf-8").splitlines():
        if line.startswith("vllm:"):
            samples.add(line.split("{", 1)[0].split(" ", 1)[0])
    for signal, source in DIALECTS["vllm"].items():
        for name in (source.name, source.denominator):
            assert not name or name in samples, (signal, name)
