"""Reading results.jsonl as the report, compare and the closing table do: every field of
a cell as a user sees it, the later line of a key winning, a torn or corrupt line left out
and named, numbers a chart cannot draw refused, and a run that has no results yet.
Real files in tmp_path."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gpudoctor.bench.results.reader import (
    CellResult,
    ResultsError,
    SkippedLine,
    cell_flags,
    load_results,
    read_run,
)


def _row(key: str = "k", **extra: object) -> dict:
    return {"key": key, "config": "cfg", "tp": 2, "concurrency": 8, "status": "ok",
            "verdict": {"status": "ok"},
            "measurement": {"metrics": {"output_throughput": 10.0}, "completed": 4,
                            "errors": {}}, **extra}  # fmt: skip


def _write(tmp_path: Path, *lines: object, end: str = "\n") -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    (run / "results.jsonl").write_text(text + end)
    return run


def _one(tmp_path: Path, row: dict) -> CellResult:
    (cell,) = read_run(_write(tmp_path, row)).cells
    return cell


def test_a_cell_reads_every_field_it_was_written_with(tmp_path: Path) -> None:
    row = _row(raw="raw/k.jsonl", request_rate=2.5, repeat=1, group="g", search="s1",
               server_log_tail=["line 1", 2], gpus=["GPU-a", 3, "GPU-b"], slot=4,
               reason="tolerated")  # fmt: skip
    cell = _one(tmp_path, row)
    assert (cell.key, cell.config, cell.tp, cell.concurrency, cell.status) == (
        "k", "cfg", 2, 8, "ok")  # fmt: skip
    assert (cell.raw, cell.request_rate, cell.repeat, cell.group, cell.search) == (
        "raw/k.jsonl", 2.5, 1, "g", "s1")  # fmt: skip
    assert cell.gpus == ("GPU-a", "GPU-b") and cell.slot == 4
    assert cell.extra == {"reason": "tolerated", "server_log_tail": ["line 1", "2"]}
    assert cell.reason == "tolerated" and cell.measurement == row["measurement"]


def test_a_sparse_cell_reads_its_defaults(tmp_path: Path) -> None:
    row = {"key": 7, "config": "c", "tp": 1, "concurrency": 1, "status": "crashed",
           "raw": 5, "group": 3, "search": 1, "server_log_tail": "x", "slot": "1",
           "measurement": "none"}  # fmt: skip
    cell = _one(tmp_path, row)
    assert (cell.key, cell.raw, cell.request_rate, cell.repeat, cell.group) == (
        "7", None, None, 0, "7")  # fmt: skip
    assert (cell.search, cell.slot, cell.gpus, cell.measurement) == (None, None, (), None)
    assert cell.extra == {"reason": "", "server_log_tail": []}
    assert _one(tmp_path, {**row, "request_rate": "inf"}).request_rate == math.inf


def test_a_cell_s_load_and_its_label() -> None:
    closed = CellResult("k", "c", 1, 4, "ok", {})
    rated = CellResult("k", "c", 1, 4, "ok", {}, request_rate=0.5)
    assert (closed.load, closed.load_label) == ((4, math.inf), "c=4")
    assert (rated.load, rated.load_label) == ((4, 0.5), "c=4 r=0.5")


def test_values_only_of_a_measured_cell_and_only_numbers() -> None:
    m = {"metrics": {"a": 3, "b": "fast", "c": 1.5}, "accept_length": 2, "completed": 9,
         "errors": {"timeout": 2, "http_5xx": 1}}  # fmt: skip
    cell = CellResult("k", "c", 1, 1, "ok", m)
    assert (cell.value("a"), cell.value("b"), cell.value("c"), cell.value("zz")) == (
        3.0, None, 1.5, None)  # fmt: skip
    assert cell.value("accept_length") == 2.0 and cell.ok
    assert cell.failed_requests() == 3 and cell.completed == 9
    failed = CellResult("k", "c", 1, 1, "failed", m)
    assert (failed.ok, failed.value("a"), failed.failed_requests(), failed.completed) == (
        False, None, 0, 0)  # fmt: skip
    unmeasured = CellResult("k", "c", 1, 1, "ok", None)
    assert (unmeasured.ok, unmeasured.value("a"), unmeasured.completed) == (False, None, 0)
    assert CellResult("k", "c", 1, 1, "ok", {"completed": 2.0}).completed == 0
    assert CellResult("k", "c", 1, 1, "ok", {"metrics": None}).value("a") is None
    assert CellResult("k", "c", 1, 1, "ok", {}).failed_requests() == 0


def test_the_first_error_flags_and_run_id_of_a_cell() -> None:
    m = {"first_error": {"message": "HTTP 500: x"}, "client": {"run_id": "r1",
         "warmup": {"first_error": "HTTP 422: warm"}}}  # fmt: skip
    cell = CellResult("k", "c", 1, 1, "failed", m, extra={"suspect": "Xid 79", "reason": ""})
    assert (cell.first_error, cell.run_id) == ("HTTP 500: x", "r1")
    assert cell.flag("suspect") == "Xid 79" and cell.flag("client_bound") is None
    assert cell.flag("reason") is None
    warm = CellResult("k", "c", 1, 1, "failed", {**m, "first_error": {"message": ""}})
    assert warm.first_error == "HTTP 422: warm"
    assert CellResult("k", "c", 1, 1, "failed", {"first_error": "text"}).first_error is None
    bare = CellResult("k", "c", 1, 1, "failed", None)
    assert (bare.first_error, bare.run_id, bare.reason, bare.flag("suspect")) == (
        None, None, "", None)  # fmt: skip
    assert CellResult("k", "c", 1, 1, "ok", {"client": "x"}).run_id is None


def test_flags_come_from_the_measurement() -> None:
    m = {"client": {"audit": {"target_rate": 8.0, "rate_ratio": 0.5}}, "telemetry": {"xids": [79]}}
    assert cell_flags(m) == {"client_bound": "sent less, 0.50 of the schedule's rate",
                             "suspect": "Xid 79 during the cell"}  # fmt: skip
    assert cell_flags({"telemetry": {"xids": [79]}}) == {"suspect": "Xid 79 during the cell"}
    assert cell_flags({}) == {} and cell_flags(None) == {}


def test_a_flagged_cell_is_read_flagged(tmp_path: Path) -> None:
    row = _row()
    row["measurement"]["telemetry"] = {"xids": [13]}
    assert _one(tmp_path, row).flag("suspect") == "Xid 13 during the cell"


def test_an_old_ok_record_whose_requests_all_failed_reads_failed(tmp_path: Path) -> None:
    row = _row(reason="")
    del row["verdict"]
    row["measurement"] = {"completed": 0, "errors": {"http_4xx": 4}, "metrics": {}}
    cell = _one(tmp_path, row)
    assert (cell.status, cell.reason) == ("failed", "all 4 requests failed (http_4xx 4)")
    row["measurement"] = {"completed": 4, "errors": {}, "metrics": {"total_output_tokens": 9}}
    assert _one(tmp_path, row).status == "ok"
    row["measurement"] = {"completed": 0, "metrics": {}}  # not counted: left as written
    assert _one(tmp_path, row).status == "ok"
    judged = _row()
    judged["measurement"] = {"completed": 0, "errors": {"http_4xx": 4}, "metrics": {}}
    assert _one(tmp_path, judged).status == "ok"  # a recorded verdict is not judged again


def test_the_later_line_of_a_key_wins_in_first_seen_order(tmp_path: Path) -> None:
    run = _write(tmp_path, _row("a", status="crashed"), _row("b"), "", "   ",
                 _row("a", status="ok"))  # fmt: skip
    done = read_run(run)
    assert [(c.key, c.status) for c in done.cells] == [("a", "ok"), ("b", "ok")]
    assert done.skipped == () and done.warning() is None and done.path == run / "results.jsonl"
    assert load_results(run) == list(done.cells)


def test_corrupt_lines_are_left_out_and_named(tmp_path: Path) -> None:
    run = _write(tmp_path, "{not json", _row("a"), "[1, 2]", {"key": "b"},
                 _row("c", tp=2.5), _row("d", concurrency=-1), _row("e", tp=1 << 31),
                 _row("f", tp=True), _row("g", concurrency="8"), _row("h"))  # fmt: skip
    done = read_run(run)
    assert [c.key for c in done.cells] == ["a", "h"]
    assert done.skipped == (
        SkippedLine(1, "not JSON (Expecting property name enclosed in double quotes)"),
        SkippedLine(3, "bad cell record (TypeError('a JSON list, not an object'))"),
        SkippedLine(4, "bad cell record (ValueError('tp None is not a whole number in range'))"),
        SkippedLine(5, "bad cell record (ValueError('tp 2.5 is not a whole number in range'))"),
        SkippedLine(6, "bad cell record (ValueError('concurrency -1 is not a whole number in"
                       " range'))"),
        SkippedLine(7, "bad cell record (ValueError('tp 2147483648 is not a whole number in"
                       " range'))"),
        SkippedLine(8, "bad cell record (ValueError('tp True is not a whole number in range'))"),
        SkippedLine(9, "bad cell record (ValueError('concurrency 8 is not a whole number in"
                       " range'))"),
    )  # fmt: skip
    assert done.warning() == (
        f"{run / 'results.jsonl'}: skipped 8 corrupt line(s) (line 1: not JSON (Expecting"
        " property name enclosed in double quotes), line 3: bad cell record (TypeError('a JSON"
        " list, not an object')), line 4: bad cell record (ValueError('tp None is not a whole"
        " number in range')), line 5: bad cell record (ValueError('tp 2.5 is not a whole number"
        " in range')), line 6: bad cell record (ValueError('concurrency -1 is not a whole"
        " number in range')), +3 more); kept the other 2 cell(s)"
    )


def test_a_record_missing_a_field_is_named(tmp_path: Path) -> None:
    row = _row()
    del row["config"]
    done = read_run(_write(tmp_path, row))
    assert done.skipped == (SkippedLine(1, "bad cell record (KeyError('config'))"),)
    assert done.warning() == (
        f"{tmp_path / 'run' / 'results.jsonl'}: skipped 1 corrupt line(s) (line 1: bad cell"
        " record (KeyError('config'))); kept the other 0 cell(s)"
    )


def test_the_edges_of_the_matrix_place(tmp_path: Path) -> None:
    assert _one(tmp_path, _row(tp=0, concurrency=(1 << 31) - 1)).concurrency == (1 << 31) - 1
    assert _one(tmp_path, _row(tp=4.0)).tp == 4


@pytest.mark.parametrize("metric", ["1e400", "-1e400", "1e18", "-1e18", "10" * 200])
def test_a_metric_a_chart_cannot_draw_is_refused(tmp_path: Path, metric: str) -> None:
    line = json.dumps(_row()).replace("10.0", metric)
    done = read_run(_write(tmp_path, line))
    assert done.cells == ()
    (skipped,) = done.skipped
    assert skipped.why.startswith("bad cell record (ValueError('metric output_throughput is ")
    assert skipped.why.endswith(", not a finite number below 1e18'))")


def test_an_accept_length_a_chart_cannot_draw_is_refused(tmp_path: Path) -> None:
    row = _row()
    row["measurement"]["accept_length"] = 1e300
    assert read_run(_write(tmp_path, row)).skipped[0].why == (
        "bad cell record (ValueError('metric accept_length is 1e+300, not a finite number below"
        " 1e18'))"
    )
    row["measurement"]["accept_length"] = 9.99e17
    assert _one(tmp_path, row).value("accept_length") == 9.99e17


def test_metrics_that_are_not_a_table_are_refused(tmp_path: Path) -> None:
    row = _row()
    row["measurement"]["metrics"] = [1, 2]
    assert read_run(_write(tmp_path, row)).skipped[0].why == (
        "bad cell record (TypeError('measurement metrics is not a table'))"
    )
    row["measurement"]["metrics"] = {"name": "text", "flag": True}
    assert _one(tmp_path, row).value("name") is None


def test_a_torn_last_line_is_ignored_and_a_complete_one_kept(tmp_path: Path) -> None:
    run = _write(tmp_path, _row("a"), '{"key": "b", "con', end="")
    done = read_run(run)
    assert [c.key for c in done.cells] == ["a"] and done.skipped == ()
    run = _write(tmp_path, _row("a", status="crashed"), _row("a"), end="")
    assert [(c.key, c.status) for c in read_run(run).cells] == [("a", "ok")]
    run = _write(tmp_path, _row("a"), json.dumps({"key": "b"}), end="")
    assert [c.key for c in read_run(run).cells] == ["a"]
    run = _write(tmp_path, _row("a"), "[1]", end="")
    assert [c.key for c in read_run(run).cells] == ["a"]


def _search_row(**search: object) -> dict:
    data = {"over": "request_rate", "met": 2.0, "failed": 4, "slo": {"ttft_ms": 200,
            "tpot_ms": None}, "probes": [1, 2], **search}  # fmt: skip
    return {"record": "search", "key": "s", "config": "cfg", "tp": 2, "status": "done",
            "search": data}  # fmt: skip


def test_search_records_are_read_apart_from_cells(tmp_path: Path) -> None:
    first = _search_row(met=1.0)
    later = {**_search_row(), "status": "stopped", "reason": "crashed"}
    done = read_run(_write(tmp_path, first, _row("a"), later))
    assert [c.key for c in done.cells] == ["a"]
    (search,) = done.searches
    assert (search.key, search.config, search.tp, search.status, search.reason) == (
        "s", "cfg", 2, "stopped", "crashed")  # fmt: skip
    assert search.search["met"] == 2.0 and search.label == "cfg (TP2)"
    bare = _search_row(met=None, failed=None, slo=None, probes=None)
    assert read_run(_write(tmp_path, bare)).searches[0].reason == ""


@pytest.mark.parametrize(("search", "why"), [
    ({"met": "2"}, "TypeError(\"search met '2' is not a number\")"),
    ({"failed": True}, "TypeError('search failed True is not a number')"),
    ({"slo": {"ttft_ms": "fast"}}, "TypeError('search slo is not a table of numbers')"),
    ({"slo": [200]}, "TypeError('search slo is not a table of numbers')"),
    ({"probes": {"a": 1}}, "TypeError('search probes is not a list')"),
])  # fmt: skip
def test_a_search_record_that_is_not_one_is_named(tmp_path: Path, search: dict, why: str) -> None:
    done = read_run(_write(tmp_path, _search_row(**search)))
    assert done.searches == () and done.skipped == (SkippedLine(1, f"bad cell record ({why})"),)


def test_a_search_record_without_its_table_is_named(tmp_path: Path) -> None:
    row = {**_search_row(), "search": [1]}
    assert read_run(_write(tmp_path, row)).skipped[0].why == (
        "bad cell record (TypeError('a search record without its search table'))"
    )


def test_a_run_without_results_says_what_to_do(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ResultsError) as err:
        read_run(run)
    assert str(err.value) == (
        f"{run / 'results.jsonl'}: no such file (is {run} a bench run directory?)"
    )
    (run / "plan.toml").write_text("")
    with pytest.raises(ResultsError) as err:
        read_run(run)
    assert str(err.value) == (
        f"{run}: no cell has finished yet (no results.jsonl); run this again once one has"
        f" (gpudoctor bench status {run} shows the progress)"
    )


def test_a_results_file_behind_a_link_or_unreadable_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "elsewhere.jsonl").write_text(json.dumps(_row()) + "\n")
    (run / "results.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(ResultsError, match=r"results\.jsonl"):
        read_run(run)
    (run / "results.jsonl").unlink()
    (run / "results.jsonl").mkdir()
    with pytest.raises(ResultsError) as err:
        read_run(run)
    assert str(err.value).startswith(f"{run / 'results.jsonl'}")


def test_a_linked_run_directory_is_read(tmp_path: Path) -> None:
    run = _write(tmp_path, _row("a"))
    (tmp_path / "alias").symlink_to(run)
    assert [c.key for c in read_run(tmp_path / "alias").cells] == ["a"]


def test_a_record_whose_telemetry_or_client_is_not_a_table_is_read_unflagged(
    tmp_path: Path,
) -> None:
    row = _row()
    row["measurement"]["telemetry"] = ["not", "a", "table"]
    row["measurement"]["client"] = "none"
    cell = _one(tmp_path, row)
    assert cell.status == "ok" and cell.flag("suspect") is None
    assert cell.flag("client_bound") is None


def test_five_skipped_lines_are_all_named_with_no_more(tmp_path: Path) -> None:
    run = _write(tmp_path, *["[1]"] * 5, _row("a"))
    warning = read_run(run).warning()
    assert warning is not None and warning.endswith("not an object'))); kept the other 1 cell(s)")
    assert warning.count("line ") == 5 and "more" not in warning


def test_six_skipped_lines_name_five_and_one_more(tmp_path: Path) -> None:
    warning = read_run(_write(tmp_path, *["[1]"] * 6, _row("a"))).warning()
    assert warning is not None and warning.count("line ") == 5 and ", +1 more); kept" in warning


def test_a_long_bad_value_is_shown_cut_at_40_characters(tmp_path: Path) -> None:
    long = "9" * 60
    done = read_run(_write(tmp_path, json.dumps(_row()).replace('"tp": 2', f'"tp": "{long}"')))
    assert done.skipped[0].why == (
        f"bad cell record (ValueError('tp {'9' * 40} is not a whole number in range'))"
    )
    metric = json.dumps(_row()).replace("10.0", "1" + "0" * 50)
    why = read_run(_write(tmp_path, metric)).skipped[0].why
    assert f"is {'1' + '0' * 39}, not a finite" in why


def test_a_results_file_that_is_not_utf8_is_still_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    line = json.dumps(_row()).replace('"cfg"', '"caf\xe9"', 1)
    (run / "results.jsonl").write_bytes(line.encode("latin-1") + b"\n")
    (cell,) = read_run(run).cells
    assert cell.config == "caf\ufffd"
