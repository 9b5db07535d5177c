"""Each line a verdict prints, word for word: what a user reads in `bench status`, the
closing table and results.jsonl when a cell fails or its numbers are qualified.

test_verdict.py drives the verdict from real RequestRecords; these tests pin the exact text
and fields of every branch (why a cell failed, which errors, the first error verbatim, the
client-bound and suspect flags, the plan hint when every cell failed the same way).
"""

from __future__ import annotations

from gpudoctor.bench.results.verdict import Verdict, client_bound, common_failure, judge, suspect


def _cell(completed: int, errors: dict, tokens: int = 100, first: str | None = None) -> dict:
    return {"completed": completed, "errors": errors,
            "metrics": {"total_output_tokens": tokens},
            "first_error": {"message": first} if first is not None else None}  # fmt: skip


# judge: why a cell failed, in one line, with the counts it read


def test_a_clean_cell_is_ok_and_its_record_says_so() -> None:
    v = judge(_cell(10, {}))
    assert v == Verdict("ok", "", 10, 0, {}, None)
    assert v.to_json() == {"status": "ok", "reason": "", "requests": 10, "failed": 0,
                           "errors": {}, "first_error": None}  # fmt: skip


def test_the_record_is_a_copy_of_the_error_counts() -> None:
    v = judge(_cell(99, {"timeout": 1}, first="read timed out"))
    record = v.to_json()
    record["errors"]["timeout"] = 7
    assert v.errors == {"timeout": 1}
    assert record["first_error"] == "read timed out" and record["failed"] == 1


def test_kinds_that_never_occurred_are_left_out_and_counts_are_integers() -> None:
    v = judge(_cell(200, {"http_5xx": 1.0, "timeout": 0, "http_4xx": None}, first="HTTP 500"))
    assert v.errors == {"http_5xx": 1} and isinstance(v.errors["http_5xx"], int)
    assert (v.status, v.requests, v.failed) == ("ok", 201, 1)
    assert v.reason == "1 of 201 requests failed (http_5xx 1)"


def test_a_cell_with_no_request_at_all_says_nothing_was_measured() -> None:
    assert judge({}) == Verdict("failed", "no request was measured", 0, 0, {}, None)
    v = judge({"completed": None, "errors": None, "metrics": None})
    assert (v.status, v.reason) == ("failed", "no request was measured")
    v = judge({"completed": 0, "errors": {"timeout": 0}, "first_error": {"message": "HTTP 503"}})
    assert v == Verdict("failed", "no request was measured", 0, 0, {}, "HTTP 503")


def test_every_request_failing_names_the_kinds_most_frequent_first_and_the_message() -> None:
    v = judge(_cell(0, {"timeout": 1, "http_5xx": 3}, first="HTTP 500: out of memory"))
    assert v.reason == "all 4 requests failed (http_5xx 3, timeout 1): HTTP 500: out of memory"
    assert (v.status, v.requests, v.failed) == ("failed", 4, 4)
    assert v.errors == {"timeout": 1, "http_5xx": 3}
    assert v.first_error == "HTTP 500: out of memory"


def test_every_request_failing_without_a_message_ends_at_the_kinds() -> None:
    v = judge(_cell(0, {"connect": 2}))
    assert v.reason == "all 2 requests failed (connect 2)" and v.first_error is None


def test_an_empty_first_error_message_is_no_message() -> None:
    v = judge(_cell(0, {"connect": 2}, first=""))
    assert v.reason == "all 2 requests failed (connect 2)" and v.first_error is None


def test_a_rejected_warmup_quotes_the_servers_message_from_the_warmup() -> None:
    m = {"completed": 0, "errors": {}, "client": {"warmup": {"rejected": True,
         "first_error": "HTTP 422: Unexpected fields: {'ignore_eos'}"}}}  # fmt: skip
    v = judge(m)
    assert v == Verdict("failed", "the server rejected the warmup request (HTTP 422: Unexpected"
                        " fields: {'ignore_eos'}); nothing was measured", 0, 0, {},
                        "HTTP 422: Unexpected fields: {'ignore_eos'}")  # fmt: skip


def test_a_rejected_warmup_fails_even_when_requests_were_counted() -> None:
    m = _cell(5, {"http_4xx": 1}, first="HTTP 400: bad")
    m["client"] = {"warmup": {"rejected": True, "first_error": "HTTP 422: other"}}
    v = judge(m)
    assert v.status == "failed" and (v.requests, v.failed) == (6, 1)
    assert (
        v.reason == "the server rejected the warmup request (HTTP 400: bad); nothing was measured"
    )


def test_a_warmup_not_rejected_changes_nothing() -> None:
    m = _cell(10, {}, first=None)
    m["client"] = {"warmup": {"rejected": False, "first_error": "HTTP 503: warming up"}}
    v = judge(m)
    assert (v.status, v.reason, v.first_error) == ("ok", "", "HTTP 503: warming up")


