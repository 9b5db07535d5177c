"""The bootstrap intervals of ``bench compare``, against a reference computation.

The reference is an independent bootstrap written with numpy (its own generator, 20,000
resamples, vectorised) of the same ratios, B / A, on synthetic records whose two sides have
DIFFERENT request counts and spreads. gpudoctor's interval must agree with it within the
Monte Carlo error (a few % of the interval's width): a 50 % interval, a side resampled
to the other side's size, or draws from the wrong side all land far outside that.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results import noise

REF_RESAMPLES = 20_000
TOLERANCE = 0.08  # of the reference interval's width; the Monte Carlo error is ~1-2 %


def records(n: int, e2e_step: float, tokens0: int) -> list[RequestRecord]:
    """Return ``n`` successful requests, one at a time, whose latencies grow with the index."""
    out = []
    for i in range(n):
        e2e = 1.0 + e2e_step * i
        out.append(
            RequestRecord(
                index=i,
                prompt_len=16,
                max_tokens=16,
                send_s=float(i),
                ok=True,
                ttft_s=0.1 * e2e,
                e2e_s=e2e,
                wall_s=e2e,
                chunk_times_s=tuple(0.1 * e2e + k * 0.05 for k in range(4)),
                chunk_tokens=(1, 1, 1, 1),
                output_tokens=tokens0 + i % 5,
            )
        )
    return out


def reference(a: list[RequestRecord], b: list[RequestRecord], metric: str) -> tuple[float, float]:
    """Return numpy's 95 % percentile bootstrap interval of B / A for one metric."""
    rng = np.random.default_rng(12345)

    def resampled(side: list[RequestRecord]) -> np.ndarray:
        e2e = np.array([r.e2e_s for r in side])
        tokens = np.array([r.output_tokens for r in side], dtype=float)
        concurrency = e2e.sum() / math.fsum(r.wall_s for r in side)  # one at a time: 1
        pick = rng.integers(0, len(side), size=(REF_RESAMPLES, len(side)))
        if metric == "mean_e2e_ms":
            return e2e[pick].mean(axis=1) * 1000
        return tokens[pick].sum(axis=1) / (e2e[pick].sum(axis=1) / concurrency)

    ratio = resampled(b) / resampled(a)
    return float(np.percentile(ratio, 2.5)), float(np.percentile(ratio, 97.5))


@pytest.mark.parametrize("metric", ["mean_e2e_ms", "output_throughput"])
@pytest.mark.parametrize(("n_a", "n_b"), [(20, 35), (35, 20), (12, 12)])
def test_interval_matches_an_independent_bootstrap(metric: str, n_a: int, n_b: int) -> None:
    a, b = records(n_a, 0.01, 8), records(n_b, 0.06, 10)
    sample_a = noise.sample_of(a, math.fsum(r.wall_s for r in a))
    sample_b = noise.sample_of(b, math.fsum(r.wall_s for r in b))
    assert sample_a is not None and sample_b is not None
    low, high = noise.ratio_intervals(sample_a, sample_b, resamples=4000, seed=7)[metric]
    ref_low, ref_high = reference(a, b, metric)
    width = ref_high - ref_low
    assert width > 0
    assert abs(low - ref_low) <= TOLERANCE * width, (low, high, ref_low, ref_high)
    assert abs(high - ref_high) <= TOLERANCE * width, (low, high, ref_low, ref_high)
    # the point ratio lies inside; a 95 % interval is far wider than a 50 % one
    full_a = noise.statistics(sample_a, range(sample_a.size))[metric]
    full_b = noise.statistics(sample_b, range(sample_b.size))[metric]
    assert low < full_b / full_a < high


def test_fewer_than_the_minimum_requests_on_one_side_gives_no_interval() -> None:
    five, four, many = records(5, 0.05, 8), records(4, 0.05, 8), records(30, 0.05, 8)

    def sample(side: list[RequestRecord]) -> noise.Sample:
        made = noise.sample_of(side, math.fsum(r.wall_s for r in side))
        assert made is not None
        return made

    assert noise.MIN_REQUESTS == 5
    assert all(v is not None for v in noise.ratio_intervals(sample(five), sample(many)).values())
    assert all(v is None for v in noise.ratio_intervals(sample(four), sample(many)).values())
    assert all(v is None for v in noise.ratio_intervals(sample(many), sample(four)).values())


