"""The verdict as a pure function of a cell's measurement (issue 31): every branch, and
the self-audit / token-truth numbers it reads, from real RequestRecords."""

from __future__ import annotations

import pytest

from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results.metrics import client_audit, count_errors, token_truth
from gpudoctor.bench.results.verdict import (
    client_bound,
    common_failure,
    judge,
    suspect,
    usage_overclaim,
)


def _ok(i: int, tokens: int = 8, usage: int | None = 8) -> RequestRecord:
    return RequestRecord(index=i, prompt_len=16, max_tokens=8, send_s=i * 0.01, ok=True,
                         ttft_s=0.01, e2e_s=0.02, wall_s=0.02, chunk_times_s=(0.01,) * tokens,
                         chunk_tokens=(1,) * tokens, output_tokens=tokens,
                         usage_completion_tokens=usage)  # fmt: skip


def _bad(i: int, kind: str = "http_5xx", msg: str = "HTTP 500: boom") -> RequestRecord:
    return RequestRecord(index=i, prompt_len=16, max_tokens=8, send_s=i * 0.01, ok=False,
                         wall_s=0.001, status_code=500, error_kind=kind, error=msg)  # fmt: skip


def _measurement(records: list[RequestRecord], **extra: object) -> dict:
    failed = [r for r in records if not r.ok]
    return {"completed": sum(r.ok for r in records), "errors": count_errors(records),
            "metrics": {"total_output_tokens": sum(r.output_tokens for r in records if r.ok)},
            "first_error": {"message": failed[0].error} if failed else None, **extra}  # fmt: skip


def test_all_ok_is_ok_with_no_reason() -> None:
    v = judge(_measurement([_ok(i) for i in range(10)]))
    assert (v.status, v.reason, v.failed, v.requests) == ("ok", "", 0, 10)


def test_no_successful_request_fails_with_the_first_error_verbatim() -> None:
    v = judge(_measurement([_bad(i) for i in range(4)]))
    assert v.status == "failed" and v.first_error == "HTTP 500: boom"
    assert v.reason == "all 4 requests failed (http_5xx 4): HTTP 500: boom"
    assert v.errors == {"http_5xx": 4}


def test_zero_output_tokens_fail_the_cell() -> None:
    records = [_ok(i, usage=0) for i in range(3)]
    m = _measurement(records)
    m["metrics"]["total_output_tokens"] = 0
    assert judge(m).status == "failed" and "zero output tokens" in judge(m).reason


def test_the_failed_fraction_decides_and_is_configurable() -> None:
    records = [_ok(i) for i in range(99)] + [_bad(99)]
    assert judge(_measurement(records)).status == "ok"  # 1 % is not over 1 %
    assert "1 of 100 requests failed" in judge(_measurement(records)).reason
    records = [_ok(i) for i in range(98)] + [_bad(98), _bad(99)]
    v = judge(_measurement(records))
    assert (
        v.status == "failed"
        and "2 of 100 requests failed (2.0% > max_failed_fraction 0.01" in v.reason
    )
    assert judge(_measurement(records), max_failed_fraction=0.05).status == "ok"


def test_a_rejected_warmup_fails_with_the_servers_message() -> None:
    m = _measurement([], client={"warmup": {"rejected": True}})
    m["first_error"] = {"message": "HTTP 422: {'detail': \"Unexpected fields: {'ignore_eos'}\"}"}
    v = judge(m)
    assert v.status == "failed" and "rejected the warmup request" in v.reason
    assert "Unexpected fields" in v.reason


def test_common_failure_names_the_field_to_change() -> None:
    msg = "HTTP 422: Unexpected fields in the request: {'ignore_eos'}"
    rows = [{"status": "failed", "verdict": {"first_error": msg}}] * 3
    line = common_failure(rows)
    assert line is not None and "change ignore_eos in [workload]" in line
    assert common_failure([*rows, {"status": "ok", "verdict": {}}]) is None
    other = {"status": "failed", "verdict": {"first_error": "HTTP 500: x"}}
    assert common_failure([*rows, other]) is None