def test_replies_without_output_tokens_fail_the_cell() -> None:
    v = judge(_cell(3, {}, tokens=0))
    assert v == Verdict("failed", "3 replies carried zero output tokens", 3, 0, {}, None)
    v = judge(_cell(300, {"timeout": 1}, tokens=0, first="read timed out"))
    assert v == Verdict("failed", "300 replies carried zero output tokens", 301, 1,
                        {"timeout": 1}, "read timed out")  # fmt: skip
    no_metrics = {"completed": 2, "errors": {}}
    assert judge(no_metrics).reason == "2 replies carried zero output tokens"
    assert judge(_cell(2, {}, tokens=-1)).status == "failed"
    assert judge(_cell(2, {}, tokens=1)).status == "ok"


def test_too_many_failures_fail_the_cell_with_the_fraction_the_limit_and_the_message() -> None:
    v = judge(_cell(8, {"timeout": 1, "http_5xx": 1}, first="HTTP 500: boom"), 0.1)
    assert v.reason == ("2 of 10 requests failed (20.0% > max_failed_fraction 0.1;"
                        " timeout 1, http_5xx 1): HTTP 500: boom")  # fmt: skip
    assert (v.status, v.requests, v.failed, v.first_error) == ("failed", 10, 2, "HTTP 500: boom")
    assert v.errors == {"timeout": 1, "http_5xx": 1}
    v = judge(_cell(97, {"timeout": 3}))
    assert v.reason == "3 of 100 requests failed (3.0% > max_failed_fraction 0.01; timeout 3)"


def test_exactly_the_tolerated_fraction_is_ok_and_one_more_is_not() -> None:
    assert judge(_cell(9, {"timeout": 1}), 0.1).status == "ok"
    assert judge(_cell(8, {"timeout": 2}), 0.1).status == "failed"
    assert judge(_cell(10, {"timeout": 1}), 0.0).status == "failed"
    assert judge(_cell(10, {}), 0.0).status == "ok"


def test_the_default_tolerance_is_one_percent() -> None:
    assert judge(_cell(99, {"timeout": 1})).status == "ok"
    assert judge(_cell(199, {"timeout": 2})).status == "ok"
    assert judge(_cell(98, {"timeout": 2})).status == "failed"


# client_bound: the load generator, not the server, was the limit


def test_a_client_that_held_its_schedule_is_not_flagged() -> None:
    assert client_bound({}) is None
    assert client_bound({"client": {"audit": {}}}) is None
    audit = {
        "rate_ratio": 0.95,
        "schedule_delay_ms_p99": 10.0,
        "achieved_rate": 95.0,
        "target_rate": 100,
    }
    assert client_bound({"client": {"audit": audit}}) is None


def test_a_late_client_names_its_rate_and_its_delay() -> None:
    audit = {
        "rate_ratio": 0.5,
        "schedule_delay_ms_p99": 12.25,
        "achieved_rate": 49.6,
        "target_rate": 99,
    }
    assert client_bound({"client": {"audit": audit}}) == (
        "sent 50 req/s, 0.50 of the schedule's rate; schedule delay p99 12.2 ms"
    )
    audit = {"rate_ratio": 0.949, "achieved_rate": None, "target_rate": 1}
    assert client_bound({"client": {"audit": audit}}) == "sent less, 0.95 of the schedule's rate"
    audit = {"rate_ratio": 1, "schedule_delay_ms_p99": 11, "target_rate": 1}
    assert client_bound({"client": {"audit": audit}}) == "schedule delay p99 11.0 ms"


def test_no_schedule_is_no_schedule_missed() -> None:
    """An infinite rate (every arrival at 0 s: no target rate) waits for its slots by
    design: the slot waits now count in the delay (issue 45.9), but there is nothing to hold."""
    audit = {"rate_ratio": None, "schedule_delay_ms_p99": 500.0, "slot_wait_ms_p99": 500.0,
             "target_rate": None}  # fmt: skip
    assert client_bound({"client": {"audit": audit}}) is None


def test_audit_values_that_are_not_numbers_are_ignored() -> None:
    audit = {"rate_ratio": "0.1", "schedule_delay_ms_p99": "99", "target_rate": 1}
    assert client_bound({"client": {"audit": audit}}) is None


# suspect: the GPU's numbers


def test_slowdowns_are_named_with_their_share_and_ordinary_reasons_are_not() -> None:
    tel = {"throttle_reasons": {"sw_power_cap": 1.0, "hw_slowdown": 0.5, "hw_power_brake_slowdown":
           0.125, "sw_thermal_slowdown": 1}}  # fmt: skip
    assert suspect({"telemetry": tel}) == (
        "GPU slowed down: hw_slowdown 50% of samples, hw_power_brake_slowdown 12% of samples,"
        " sw_thermal_slowdown 100% of samples"
    )


