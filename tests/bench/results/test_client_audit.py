"""The load generator's audit of its own pacing (``metrics.client_audit``, issue 31 item 6),
number by number on small hand-computed schedules: what a benchmarker reads to tell a slow
server from a client that could not keep up."""

from __future__ import annotations

import dataclasses

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
    """Five arrivals 0.1 s apart. Sends lag by 1, 3, 0, 50 and 10 ms, the waits for a
    concurrency slot (2 ms and 40 ms) included: every wait counts (issue 45.9); a request
    never sent (wall 0) is left out. Target 4 gaps / 0.4 s = 10 req/s; achieved 4 / 0.409
    s; the sends spanned 0.409 s where the schedule spanned 0.4 s."""
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
    assert audit["schedule_delay_ms_p50"] == pytest.approx(3.0)
    assert audit["schedule_delay_ms_p99"] == pytest.approx(48.4)
    assert audit["schedule_delay_ms_max"] == pytest.approx(50.0)
    assert audit["slot_wait_ms_p99"] == pytest.approx(38.86)
    assert audit["cpu_busy"] == pytest.approx(0.25)


def test_the_audit_is_taken_where_the_server_sees_the_request() -> None:
    """Issue 45.9: the send was stamped before the connect; a request's bytes written
    later (a slow connect, a busy event loop) arrive later at the server, and the audit
    counts that: its rate and delays come from the writes."""
    stamped = [RequestRecord(index=i, prompt_len=1, max_tokens=1, send_s=i * 0.01, ok=True,
                             wall_s=0.001, intended_s=i * 0.01, queued_s=0.0,
                             written_s=i * 0.02) for i in range(101)]  # fmt: skip
    audit = client_audit(stamped, 2.0, 0.1)
    assert audit["achieved_rate"] == pytest.approx(50.0) and audit["target_rate"] == pytest.approx(
        100.0
    )
    assert audit["rate_ratio"] == pytest.approx(0.5)
    assert audit["schedule_delay_ms_max"] == pytest.approx(1000.0)
    unstamped = [dataclasses.replace(r, written_s=None) for r in stamped]  # httpx: the send
    assert client_audit(unstamped, 2.0, 0.1)["rate_ratio"] == pytest.approx(1.0)


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
    assert together["rate_ratio"] == pytest.approx(1.0)  # the writes span what was planned
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


def test_without_usage_the_tokens_that_arrived_are_checked_against_the_forced_length() -> None:
    """A server that sends no ``usage``: nothing to compare (issue 45.1: mismatches are
    client vs server); a forced length is checked on the tokens that arrived."""
    exact = RequestRecord(index=0, prompt_len=16, max_tokens=8, send_s=0.0, ok=True, wall_s=0.1,
                          chunk_times_s=(0.01,) * 8, output_tokens=8)  # fmt: skip
    counted = RequestRecord(index=1, prompt_len=16, max_tokens=8, send_s=0.0, ok=True, wall_s=0.1,
                            chunk_times_s=(0.01,) * 4, chunk_tokens=(2, 2, 2, 2), output_tokens=8)  # fmt: skip
    short = RequestRecord(index=2, prompt_len=16, max_tokens=8, send_s=0.0, ok=True, wall_s=0.1,
                          chunk_times_s=(0.01,) * 7, output_tokens=7)  # fmt: skip
    assert token_truth([exact, counted], forced=True)["short_replies"] == 0
    truth = token_truth([exact, counted, short], forced=True)
    assert truth["short_replies"] == 1 and truth["token_count_mismatches"] is None
