"""A cell's trace (RUN/trace/<cell>.json, opened in ui.perfetto.dev): each request as the
user sees it there (its lane, its slice, waiting and streaming, a failure's error), the
server signals as counters, the bound on a huge cell, and the file's name and place.
In process, real files in tmp_path; test_trace.py renders it in Chromium."""

from __future__ import annotations

import json
from pathlib import Path

from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results.trace import (
    cell_label,
    keep_bounded,
    lanes,
    read_trace,
    request_events,
    trace_document,
    trace_name,
    trace_path,
    write_trace,
)


def _ok(i: int, send: float, ttft: float | None = 0.1, e2e: float | None = 0.5,
        wall: float | None = 0.5, request_id: str | None = None) -> RequestRecord:  # fmt: skip
    return RequestRecord(index=i, prompt_len=16, max_tokens=8, send_s=send, ok=True,
                         ttft_s=ttft, e2e_s=e2e, wall_s=wall, output_tokens=8, status_code=200,
                         request_id=request_id)  # fmt: skip


def _bad(i: int, send: float, wall: float = 0.25) -> RequestRecord:
    return RequestRecord(index=i, prompt_len=16, max_tokens=8, send_s=send, ok=False,
                         wall_s=wall, status_code=500, error_kind="http_5xx",
                         error="HTTP 500: boom")  # fmt: skip


def test_a_request_is_a_slice_with_waiting_and_streaming_in_microseconds() -> None:
    events = request_events(_ok(3, 1.5, ttft=0.1, e2e=0.5, wall=0.6, request_id="cmpl-1"), 2)
    assert events == [
        {"pid": 1, "tid": 2, "ph": "X", "name": "req 3", "cat": "request", "ts": 1_500_000,
         "dur": 600_000, "args": {"index": 3, "prompt_len": 16, "output_tokens": 8,
                                  "ttft_s": 0.1, "e2e_s": 0.5, "status_code": 200,
                                  "request_id": "cmpl-1"}},
        {"pid": 1, "tid": 2, "ph": "X", "name": "waiting for the first token", "cat": "phase",
         "ts": 1_500_000, "dur": 100_000},
        {"pid": 1, "tid": 2, "ph": "X", "name": "streaming", "cat": "phase", "ts": 1_600_000,
         "dur": 400_000},
    ]  # fmt: skip


def test_a_failed_request_is_named_failed_with_its_error_at_its_end() -> None:
    events = request_events(_bad(7, 2.0, wall=0.25), 0)
    assert events == [
        {"pid": 1, "tid": 0, "ph": "X", "name": "FAILED req 7 (http_5xx)", "cat": "failed",
         "ts": 2_000_000, "dur": 250_000,
         "args": {"index": 7, "prompt_len": 16, "output_tokens": 0, "ttft_s": None,
                  "e2e_s": None, "status_code": 500, "error": "HTTP 500: boom"}},
        {"pid": 1, "tid": 0, "ph": "i", "s": "t", "name": "error: http_5xx", "ts": 2_250_000,
         "args": {"error": "HTTP 500: boom"}},
    ]  # fmt: skip


def test_no_streaming_child_without_an_end_after_the_first_token() -> None:
    names = [e["name"] for e in request_events(_ok(0, 0.0, ttft=0.2, e2e=0.2), 0)]
    assert names == ["req 0", "waiting for the first token"]
    names = [e["name"] for e in request_events(_ok(0, 0.0, ttft=0.2, e2e=None, wall=0.3), 0)]
    assert names == ["req 0", "waiting for the first token"]
    names = [e["name"] for e in request_events(_ok(0, 0.0, ttft=None, e2e=0.3), 0)]
    assert names == ["req 0"]


def test_a_slice_never_has_a_negative_length() -> None:
    (event, *_) = request_events(_ok(0, 1.0, wall=None, e2e=None, ttft=None), 0)
    assert event["dur"] == 0
    record = RequestRecord(index=0, prompt_len=1, max_tokens=1, send_s=1.0, ok=True, wall_s=-0.5)
    assert request_events(record, 0)[0]["dur"] == 0


def test_lanes_show_how_many_requests_were_in_flight() -> None:
    records = [_ok(0, 0.0, wall=1.0), _ok(1, 0.1, wall=0.3), _ok(2, 0.4, wall=1.0),
               _ok(3, 1.0, wall=1.0), _ok(4, 1.05, wall=1.0), _ok(5, 1.1, wall=1.0)]  # fmt: skip
    # 1 ends at 0.4, exactly when 2 is sent: 2 takes its lane; 0 ends at 1.0 with 3's send
    assert lanes(records) == [0, 1, 1, 0, 2, 3]
    assert lanes([]) == []


def test_a_freed_lane_is_the_lowest_one() -> None:
    records = [_ok(0, 0.0, wall=0.5), _ok(1, 0.0, wall=0.2), _ok(2, 0.0, wall=0.1),
               _ok(3, 0.6, wall=1.0)]  # fmt: skip
    assert lanes(records) == [0, 1, 2, 0]


def test_a_small_cell_keeps_every_request_in_send_order() -> None:
    records = [_ok(0, 0.3), _bad(1, 0.1), _ok(2, 0.2)]
    assert [r.index for r in keep_bounded(records, limit=3)] == [1, 2, 0]