def test_slowdowns_without_a_share_are_named_alone() -> None:
    assert suspect({"telemetry": {"throttle_reasons": ["gpu_idle", "hw_slowdown"]}}) == (
        "GPU slowed down: hw_slowdown"
    )
    assert suspect({"telemetry": {"throttle_reasons": {"hw_thermal_slowdown": None}}}) == (
        "GPU slowed down: hw_thermal_slowdown"
    )


def test_an_xid_in_the_cell_makes_it_suspect_with_where_and_when() -> None:
    xids = [{"xid": 79, "gpu": 3, "t": 12.5}, 43]
    assert suspect({"telemetry": {"xids": xids}}) == (
        "Xid 79 on GPU 3 at 12.5 s, Xid 43 during the cell"
    )
    tel = {"xids": [13], "throttle_reasons": {"hw_slowdown": 0.1}}
    assert suspect({"telemetry": tel}) == (
        "GPU slowed down: hw_slowdown 10% of samples; Xid 13 during the cell"
    )


def test_a_quiet_gpu_is_not_suspect() -> None:
    assert suspect({}) is None
    assert suspect({"telemetry": {"throttle_reasons": {}, "xids": []}}) is None
    assert suspect({"telemetry": {"throttle_reasons": {"gpu_idle": 1.0}}}) is None


# common_failure: every cell of a configuration failed the same way


def _failed(message: str | None) -> dict:
    return {"status": "failed", "verdict": {"first_error": message}}


def test_one_failed_cell_is_enough_for_the_plan_hint() -> None:
    line = common_failure([_failed('HTTP 400: "min_tokens" is not allowed')])
    assert line == ("every cell failed the same way: HTTP 400: \"min_tokens\" is not allowed;"
                    " the server refuses the request field 'min_tokens': change min_tokens in"
                    " [workload] (or the engine)")  # fmt: skip


def test_the_hint_names_the_first_request_field_the_server_quoted() -> None:
    line = common_failure([_failed("'model' rejected: 'ignore_eos' and 'min_tokens'")] * 2)
    assert line is not None
    assert line.endswith("the server refuses the request field 'ignore_eos': change ignore_eos"
                         " in [workload] (or the engine)")  # fmt: skip


def test_a_message_naming_no_request_field_asks_to_fix_the_plan() -> None:
    line = common_failure([_failed("HTTP 404: model 'llama' not found")] * 3)
    assert line == ("every cell failed the same way: HTTP 404: model 'llama' not found;"
                    " fix the plan, not the load")  # fmt: skip


def test_no_common_failure_without_failed_cells_or_their_messages() -> None:
    assert common_failure([]) is None
    assert common_failure([_failed("HTTP 500: x"), _failed(None)]) is None
    assert common_failure([_failed("HTTP 500: x"), {"status": "failed"}]) is None
    assert common_failure([{"status": "ok", "verdict": {"first_error": "HTTP 500: x"}}]) is None
    assert common_failure([_failed("HTTP 500: x"), _failed("HTTP 500: y")]) is None


def test_sub_tables_of_the_wrong_shape_read_as_empty_not_a_crash() -> None:
    """A results.jsonl line is a file's content: `telemetry` or `client` as a list was an
    AttributeError out of every reader (bench report, compare, status)."""
    odd = {"completed": 3, "errors": [1], "metrics": [2], "client": ["x"], "telemetry": [3]}
    assert judge(odd) == Verdict("failed", "3 replies carried zero output tokens", 3, 0, {}, None)
    assert client_bound(odd) is None and suspect(odd) is None
    nested = {"client": {"warmup": "rejected", "audit": 7}, "completed": 1, "errors": {},
              "metrics": {"total_output_tokens": 4}}  # fmt: skip
    assert judge(nested).status == "ok" and client_bound(nested) is None


def test_a_server_failing_now_and_then_is_not_called_a_plan_error() -> None:
    """Issue 47: a server answering 500 to every 2nd request got "fix the plan, not the
    load"; requests that succeeded in those cells say it fails intermittently."""
    half = {**_failed("HTTP 500: boom"), "measurement": {"completed": 3}}
    none = {**_failed("HTTP 500: boom"), "measurement": {"completed": 0}}
    line = common_failure([half, none, {**half, "measurement": {"completed": 2}}])
    assert line == ("every cell failed the same way: HTTP 500: boom; yet 5 request(s) succeeded:"
                    " the server fails intermittently, not the plan: read its log (bench report"
                    " shows its last lines)")  # fmt: skip
    assert common_failure([none, none]) == (
        "every cell failed the same way: HTTP 500: boom; fix the plan, not the load"
    )
    odd = {**_failed("HTTP 500: boom"), "measurement": {"completed": "3"}}
    assert common_failure([odd]).endswith("fix the plan, not the load")  # type: ignore[union-attr]
