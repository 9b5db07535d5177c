"""Edges of ``bench compare``'s bootstrap (gpudoctor.bench.results.noise): the exact 95 %
interval of a small cell, failed and unsent requests, sides that resample to no success,
a sub-second cell, and which raw files ``load_sample`` reads.

The records are what gpudoctor's client writes (``RequestRecord``): successes, a stream
that broke after some tokens (``disconnect``), and requests the cell's deadline left
unsent (``wall_s=0.0``, as ``client.not_sent`` writes them).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results import noise
from gpudoctor.bench.results.metrics import compute_metrics


def ok(index: int, e2e: float) -> RequestRecord:
    """Return a successful 4-token request of ``e2e`` seconds."""
    return RequestRecord(index=index, prompt_len=4, max_tokens=4, send_s=float(index), ok=True,
                         ttft_s=0.1 * e2e, e2e_s=e2e, wall_s=e2e,
                         chunk_times_s=tuple(0.1 * e2e + k * 0.2 * e2e for k in range(4)),
                         chunk_tokens=(1, 1, 1, 1), output_tokens=4)  # fmt: skip


def disconnected(index: int) -> RequestRecord:
    """Return a request whose stream broke after two tokens (timed, but failed)."""
    return RequestRecord(index=index, prompt_len=4, max_tokens=4, send_s=float(index), ok=False,
                         ttft_s=0.1, e2e_s=0.3, wall_s=0.5, chunk_times_s=(0.1, 0.3),
                         chunk_tokens=(1, 1), output_tokens=2,
                         error_kind="disconnect")  # fmt: skip


def unsent(index: int) -> RequestRecord:
    """Return a request the cell's deadline left unsent (client.not_sent's record)."""
    return RequestRecord(index=index, prompt_len=4, max_tokens=4, send_s=9.0, ok=False,
                         wall_s=0.0, error_kind="deadline")  # fmt: skip


def untimed(index: int) -> RequestRecord:
    """Return a failure recorded with no time at all (an old record: no wall_s, no e2e_s)."""
    return RequestRecord(index=index, prompt_len=4, max_tokens=4, send_s=1.0, ok=False,
                         error_kind="connect")  # fmt: skip


def sample(records: list[RequestRecord], duration_s: float | None = None) -> noise.Sample:
    made = noise.sample_of(records, duration_s or math.fsum(r.wall_s or 0.0 for r in records))
    assert made is not None
    return made


def binomial(n: int, p: float) -> list[float]:
    return [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]


def test_the_interval_is_the_exact_bootstraps_2_5th_and_97_5th_percentile() -> None:
    """Each side has a few slow requests, so a resample's mean E2E depends only on how many
    slow ones it drew (binomial): the exact bootstrap distribution of B / A is a handful
    of values with known probabilities. With 20,000 resamples gpudoctor's interval is
    exactly the values where that distribution reaches 2.5 % and 97.5 % (the sides are
    chosen so that 3.5 % and 98.5 % are other values, far from any ambiguity)."""
    n_a, slow_a, e2e_a = 5, 2, 10.0
    n_b, slow_b, e2e_b = 7, 1, 5.0
    a = [ok(i, e2e_a if i < slow_a else 1.0) for i in range(n_a)]
    b = [ok(i, e2e_b if i < slow_b else 1.0) for i in range(n_b)]
    odds: dict[float, float] = {}
    for k_a, p_a in enumerate(binomial(n_a, slow_a / n_a)):
        for k_b, p_b in enumerate(binomial(n_b, slow_b / n_b)):
            mean_a = (k_a * e2e_a + n_a - k_a) / n_a
            mean_b = (k_b * e2e_b + n_b - k_b) / n_b
            key = round(mean_b / mean_a, 12)
            odds[key] = odds.get(key, 0.0) + p_a * p_b

    def quantile(p: float) -> float:
        total = 0.0
        for value, prob in sorted(odds.items()):
            total += prob
            if total >= p:
                return value
        raise AssertionError(p)

    assert quantile(0.025) != quantile(0.035) and quantile(0.975) != quantile(0.985)
    low, high = noise.ratio_intervals(sample(a), sample(b), resamples=20_000)["mean_e2e_ms"]
    assert low == pytest.approx(quantile(0.025), rel=1e-9)
    assert high == pytest.approx(quantile(0.975), rel=1e-9)


def test_a_side_a_that_can_resample_to_no_success_has_no_throughput_interval() -> None:
    """Five successes in a hundred on side A: with 2000 resamples some hold no success (each
    does with p = 0.95^100, about 0.6 %), a throughput of 0, and B / 0 is undefined, so A's
    throughputs (and latencies) get no interval. On side B the same zero is a ratio of 0, a
    real value: B's throughputs keep their interval, its latencies (none in such a
    resample) do not."""
    mostly_failed = sample([ok(i, 1.0) if i < 5 else disconnected(i) for i in range(100)])
    healthy = sample([ok(i, 1.0 + i / 10) for i in range(6)])
    by_a = noise.ratio_intervals(mostly_failed, healthy, resamples=2000)
    assert all(by_a[m] is None for m in noise.BOOTSTRAPPED), by_a
    by_b = noise.ratio_intervals(healthy, mostly_failed, resamples=2000)
    low, high = by_b["output_throughput"] or (None, None)
    assert low is not None and high is not None and 0.0 <= low < high
    assert by_b["request_throughput"] is not None and by_b["mean_e2e_ms"] is None


def test_resamples_of_only_failed_or_unsent_requests_have_no_latency_and_no_rate() -> None:
    """A resample of failed requests has throughputs of 0 and no latency (not an error);
    one of unsent requests took no time at all, so it has no throughput either."""
    records = [ok(0, 1.0), ok(1, 2.0), disconnected(2), unsent(3), untimed(4)]
    view = sample(records, 4.0)
    failed = noise.statistics(view, [2, 2])
    assert failed["output_throughput"] == 0.0 and failed["request_throughput"] == 0.0
    latencies = [m for m in noise.BOOTSTRAPPED if not m.endswith("_throughput")]
    assert all(failed[m] is None for m in latencies), failed
    for idle in ([3], [4], [3, 4]):
        stats = noise.statistics(view, idle)
        assert all(v is None for v in stats.values()), (idle, stats)


def test_the_sample_holds_no_latency_of_a_failed_request() -> None:
    """A stream that broke after two tokens counts its wall time (0.5 s, not its E2E) but
    no TTFT, E2E, ITL or tokens; a failure recorded without any time counts 0 s."""
    view = sample([ok(0, 1.0), disconnected(1), untimed(2)], 3.0)
    assert view.wall_s == (1.0, 0.5, 0.0)
    assert view.concurrency == pytest.approx(1.5 / 3.0)
    assert view.ttft_ms[1:] == (None, None) and view.e2e_ms[1:] == (None, None)
    assert view.tpot_ms[1:] == (None, None) and view.tokens[1:] == (0, 0)
    assert view.itl_count[1:] == (0, 0) and view.itl_sum_ms[1:] == (0.0, 0.0)
    assert view.itl_count[0] == 3 and view.ttft_ms[0] == pytest.approx(100.0)


def test_a_sub_second_cell_gives_its_cell_metrics_back() -> None:
    """A cell shorter than a second (five fast requests, concurrently): the full sample's
    throughputs and latencies are the cell's, as compute_metrics has them."""
    records = [ok(i, 0.1 + i / 100) for i in range(5)]
    view = sample(records, 0.2)
    stats = noise.statistics(view, range(view.size))
    expected = compute_metrics(records, 0.2)
    for metric in noise.BOOTSTRAPPED:
        assert stats[metric] == pytest.approx(expected[metric], rel=1e-9), metric