def test_token_truth_compares_the_servers_usage_with_what_arrived() -> None:
    """Issue 45.1: mismatches are client vs server; a usage over what arrived is an
    overclaim (replies, tokens); forced lengths are checked on what arrived."""
    aborted = RequestRecord(index=9, prompt_len=16, max_tokens=8, send_s=0.0, ok=False, wall_s=0.1,
                            output_tokens=1, usage_completion_tokens=8, error_kind="aborted")  # fmt: skip
    records = [_ok(0), _ok(1, usage=5), _ok(2, tokens=3, usage=None), _ok(3, tokens=1, usage=8),
               _ok(4, tokens=2, usage=5), _bad(5, "empty", "no token"), aborted]  # fmt: skip
    assert token_truth(records, forced=True) == {
        "token_count_mismatches": 3, "usage_overclaims": 2, "usage_overclaimed_tokens": 10,
        "short_replies": 3, "empty_replies": 1,
    }  # fmt: skip
    assert token_truth(records, forced=False)["short_replies"] is None
    unclaimed = token_truth([_ok(0, usage=None), _ok(1, tokens=9, usage=None)], forced=True)
    assert unclaimed == {"token_count_mismatches": None, "usage_overclaims": 0,
                         "usage_overclaimed_tokens": 0, "short_replies": 1, "empty_replies": 0}  # fmt: skip


def test_an_overclaim_is_named_in_one_line() -> None:
    metrics = {"usage_overclaims": 3, "usage_overclaimed_tokens": 21}
    assert usage_overclaim({"metrics": metrics}) == (
        "the server's usage claims 21 output tokens more than it streamed in 3 replies"
        " (the numbers count the tokens that arrived)"
    )
    for quiet in ({"usage_overclaims": 0}, {}, {"usage_overclaims": "3"}):
        assert usage_overclaim({"metrics": quiet}) is None
    assert usage_overclaim({"metrics": [1]}) is None and usage_overclaim({}) is None


def test_the_client_audit_sees_a_late_pacer_and_flags_client_bound() -> None:
    on_time = [RequestRecord(index=i, prompt_len=1, max_tokens=1, send_s=i * 0.01 + 0.0005, ok=True,
                             wall_s=0.001, intended_s=i * 0.01, queued_s=0.0) for i in range(100)]  # fmt: skip
    audit = client_audit(on_time, 1.0, 0.2)
    assert abs(audit["rate_ratio"] - 1.0) < 1e-6 and audit["schedule_delay_ms_p99"] < 0.6
    assert audit["cpu_busy"] == 0.2
    assert client_bound({"client": {"audit": audit}}) is None
    late = [RequestRecord(index=i, prompt_len=1, max_tokens=1, send_s=i * 0.02, ok=True,
                          wall_s=0.001, intended_s=i * 0.01, queued_s=0.0) for i in range(100)]  # fmt: skip
    audit = client_audit(late, 2.0, 1.0)
    assert abs(audit["rate_ratio"] - 0.5) < 1e-6 and audit["schedule_delay_ms_max"] > 900
    why = client_bound({"client": {"audit": audit}})
    assert why is not None and "0.50 of the schedule's rate" in why and "schedule delay p99" in why


def test_waiting_for_a_concurrency_slot_counts_and_is_named() -> None:
    """Issue 45.9: slot waits were left out of the delay the verdict uses, so a schedule
    the client never held read as held; they count now, and the reason names them."""
    capped = [RequestRecord(index=i, prompt_len=1, max_tokens=1, send_s=i * 0.02, ok=True,
                            wall_s=0.001, intended_s=i * 0.01, queued_s=i * 0.01) for i in range(100)]  # fmt: skip
    audit = client_audit(capped, 2.0, 0.1)
    assert audit["schedule_delay_ms_p99"] > 900 and audit["rate_ratio"] == pytest.approx(0.5)
    assert audit["slot_wait_ms_p99"] > 900
    why = client_bound({"client": {"audit": audit}})
    assert why is not None and "waits for a concurrency slot p99" in why


def test_suspect_names_a_slowdown_but_not_an_ordinary_power_cap() -> None:
    assert suspect({"telemetry": {"throttle_reasons": {"sw_power_cap": 1.0}}}) is None
    why = suspect({"telemetry": {"throttle_reasons": {"hw_thermal_slowdown": 0.25}}})
    assert why == "GPU slowed down: hw_thermal_slowdown 25% of samples"


def test_the_edges_of_an_overclaim_and_of_a_slot_wait() -> None:
    """One overclaimed reply is already a claim to name; a slot wait p99 of exactly the
    10 ms the verdict allows is not named (only above it), while the delay above it is."""
    one = usage_overclaim({"metrics": {"usage_overclaims": 1, "usage_overclaimed_tokens": 4}})
    assert one is not None and "4 output tokens more than it streamed in 1 replies" in one
    audit = {"target_rate": 10.0, "schedule_delay_ms_p99": 12.0, "slot_wait_ms_p99": 10.0}
    assert client_bound({"client": {"audit": audit}}) == "schedule delay p99 12.0 ms"
    audit["slot_wait_ms_p99"] = 10.5
    assert client_bound({"client": {"audit": audit}}) == (
        "schedule delay p99 12.0 ms; waits for a concurrency slot p99 10.5 ms (the cap, not"
        " the server)"
    )