def test_failed_requests_do_not_count_towards_the_minimum() -> None:
    """Ten requests of which four succeeded give no interval (the latencies would collapse
    onto four values), as four requests in all do; a fifth success gives one."""

    def failed(r: RequestRecord) -> RequestRecord:
        return dataclasses.replace(
            r, ok=False, ttft_s=None, chunk_times_s=(), chunk_tokens=(), output_tokens=0,
            status_code=500, error_kind="http_5xx", error="HTTP 500",
        )  # fmt: skip

    def sample(side: list[RequestRecord]) -> noise.Sample:
        made = noise.sample_of(side, math.fsum(r.wall_s or 0.0 for r in side))
        assert made is not None
        return made

    many = sample(records(30, 0.05, 8))
    ten = records(10, 0.05, 8)
    four_ok = sample([r if r.index < 4 else failed(r) for r in ten])
    five_ok = sample([r if r.index < 5 else failed(r) for r in ten])
    assert four_ok.size == 10 and sum(four_ok.ok) == 4
    assert all(v is None for v in noise.ratio_intervals(four_ok, many).values())
    assert all(v is None for v in noise.ratio_intervals(many, four_ok).values())
    assert noise.ratio_intervals(five_ok, many)["output_throughput"] is not None


def mixed() -> list[RequestRecord]:
    """Successes, failures, a one-token request (no TPOT) and a record without wall_s."""
    out = records(8, 0.03, 6)
    out[2] = RequestRecord(index=2, prompt_len=16, max_tokens=16, send_s=2.0, ok=False,
                           wall_s=0.2, error_kind="http_5xx", output_tokens=3)  # fmt: skip
    out[3] = RequestRecord(index=3, prompt_len=16, max_tokens=1, send_s=3.0, ok=True,
                           ttft_s=0.2, e2e_s=0.25, wall_s=None, chunk_times_s=(0.2,),
                           chunk_tokens=(1,), output_tokens=1)  # fmt: skip
    return out


def test_the_full_sample_gives_the_cell_metrics_back() -> None:
    from gpudoctor.bench.results.metrics import compute_metrics

    recs = mixed()
    duration = 9.5
    sample = noise.sample_of(recs, duration)
    assert sample is not None and sample.size == 8
    assert sample.ok[2] is False and sample.tokens[2] == 0 and sample.ttft_ms[2] is None
    assert sample.wall_s[3] == 0.25  # no wall_s: the E2E stands in
    stats = noise.statistics(sample, range(sample.size))
    expected = compute_metrics(recs, duration)
    for metric in noise.BOOTSTRAPPED:
        assert stats[metric] == pytest.approx(expected[metric], rel=1e-9), metric
    assert noise.sample_of([], 1.0) is None and noise.sample_of(recs, 0.0) is None
    assert noise.sample_of(recs, 0.5) is not None


def test_a_metric_a_resample_lacks_has_no_interval() -> None:
    one_token = [
        RequestRecord(index=i, prompt_len=4, max_tokens=1, send_s=float(i), ok=True,
                      ttft_s=0.1 + i / 100, e2e_s=0.2 + i / 100, wall_s=0.2 + i / 100,
                      chunk_times_s=(0.1,), chunk_tokens=(1,), output_tokens=1)
        for i in range(6)
    ]  # fmt: skip
    side = noise.sample_of(one_token, 2.0)
    other = noise.sample_of(records(6, 0.05, 8), 2.0)
    assert side is not None and other is not None
    intervals = noise.ratio_intervals(side, other, resamples=50)
    assert intervals["mean_tpot_ms"] is None and intervals["mean_itl_ms"] is None  # no TPOT/ITL
    assert intervals["mean_e2e_ms"] is not None
    again = noise.ratio_intervals(side, other, resamples=50)
    assert again == intervals  # seeded: the same interval every time
    assert noise.ratio_intervals(side, other, resamples=50, seed=1) != intervals


def test_load_sample_reads_only_its_own_run(tmp_path: Path) -> None:
    raw = tmp_path / "raw" / "cell.jsonl"
    raw.parent.mkdir()
    lines = [json.dumps({"run_id": "r1", **r.to_json()}) for r in records(6, 0.05, 8)]
    lines += [json.dumps({"run_id": "r0", **r.to_json()}) for r in records(3, 0.05, 8)]
    lines += ["not json", "[1, 2]", '{"run_id": "r1", "index": "x"}']
    raw.write_text("\n".join(lines[:6]) + "\n" + "\n".join(lines[6:]) + "\n")
    sample = noise.load_sample(tmp_path, "raw/cell.jsonl", "r1", 3.0)
    assert sample is not None and sample.size == 6
    assert sample.concurrency == pytest.approx(math.fsum(sample.wall_s) / 3.0)
    every = noise.load_sample(tmp_path, "raw/cell.jsonl", None, 3.0)
    assert every is not None and every.size == 9
    assert noise.load_sample(tmp_path, None, "r1", 3.0) is None
    assert noise.load_sample(tmp_path, "raw/cell.jsonl", "r1", None) is None
    assert noise.load_sample(tmp_path, "raw/cell.jsonl", "r1", 0) is None
    assert noise.load_sample(tmp_path, "raw/gone.jsonl", "r1", 3.0) is None
    assert noise.load_sample(tmp_path, "raw/cell.jsonl", "nobody", 3.0) is None
