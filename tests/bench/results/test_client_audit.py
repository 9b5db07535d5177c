"""The load generator's audit of its own pacing (``metrics.client_audit``, issue 31 item 6),
number by number on small hand-computed schedules: what a benchmarker reads to tell a slow
server from a client that could not keep up."""

from __future__ import annotations

import pytest

from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results.metrics import client_audit, token_truth

KEYS = ("target_rate", "achieved_rate", "rate_ratio", "schedule_delay_ms_p50",
        "schedule_delay_ms_p99", "schedule_delay_ms_max", "slot_wait_ms_p99", "cpu_busy")  # fmt: skip


def sent(send_s: float, intended_s: float | None = None, queued_s: float | None = None,
         wall_s: float = 0.05) -> RequestRecord:  # fmt: skip
    return RequestRecord(index=0, prompt_len=16, max_tokens=8, send_s=send_s, ok=True,
                         wall_s=wall_s, intended_s=intended_s, queued_s=queued_s)  # fmt: skip


def test_an_open_loop_cell_is_audited_number_by_number() -> None:
    """Five arrivals 0.1 s apart. Sends lag by 1, 1, 0, 10 and 10 ms once the waits for a
    concurrency slot (2 ms and 40 ms) are taken out; a request never sent (wall 0) is left
    out. Target 4 gaps / 0.4 s = 10 req/s; achieved 4 / 0.409 s; the pacer dispatched over
    0.409 s where the schedule spanned 0.4 s."""
    records = [
        sent(0.41, 0.4),  # out of order on purpose: the audit sorts by send time
        sent(0.001, 0.0, 0.0),
        sent(0.103, 0.1, 0.002),
        sent(0.2, 0.2, 0.0),
        sent(0.35, 0.3, 0.04),
        sent(0.5, 0.45, wall_s=0.0),  # not sent: the cell's deadline came first
    ]
    audit = client_audit(records, duration_s=2.0, cpu_s=0.5)
    assert set(audit) == set(KEYS)
    assert audit["target_rate"] == pytest.approx(10.0)
    assert audit["achieved_rate"] == pytest.approx(4 / 0.409)
    assert audit["rate_ratio"] == pytest.approx(0.4 / 0.409)
    assert audit["schedule_delay_ms_p50"] == pytest.approx(1.0)
    assert audit["schedule_delay_ms_p99"] == pytest.approx(10.0)
    assert audit["schedule_delay_ms_max"] == pytest.approx(10.0)
    assert audit["slot_wait_ms_p99"] == pytest.approx(38.86)
    assert audit["cpu_busy"] == pytest.approx(0.25)


def test_a_closed_loop_has_an_achieved_rate_and_no_schedule() -> None:
    """No arrival schedule (concurrency only): the rate actually sent, and nothing that
    compares it with a schedule (waiting for a slot is the design there)."""
    audit = client_audit([sent(0.0, queued_s=0.0), sent(0.25, queued_s=0.3)], 1.0, 0.1)
    assert audit == {
        "target_rate": None,
        "achieved_rate": pytest.approx(4.0),
        "rate_ratio": None,
        "schedule_delay_ms_p50": None,
        "schedule_delay_ms_p99": None,
        "schedule_delay_ms_max": None,
        "slot_wait_ms_p99": None,
        "cpu_busy": pytest.approx(0.1),
    }


def test_two_paced_requests_are_enough_for_a_rate() -> None:
    audit = client_audit([sent(0.0, 0.0, 0.0), sent(0.5, 0.5, 0.0)], 1.0, 0.1)
    assert audit["target_rate"] == pytest.approx(2.0)
    assert audit["achieved_rate"] == pytest.approx(2.0)
    assert audit["rate_ratio"] == pytest.approx(1.0)
    assert audit["schedule_delay_ms_max"] == 0.0


def test_degenerate_schedules_give_no_rate_rather_than_a_division_by_zero() -> None:
    """An infinite rate (every arrival at 0 s), one request, sends at the same instant, a
    pacer whose dispatches coincide, no records at all, a zero-length cell."""
    burst = client_audit([sent(0.0, 0.0, 0.0), sent(0.0, 0.0, 0.0)], 1.0, 0.1)
    assert (burst["target_rate"], burst["rate_ratio"], burst["achieved_rate"]) == (None,) * 3
    one = client_audit([sent(0.2, 0.1, 0.0)], 1.0, 0.1)
    assert (one["target_rate"], one["achieved_rate"]) == (None, None)
    assert one["schedule_delay_ms_max"] == pytest.approx(100.0)
    together = client_audit([sent(0.0, 0.0, 0.0), sent(0.3, 0.3, 0.3)], 1.0, 0.1)
    assert together["target_rate"] == pytest.approx(1 / 0.3)
    assert together["rate_ratio"] is None  # both dispatched at 0 s: no span to compare
    assert client_audit([], 0.0, 0.0) == dict.fromkeys(KEYS)


def test_the_rates_use_the_first_and_last_send_and_the_schedules_own_span() -> None:
    """Two requests leaving together then one later: 2 gaps over 0.5 s. A schedule that
    starts at 1 s (a trace's offsets) spans 0.5 s, not 1.5."""
    audit = client_audit([sent(0.0), sent(0.0), sent(0.5)], 1.0, 0.1)
    assert audit["achieved_rate"] == pytest.approx(4.0)
    offset = client_audit([sent(1.0, 1.0, 0.0), sent(1.5, 1.5, 0.0)], 1.0, 0.1)
    assert offset["target_rate"] == pytest.approx(2.0)
    assert offset["rate_ratio"] == pytest.approx(1.0)


def test_the_p99_send_lag_is_interpolated_below_the_worst() -> None:
    """Lags 0, 0 and 100 ms: p99 = 98 ms (linear, as np.percentile), the max 100 ms."""
    audit = client_audit([sent(0.0, 0.0, 0.0), sent(0.1, 0.1, 0.0), sent(0.3, 0.2, 0.0)], 1.0, 0.1)
    assert audit["schedule_delay_ms_p99"] == pytest.approx(98.0)
    assert audit["schedule_delay_ms_max"] == pytest.approx(100.0)


def test_without_usage_the_streamed_tokens_are_counted() -> None:
    """A server that sends no ``usage``: the output length is the content chunks' tokens
    (one per chunk when the chunks' token counts are unknown); a reply of exactly the
    forced length is no mismatch."""
    exact = RequestRecord(index=0, prompt_len=16, max_tokens=8, send_s=0.0, ok=True, wall_s=0.1,
                          chunk_times_s=(0.01,) * 8, chunk_tokens=())  # fmt: skip
    counted = RequestRecord(index=1, prompt_len=16, max_tokens=8, send_s=0.0, ok=True, wall_s=0.1,
                            chunk_times_s=(0.01,) * 4, chunk_tokens=(2, 2, 2, 2))  # fmt: skip
    short = RequestRecord(index=2, prompt_len=16, max_tokens=8, send_s=0.0, ok=True, wall_s=0.1,
                          chunk_times_s=(0.01,) * 7, chunk_tokens=())  # fmt: skip
    assert token_truth([exact, counted], forced=True)["token_count_mismatches"] == 0
    assert token_truth([exact, counted, short], forced=True)["token_count_mismatches"] == 1
