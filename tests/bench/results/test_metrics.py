"""Pure metric tests on hand-made records; every expected number was computed by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpudoctor.bench.cell_spec import SLO
from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results.metrics import (
    compute_metrics,
    count_errors,
    max_in_flight,
    percentile,
    request_itls_s,
)


def _records() -> list[RequestRecord]:
    return [
        # 4 one-token chunks: TPOT (0.5-0.1)/3 s; ITL 100, 100, 200 ms
        RequestRecord(0, 10, 4, send_s=0.0, ok=True, ttft_s=0.1, e2e_s=0.5, wall_s=0.5,
                      chunk_times_s=(0.1, 0.2, 0.3, 0.5), chunk_tokens=(1, 1, 1, 1),
                      output_tokens=4),
        # the middle chunk holds 2 tokens: its 0.4 s gap counts as 2 x 200 ms; then 400 ms
        RequestRecord(1, 20, 4, send_s=0.1, ok=True, ttft_s=0.2, e2e_s=1.0, wall_s=1.0,
                      chunk_times_s=(0.2, 0.6, 1.0), chunk_tokens=(1, 2, 1), output_tokens=4),
        RequestRecord(2, 99, 4, send_s=0.2, ok=False, wall_s=0.05, error_kind="disconnect"),
        # a single token: no TPOT, no ITL
        RequestRecord(3, 30, 1, send_s=0.6, ok=True, ttft_s=0.3, e2e_s=0.3, wall_s=0.3,
                      chunk_times_s=(0.3,), chunk_tokens=(1,), output_tokens=1),
    ]  # fmt: skip


def test_throughputs_and_counts() -> None:
    m = compute_metrics(_records(), duration_s=2.0)
    assert m["completed"] == 3 and m["failed"] == 1
    assert m["total_input_tokens"] == 60  # the failed request's 99 is not counted
    assert m["total_output_tokens"] == 9
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["input_throughput"] == pytest.approx(30.0)
    assert m["output_throughput"] == pytest.approx(4.5)
    assert m["total_throughput"] == pytest.approx(34.5)
    assert m["concurrency"] == pytest.approx(0.9)  # (0.5 + 1.0 + 0.3) / 2


def test_ttft_statistics() -> None:
    m = compute_metrics(_records(), duration_s=2.0)
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["std_ttft_ms"] == pytest.approx(math.sqrt(20000 / 3))  # population std
    assert m["p90_ttft_ms"] == pytest.approx(280.0)
    assert m["p95_ttft_ms"] == pytest.approx(290.0)
    assert m["p99_ttft_ms"] == pytest.approx(298.0)
    assert m["max_ttft_ms"] == pytest.approx(300.0)


def test_tpot_itl_e2e_statistics() -> None:
    m = compute_metrics(_records(), duration_s=2.0)
    assert m["mean_tpot_ms"] == pytest.approx(200.0)  # (133.33 + 266.67) / 2
    assert m["std_tpot_ms"] == pytest.approx(200 / 3)
    assert m["p90_tpot_ms"] == pytest.approx(400 / 3 + 0.9 * 400 / 3)
    assert m["max_tpot_ms"] == pytest.approx(800 / 3)
    # ITL values: 100, 100, 200, 200, 200, 400 ms
    assert m["mean_itl_ms"] == pytest.approx(200.0)
    assert m["median_itl_ms"] == pytest.approx(200.0)
    assert m["std_itl_ms"] == pytest.approx(100.0)
    assert m["p90_itl_ms"] == pytest.approx(300.0)
    assert m["p99_itl_ms"] == pytest.approx(390.0)
    assert m["max_itl_ms"] == pytest.approx(400.0)
    assert m["mean_e2e_ms"] == pytest.approx(600.0)
    assert m["median_e2e_ms"] == pytest.approx(500.0)
    assert m["p90_e2e_ms"] == pytest.approx(900.0)


def test_itl_splits_multi_token_chunks() -> None:
    assert request_itls_s(_records()[1]) == pytest.approx([0.2, 0.2, 0.4])


def test_goodput_and_attainment() -> None:
    m = compute_metrics(_records(), 2.0, SLO(ttft_ms=250, tpot_ms=200))
    # request 0 meets both; 1 misses TPOT (266.7 ms); 3 misses TTFT (300 ms); 2 failed
    assert m["good_requests"] == 1
    assert m["goodput"] == pytest.approx(0.5)
    assert m["slo_attainment"] == pytest.approx(0.25)
    m = compute_metrics(_records(), 2.0, SLO(tpot_ms=150))
    assert m["good_requests"] == 2  # a one-token request has no TPOT and passes
    m = compute_metrics(_records(), 2.0, SLO(e2el_ms=500))
    assert m["good_requests"] == 2  # 500 ms is within the SLO, 1000 ms is not


def test_no_successful_request_gives_none_not_zero() -> None:
    failed = [RequestRecord(0, 5, 4, send_s=0.0, ok=False, error_kind="connect")]
    m = compute_metrics(failed, 1.0, SLO(ttft_ms=1))
    assert m["completed"] == 0 and m["output_throughput"] == 0.0
    assert m["mean_ttft_ms"] is None and m["p99_itl_ms"] is None
    assert m["slo_attainment"] == 0.0


def test_errors_by_kind_and_peak_in_flight() -> None:
    errors = count_errors(_records())
    assert errors["disconnect"] == 1 and sum(errors.values()) == 1
    assert max_in_flight(_records()) == 3  # at 0.2 s: requests 0, 1 and 2


def test_back_to_back_requests_do_not_overlap() -> None:
    seq = [
        RequestRecord(i, 1, 1, send_s=float(i), ok=True, e2e_s=1.0, wall_s=1.0) for i in range(3)
    ]
    assert max_in_flight(seq) == 1


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    np = pytest.importorskip("numpy")
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-6)


def test_record_json_round_trip() -> None:
    record = _records()[1]
    assert RequestRecord.from_json(record.to_json()) == record
