"""A live vLLM 0.32.0's ``/metrics`` against the recorded one
(tests/bench/data/metrics/vllm-0.32.0-metrics.prom, made by ``python -m
tests.bench.data.record_engines --metrics`` from a real server with speculative
decoding): every ``vllm:`` family the live server serves is recorded with the same type,
help text and label names. A vLLM that renamed or relabelled a family fails here."""

from __future__ import annotations

import httpx
import pytest

from tests.bench.data.record_engines import METRICS, families
from tests.bench.vllm.serve import VllmServer

pytestmark = pytest.mark.lab


def test_the_live_servers_families_are_the_recorded_ones(vllm_server: VllmServer) -> None:
    httpx.post(vllm_server.base_url + "/v1/completions", timeout=300,
               json={"model": str(vllm_server.model_dir), "prompt": "the of", "max_tokens": 4})  # fmt: skip
    live = families(httpx.get(vllm_server.base_url + "/metrics", timeout=30).text)
    recorded = families(METRICS.read_text(encoding="utf-8"))
    assert len(live) > 20
    for name, facts in live.items():
        assert recorded.get(name) == facts, (name, facts, recorded.get(name))
    spec_only = {n for n in recorded if "spec_decode" in n}
    assert spec_only and set(recorded) - set(live) <= spec_only  # only the drafter's differ