def test_a_cell_of_unsent_requests_has_no_sample_and_compare_does_not_crash() -> None:
    """Every request left unsent (the deadline passed at once): no request took any time,
    so there is no concurrency to scale a resample by; no sample (no interval), not a
    ZeroDivisionError in ``bench compare``."""
    assert noise.sample_of([unsent(i) for i in range(6)], 2.0) is None
    assert noise.sample_of([untimed(i) for i in range(6)], 2.0) is None
    assert noise.sample_of([unsent(0), ok(1, 0.01)], 2.0) is not None


def write_raw(path: Path, rows: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(rows) + b"\n")


def rows(n: int) -> list[bytes]:
    return [json.dumps({"run_id": "r1", **ok(i, 1.0).to_json()}).encode() for i in range(n)]


def test_load_sample_reads_only_a_file_directly_in_raw(tmp_path: Path) -> None:
    """A record's raw path is ``raw/<name>``: a file elsewhere in the run directory (an
    other folder, a subfolder of raw/, raw/ itself, raw/..) is not read, even when it is
    there and well-formed."""
    for rel in ("raw/cell.jsonl", "other/cell.jsonl", "raw/sub/cell.jsonl"):
        write_raw(tmp_path / rel, rows(6))
    good = noise.load_sample(tmp_path, "raw/cell.jsonl", "r1", 3.0)
    assert good is not None and good.size == 6
    for rel in ("other/cell.jsonl", "raw/sub/cell.jsonl", "raw", "raw/..", "raw/.", "cell.jsonl"):
        assert noise.load_sample(tmp_path, rel, "r1", 3.0) is None, rel


def test_load_sample_skips_broken_lines_anywhere_in_the_file(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 and lines that are not records, before, between and after
    the records, are skipped; every record is still read."""
    good = rows(6)
    lines = [b"\xff\xfe garbage", *good[:3], b"not json", b'{"run_id": "r1", "index": "x"}',
             b"\xc3(", *good[3:], b"[1, 2]"]  # fmt: skip
    write_raw(tmp_path / "raw" / "cell.jsonl", lines)
    loaded = noise.load_sample(tmp_path, "raw/cell.jsonl", "r1", 3.0)
    assert loaded is not None and loaded.size == 6