def test_a_big_cell_keeps_every_failure_then_successes_spread_evenly() -> None:
    records = [_ok(i, i * 1.0) if i % 10 else _bad(i, i * 1.0) for i in range(100)]
    kept = keep_bounded(records, limit=20)
    assert len(kept) == 20
    assert [r.index for r in kept if not r.ok] == list(range(0, 100, 10))
    ok = [r.index for r in kept if r.ok]
    assert ok == [1, 11, 21, 31, 41, 51, 61, 71, 81, 91]
    assert [r.send_s for r in kept] == sorted(r.send_s for r in kept)


def test_a_cell_of_more_failures_than_the_bound_keeps_the_first_failures() -> None:
    records = [_bad(i, 10.0 - i) for i in range(6)] + [_ok(6, 0.0)]
    kept = keep_bounded(records, limit=4)
    assert sorted(r.index for r in kept) == [0, 1, 2, 3]


def test_the_trace_names_its_cell_lanes_signals_and_counts() -> None:
    records = [_ok(0, 0.0, wall=1.0), _bad(1, 0.5)]
    signals = {"signals": {"running": {"series": [[0.0, 1], [0.5, 2.0]]},
                           "waiting": {"available": False}, "not_a_track": {"series": [[0, 9]]},
                           "kv_cache_usage": None}}  # fmt: skip
    doc = trace_document(records, "fast-c8", signals)
    events = doc["traceEvents"]
    assert events[:4] == [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "requests: fast-c8"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "server signals"}},
        {"ph": "M", "pid": 1, "tid": 0, "name": "thread_name", "args": {"name": "lane 0"}},
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "lane 1"}},
    ]  # fmt: skip
    assert [e for e in events if e["ph"] == "C"] == [
        {"ph": "C", "pid": 2, "name": "running", "ts": 0, "args": {"value": 1}},
        {"ph": "C", "pid": 2, "name": "running", "ts": 500_000, "args": {"value": 2.0}},
    ]
    assert [e["name"] for e in events if e["ph"] == "X" and e.get("cat") != "phase"] == [
        "req 0", "FAILED req 1 (http_5xx)"]  # fmt: skip
    assert doc["displayTimeUnit"] == "ms"
    assert doc["metadata"] == {"cell": "fast-c8", "requests": 2, "requests_kept": 2,
                               "failed": 1, "source": "gpudoctor"}  # fmt: skip
    assert trace_document(records, "x")["traceEvents"][4:] == trace_document(
        records, "x", {})["traceEvents"][4:]  # fmt: skip


def test_the_trace_file_is_named_after_the_cell_safely() -> None:
    assert trace_name("fast-c8-r2.5") == "fast-c8-r2.5.json"
    assert trace_name("a b/c:d") == "a_b_c_d.json"
    assert trace_name("../..") == "cell.json"
    assert trace_name("._x_.") == "x.json"
    assert trace_name("ünï") == "ünï.json"
    assert trace_path(Path("/runs/r"), "../etc/passwd") == Path("/runs/r/trace/etc_passwd.json")


def test_a_cell_label_names_its_config_load_and_repeat() -> None:
    assert cell_label("fast", 8, None, 0) == "fast-c8"
    assert cell_label("fast", 8, 30.0, 0) == "fast-c8-r30"
    assert cell_label("fast", 8, float("inf"), 2) == "fast-c8-rinf-rep2"
    assert cell_label("fast", 1, 0.5, 1) == "fast-c1-r0.5-rep1"


def test_a_written_trace_reads_back_and_anything_else_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / "run" / "trace" / "x.json"
    assert write_trace(path, "x", [_ok(0, 0.0)], None) == path
    back = read_trace(path)
    assert back is not None and back["metadata"]["requests"] == 1
    assert path.read_text() == json.dumps(back, separators=(",", ":"))  # compact
    assert read_trace(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert read_trace(tmp_path / "bad.json") is None
    (tmp_path / "list.json").write_text("[]")
    assert read_trace(tmp_path / "list.json") is None
    (tmp_path / "other.json").write_text('{"traceEvents": {}}')
    assert read_trace(tmp_path / "other.json") is None


def test_a_written_trace_holds_its_cell_s_name_and_server_signals(tmp_path: Path) -> None:
    signals = {"signals": {"running": {"series": [[0.5, 3]]}}}
    path = write_trace(tmp_path / "trace" / "c.json", "fast-c8", [_ok(0, 0.0)], signals)
    back = read_trace(path)
    assert back is not None and back["metadata"]["cell"] == "fast-c8"
    assert [e for e in back["traceEvents"] if e["ph"] == "C"] == [
        {"ph": "C", "pid": 2, "name": "running", "ts": 500_000, "args": {"value": 3}}]  # fmt: skip


def test_a_label_keeps_its_letters_at_both_ends() -> None:
    assert trace_name("Xfast-c8X") == "Xfast-c8X.json"
    assert trace_name("_x.") == "x.json"


def test_each_request_s_events_are_on_its_lane_and_failures_are_counted() -> None:
    records = [_ok(0, 0.0, wall=1.0), _bad(1, 0.1), _bad(2, 0.2)]
    doc = trace_document(records, "c")
    slices = {e["name"]: e["tid"] for e in doc["traceEvents"] if e["ph"] in ("X", "i")
              and e.get("cat") != "phase"}  # fmt: skip
    assert slices == {"req 0": 0, "FAILED req 1 (http_5xx)": 1, "error: http_5xx": 2,
                      "FAILED req 2 (http_5xx)": 2}  # fmt: skip
    assert doc["metadata"]["failed"] == 2
