"""measure_cell against a REAL `transformers serve` with the tiny model (see tests/bench/conftest.py).

The tiny model never emits EOS, so every request must run to exactly max_tokens.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest

from gpudoctor.bench.cell_spec import SLO, CellTarget, WorkloadSpec
from gpudoctor.bench.load.loadgen import measure_cell
from gpudoctor.bench.request_record import RequestRecord
from tests.bench.counting_proxy import CountingProxy
from tests.bench.llm_server import LlmServer

np = pytest.importorskip("numpy")


def _target(
    server: LlmServer, raw: Path | None = None, base_url: str | None = None, **kw
) -> CellTarget:
    return CellTarget(base_url or server.base_url, server.model, str(server.model_dir),
                      raw_path=raw, **kw)  # fmt: skip


def _raw(path: Path, run_id: str) -> list[RequestRecord]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [RequestRecord.from_json(r) for r in rows if r["run_id"] == run_id]


def test_real_cell_metrics_follow_their_definitions(llm_server: LlmServer, tmp_path: Path) -> None:
    raw_path = tmp_path / "raw.jsonl"
    spec = WorkloadSpec(input_len=48, output_len=12, num_prompts=9, seed=1, ignore_eos=False)
    first = measure_cell(_target(llm_server, raw_path), spec, 3)
    median_ttft = first["metrics"]["median_ttft_ms"]
    slo = SLO(ttft_ms=median_ttft)
    cell = measure_cell(_target(llm_server, raw_path), spec, 3, slo)
    records = _raw(raw_path, cell["client"]["run_id"])
    assert len(records) == 9 and all(r.ok for r in records)
    assert len(raw_path.read_text().splitlines()) == 18  # appended, both runs kept

    m, dur = cell["metrics"], cell["duration_s"]
    ttft = np.array([r.chunk_times_s[0] for r in records]) * 1000
    e2e = np.array([r.e2e_s for r in records]) * 1000
    out = np.array([r.usage_completion_tokens for r in records])
    tpot = (e2e - ttft) / (out - 1)
    itl = np.concatenate([np.diff(r.chunk_times_s) for r in records]) * 1000
    assert m["completed"] == cell["completed"] == 9
    assert m["mean_ttft_ms"] == pytest.approx(ttft.mean())
    assert m["p99_ttft_ms"] == pytest.approx(np.percentile(ttft, 99))
    assert m["std_ttft_ms"] == pytest.approx(ttft.std())
    assert m["mean_tpot_ms"] == pytest.approx(tpot.mean())
    assert m["median_itl_ms"] == pytest.approx(np.median(itl))
    assert m["p95_itl_ms"] == pytest.approx(np.percentile(itl, 95))
    assert m["mean_e2e_ms"] == pytest.approx(e2e.mean())
    assert m["output_throughput"] == pytest.approx(out.sum() / dur)
    assert m["total_throughput"] == pytest.approx((out.sum() + 9 * 48) / dur)
    assert m["request_throughput"] == pytest.approx(9 / dur)
    good = sum(1 for t in ttft if t <= median_ttft)
    assert m["good_requests"] == good and m["goodput"] == pytest.approx(good / dur)
    assert m["slo_attainment"] == pytest.approx(good / 9)
    for r in records:  # E2E ends at the last event (the usage chunk), after the last token
        assert r.e2e_s >= r.chunk_times_s[-1] and r.wall_s >= r.e2e_s
        assert r.send_s + r.wall_s <= dur + 1e-6
    assert cell["telemetry"] == {}  # no GPU on this machine: no fields, not zeros
    assert cell["accept_length"] is None
    assert cell["errors"] == dict.fromkeys(cell["errors"], 0)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_every_request_returns_exactly_max_tokens(llm_server: LlmServer, api: str) -> None:
    spec = WorkloadSpec(input_len=40, output_len=16, range_ratio=0.5, num_prompts=6, seed=5,
                        api=api, ignore_eos=False, warmup=1)  # fmt: skip
    raw = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpudoctor-max-tokens-{api}-{os.getpid()}.jsonl"
    try:
        cell = measure_cell(_target(llm_server, raw), spec, 2)
        records = _raw(raw, cell["client"]["run_id"])
    finally:
        raw.unlink(missing_ok=True)
    assert cell["completed"] == 6
    assert len({r.max_tokens for r in records}) > 1  # range ratio really varied max_tokens
    for r in records:
        assert r.output_tokens == r.max_tokens == r.usage_completion_tokens
        # one SSE chunk per token, except that a token decoding to nothing on its own is
        # streamed with the next one (seen with this tokenizer, rarely)
        assert r.max_tokens - 2 <= len(r.chunk_times_s) <= r.max_tokens
        assert r.usage_prompt_tokens == r.prompt_len  # our tokenizer count == the server's
        assert r.finish_reason == "length"


def test_concurrency_is_really_bounded(llm_server: LlmServer) -> None:
    port = int(llm_server.base_url.rsplit(":", 1)[1])
    spec = WorkloadSpec(input_len=32, output_len=8, num_prompts=8, ignore_eos=False, warmup=0)
    with CountingProxy(port) as proxy:
        cell = measure_cell(_target(llm_server, base_url=proxy.base_url), spec, 2)
    assert cell["completed"] == 8
    assert proxy.requests == 8  # every request crossed the wire once
    assert proxy.peak == 2  # the server never saw more than 2, and did see 2
    assert cell["client"]["max_in_flight"] == 2


def test_killed_server_gives_errors_by_kind_and_a_partial_record(
    own_llm_server: LlmServer, tmp_path: Path
) -> None:
    spec = WorkloadSpec(input_len=32, output_len=24, num_prompts=12, ignore_eos=False)
    seen: list[tuple[int, int]] = []

    def kill_after_three(done: int, total: int) -> None:
        seen.append((done, total))
        if done == 3:
            own_llm_server.process.send_signal(signal.SIGKILL)

    raw = tmp_path / "raw.jsonl"
    cell = measure_cell(_target(own_llm_server, raw), spec, 2, progress=kill_after_three,
                        timeout_s=30)  # fmt: skip
    errors = cell["errors"]
    assert 3 <= cell["completed"] < 12
    assert sum(errors.values()) == 12 - cell["completed"]
    assert errors["disconnect"] >= 1  # in flight when the server died
    assert errors["connect"] >= 1  # sent after it died
    assert errors["disconnect"] + errors["connect"] == 12 - cell["completed"]
    assert seen[-1] == (12, 12)  # progress covered every request, failed ones too
    records = _raw(raw, cell["client"]["run_id"])
    assert len(records) == 12 and all(r.error for r in records if not r.ok)
    assert cell["metrics"]["completed"] == cell["completed"]


def test_strict_server_rejects_ignore_eos_as_http_4xx(llm_server: LlmServer) -> None:
    spec = WorkloadSpec(input_len=16, output_len=4, num_prompts=3, ignore_eos=True, warmup=1)
    cell = measure_cell(_target(llm_server, flush_cache_path="/flush_cache"), spec, 2)
    # fail fast (issue 31): the warmup's 4xx ends the cell; no request bound to fail is sent
    assert cell["completed"] == 0 and sum(cell["errors"].values()) == 0
    assert cell["client"]["warmup"]["rejected"] is True
    assert "ignore_eos" in cell["client"]["warmup"]["first_error"]
    assert cell["first_error"]["status_code"] == 422
    assert "Unexpected fields in the request" in cell["first_error"]["message"]
    assert cell["accept_length"] is None
    assert cell["metrics"]["mean_ttft_ms"] is None
    spec = WorkloadSpec(input_len=16, output_len=4, num_prompts=3, ignore_eos=True, warmup=0)
    cell = measure_cell(_target(llm_server, flush_cache_path="/flush_cache"), spec, 2)
    assert cell["completed"] == 0 and cell["errors"]["http_4xx"] == 3  # no warmup: all sent
    assert cell["client"]["flush_cache_error"] == "HTTP 404"  # not an SGLang server


def test_poisson_arrivals_respect_the_drawn_intervals(
    llm_server: LlmServer, tmp_path: Path
) -> None:
    spec = WorkloadSpec(input_len=16, output_len=4, num_prompts=6, ignore_eos=False, warmup=0,
                        request_rate=25.0, seed=11)  # fmt: skip
    raw = tmp_path / "raw.jsonl"
    cell = measure_cell(_target(llm_server, raw), spec, 6)
    records = sorted(_raw(raw, cell["client"]["run_id"]), key=lambda r: r.index)
    rng = random.Random(11)
    gaps = [rng.expovariate(25.0) for _ in range(5)]
    sends = [r.send_s for r in records]
    assert sends == sorted(sends)
    for k in range(1, 6):  # asyncio.sleep never wakes early: sends lag their schedule
        assert sends[k] - sends[0] >= sum(gaps[:k]) - 1e-3
    assert cell["completed"] == 6
