"""Speculative accept length: SGLang's fields, flush-then-read, and multi-token chunks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpudoctor.bench.cell_spec import CellTarget, WorkloadSpec
from gpudoctor.bench.load.accept_length import from_records, from_server_info
from gpudoctor.bench.load.loadgen import measure_cell
from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results.metrics import request_itls_s
from tests.fakes.sglang import LIFETIME_ACCEPT, FakeSglang

SPEC = WorkloadSpec(input_len=16, output_len=8, num_prompts=6, ignore_eos=True, warmup=1)


def test_server_info_shapes() -> None:
    # sglang 0.5.5 http_server.get_server_info: {**server_args, "internal_states": [...]}
    assert from_server_info({"internal_states": [{"avg_spec_accept_length": 3.25}]}) == 3.25
    # PD disaggregation: the decode server's state
    pd = {"decode": [{"internal_states": [{"avg_spec_accept_length": 2.5}]}]}
    assert from_server_info(pd) == 2.5
    assert from_server_info({"internal_states": [{}]}) is None  # no speculative decoding
    assert from_server_info({"version": "0.5.5"}) is None


def test_from_records_sums_over_requests() -> None:
    rows = [
        RequestRecord(0, 1, 8, 0.0, ok=True, output_tokens=8, spec_verify_ct=4),
        RequestRecord(1, 1, 9, 0.0, ok=True, output_tokens=9, spec_verify_ct=3),
        RequestRecord(2, 1, 9, 0.0, ok=False, output_tokens=0, spec_verify_ct=5),
    ]
    assert from_records(rows) == pytest.approx(17 / 7)
    assert from_records(rows[2:]) is None


@pytest.mark.parametrize("info_path", ["/get_server_info", "/server_info"])
def test_flush_then_server_info_gives_the_cell_value(tiny_model_dir: Path, info_path: str) -> None:
    """Older SGLang serves /get_server_info, newer /server_info (the old one deprecated):
    the cell's value comes from whichever exists, the new one asked first."""
    with FakeSglang(info_path=info_path) as srv:
        target = CellTarget(srv.url, "m", str(tiny_model_dir), flush_cache_path="/flush_cache")
        cell = measure_cell(target, SPEC, 3)
        assert srv.flushes == 1
        assert srv.info_requests[0] == "/server_info" and srv.info_requests[-1] == info_path
    assert cell["accept_length"] == pytest.approx(2.0)  # not the lifetime gauge
    assert cell["accept_length"] != LIFETIME_ACCEPT
    assert cell["accept_length_source"] == "server_info"
    assert cell["completed"] == 6


def test_without_flush_the_gauge_is_not_used(tiny_model_dir: Path) -> None:
    with FakeSglang() as srv:
        cell = measure_cell(CellTarget(srv.url, "m", str(tiny_model_dir)), SPEC, 2)
    assert cell["accept_length"] is None


def test_meta_info_per_request_and_multi_token_chunks(tiny_model_dir: Path, tmp_path: Path) -> None:
    import json

    raw = tmp_path / "raw.jsonl"
    with FakeSglang(meta_info=True) as srv:
        target = CellTarget(srv.url, "m", str(tiny_model_dir), raw_path=raw)
        plain = measure_cell(target, SPEC, 2)  # counts and times only: no text, no split
        assert plain["metrics"]["itl_split_by_tokens"] is False
        lines = raw.read_text().splitlines()
        assert len(lines) == SPEC.num_prompts  # one raw record per request
        assert all(not json.loads(x)["text_chunks"] for x in lines)
        raw.unlink()
        cell = measure_cell(target, SPEC, 2, keep_text=True)
    assert cell["accept_length"] == pytest.approx(2.0)
    assert cell["accept_length_source"] == "meta_info"
    records = [RequestRecord.from_json(json.loads(x)) for x in raw.read_text().splitlines()]
    assert len(records) == SPEC.num_prompts
    assert all(r.text_chunks for r in records)
    assert cell["metrics"]["itl_split_by_tokens"] is True
    itls = []
    for r in records:
        # the raw line is written as the request ends: the chunks that arrived (and the
        # server's claim); the cell counts the kept text's tokens (issue 45.1)
        assert len(r.chunk_times_s) == 4 and r.output_tokens == 4
        assert r.usage_completion_tokens == 8
        # each chunk's text re-tokenizes to two tokens: 3 gaps, each split over 2 tokens
        split = replace(r, chunk_tokens=(2, 2, 2, 2))
        assert len(request_itls_s(split)) == 6
        itls += request_itls_s(split)
    assert cell["metrics"]["mean_itl_ms"] == pytest.approx(1000 * sum(itls) / len(itls))
    assert cell["metrics"]["total_output_tokens"] == 8 * SPEC.num_prompts
    assert cell["metrics"]["token_count_mismatches"] == 0  # the text's tokens = the claim
