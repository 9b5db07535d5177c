"""The metric definitions at their edges (gpudoctor/bench/results/metrics.py): SLO bounds
inclusive, TPOT from two tokens on, ITL without chunk token counts, error kinds, the peak
of requests in flight, and "no data" as None."""

from __future__ import annotations

import pytest

from gpudoctor.bench.cell_spec import SLO
from gpudoctor.bench.request_record import ERROR_KINDS, RequestRecord
from gpudoctor.bench.results.metrics import (
    compute_metrics,
    count_errors,
    max_in_flight,
    meets_slo,
    percentile,
    request_itls_s,
    request_tpot_s,
    summarize,
)


def rec(**kw) -> RequestRecord:
    base = dict(index=0, prompt_len=4, max_tokens=8, send_s=0.0, ok=True, ttft_s=0.1,
                e2e_s=0.5, wall_s=0.5, output_tokens=5)  # fmt: skip
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def test_slo_bounds_are_inclusive() -> None:
    r = rec(ttft_s=0.1, e2e_s=0.5, output_tokens=5)  # tpot = 0.4 / 4 = 100 ms
    assert meets_slo(r, SLO(ttft_ms=100.0, tpot_ms=100.0, e2el_ms=500.0))
    assert not meets_slo(r, SLO(ttft_ms=99.9))
    assert not meets_slo(r, SLO(tpot_ms=99.9))
    assert not meets_slo(r, SLO(e2el_ms=499.9))
    assert meets_slo(r, SLO())


def test_slo_of_failed_or_incomplete_requests() -> None:
    assert not meets_slo(rec(ok=False), SLO(e2el_ms=1e9))
    assert not meets_slo(rec(ttft_s=None), SLO(e2el_ms=1e9))
    assert not meets_slo(rec(e2e_s=None), SLO(ttft_ms=1e9))
    assert meets_slo(rec(output_tokens=1), SLO(tpot_ms=0.001))  # no TPOT: passes that SLO


def test_tpot_needs_two_tokens_and_both_times() -> None:
    assert request_tpot_s(rec(output_tokens=2)) == pytest.approx(0.4)
    assert request_tpot_s(rec(output_tokens=1)) is None
    assert request_tpot_s(rec(ttft_s=None)) is None
    assert request_tpot_s(rec(e2e_s=None)) is None
    assert request_tpot_s(rec(ok=False)) is None


def test_itl_without_token_counts_is_one_token_per_chunk() -> None:
    assert request_itls_s(rec(chunk_times_s=(0.1, 0.2, 0.5))) == pytest.approx([0.1, 0.3])
    assert request_itls_s(rec(chunk_times_s=(0.1, 0.5), chunk_tokens=(1, 2))) == pytest.approx(
        [0.2, 0.2]
    )
    assert request_itls_s(rec(chunk_times_s=(0.1,))) == []


def test_errors_by_kind() -> None:
    failed = [rec(ok=False, error_kind="http_5xx"), rec(ok=False, error_kind="http_5xx"),
              rec(ok=False, error_kind="weird"), rec(ok=False, error_kind=None), rec()]  # fmt: skip
    counts = count_errors(failed)
    assert set(counts) == set(ERROR_KINDS)
    assert counts["http_5xx"] == 2 and counts["other"] == 2
    assert sum(counts.values()) == 4


def test_peak_in_flight() -> None:
    a = rec(send_s=0.0, wall_s=1.0, e2e_s=1.0)
    b = rec(send_s=2.0, wall_s=1.0, e2e_s=1.0)
    c = rec(send_s=2.5, wall_s=1.5, e2e_s=1.5)
    assert max_in_flight([a, b, c]) == 2
    assert max_in_flight([]) == 0


def test_no_data_is_none_and_bad_input_is_refused() -> None:
    empty = summarize([], "x_ms")
    assert empty == dict.fromkeys(
        ["mean_x_ms", "median_x_ms", "std_x_ms", "p90_x_ms", "p95_x_ms", "p99_x_ms", "max_x_ms"]
    )
    assert set(summarize([1.0], "x_ms")) == set(empty)
    with pytest.raises(ValueError, match=r"^percentile of an empty sequence$"):
        percentile([], 50)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=rf"^duration must be positive, got {bad}$"):
            compute_metrics([rec()], bad)
    assert compute_metrics([], 1.0, SLO(ttft_ms=1.0))["slo_attainment"] is None
    assert compute_metrics([rec(), rec(ok=False)], 1.0, SLO(ttft_ms=1e9))["slo_attainment"] == 0.5
