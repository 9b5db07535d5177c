"""The table `gpudoctor bench run` prints at the end, row by row: what a user reads for a
measured, failed, flagged, rated or repeated cell, and the line of each SLO search.
A real run directory in tmp_path; test_summary_table_cli.py prints it through a campaign."""

from __future__ import annotations

import json
from pathlib import Path

from gpudoctor.bench.results.reader import CellResult, SearchLine
from gpudoctor.bench.results.repeats import RepeatGroup
from gpudoctor.bench.results.summary_table import (
    format_table,
    group_row,
    rate_text,
    reason_lines,
    results_table,
    row,
    search_lines,
)

PLAN_CONFIGS = '[[configs]]\nname = "a"\n'
METRICS = {"output_throughput": 1234.56, "median_ttft_ms": 10.04, "p99_ttft_ms": 20.06,
           "median_tpot_ms": 1.234, "p99_tpot_ms": 2.345}  # fmt: skip


def _cell(status: str = "ok", measurement: dict | None = None, extra: dict | None = None,
          key: str = "k", repeat: int = 0, rate: float | None = None) -> CellResult:  # fmt: skip
    return CellResult(key=key, config="cfg", tp=2, concurrency=8, status=status,
                      measurement=measurement, extra=extra, repeat=repeat, group="g",
                      request_rate=rate)  # fmt: skip


def test_a_measured_cell_reads_its_numbers_rounded_and_no_errors() -> None:
    cell = _cell(measurement={"metrics": METRICS, "num_prompts": 100})
    assert row(cell) == ("cfg", "2", "8", "ok", "1234.6", "10.0", "20.1", "1.23", "2.35", "0")


def test_failed_requests_of_an_ok_cell_read_as_a_fraction_with_wrong_lengths() -> None:
    m = {"metrics": {**METRICS, "token_count_mismatches": 3}, "num_prompts": 100,
         "errors": {"timeout": 1, "http_5xx": 1}}  # fmt: skip
    assert row(_cell(measurement=m))[-1] == "2/100 (3 usage mismatch)"
    m = {"metrics": METRICS, "errors": {"timeout": 1}}
    assert row(_cell(measurement=m))[-1] == "1"
    m = {"metrics": {"output_throughput": 5.0, "token_count_mismatches": 0}, "num_prompts": 4}
    assert row(_cell(measurement=m)) == ("cfg", "2", "8", "ok", "5.0", "-", "-", "-", "-", "0")


def test_a_failed_cell_reads_failed_with_its_errors_of_its_prompts() -> None:
    m = {"errors": {"http_4xx": 4}, "num_prompts": 4}
    assert row(_cell("failed", m)) == ("cfg", "2", "8", "FAILED", "-", "-", "-", "-", "-", "4/4")
    assert row(_cell("failed", {"errors": {"http_4xx": 4}}))[-1] == "-"
    assert row(_cell("failed", None))[-1] == "-"
    assert row(_cell("crashed", m)) == ("cfg", "2", "8", "crashed", "-", "-", "-", "-", "-", "-")


def test_flags_follow_the_status() -> None:
    m = {"metrics": METRICS}
    flagged = _cell(measurement=m, extra={"suspect": "Xid 79", "client_bound": "late"})
    assert row(flagged)[3] == "ok,suspect,client-bound"
    assert row(_cell(measurement=m, extra={"client_bound": "late", "suspect": ""}))[3] == (
        "ok,client-bound"
    )


def test_the_rate_reads_as_asked_and_as_sent() -> None:
    sent = {"metrics": METRICS, "client": {"audit": {"achieved_rate": 498.123}}}
    assert rate_text(_cell(measurement=sent, rate=500.0)) == "500 (sent 498.1)"
    assert rate_text(_cell(measurement={"metrics": METRICS}, rate=2.5)) == "2.5"
    assert rate_text(_cell(measurement=None, rate=None)) == "-"
    bad = {"client": {"audit": {"achieved_rate": "fast"}}}
    assert rate_text(_cell(measurement=bad, rate=3.0)) == "3"


def test_a_closed_loop_cell_reads_as_closed_loop_with_the_rate_it_reached() -> None:
    """Issue 47: the rate column of a closed-loop run read `- (sent 0.7166)`."""
    sent = {"metrics": METRICS, "client": {"audit": {"achieved_rate": 0.71663}}}
    assert rate_text(_cell(measurement=sent, rate=None)) == "closed loop, 0.717/s"
    assert rate_text(_cell(measurement={"metrics": METRICS}, rate=None)) == "-"


def test_a_repeated_cell_reads_its_means_repeats_and_spread() -> None:
    cells = (_cell(measurement={"metrics": {**METRICS, "output_throughput": 100.0},
                                "errors": {"timeout": 1}}, key="k#0"),
             _cell(measurement={"metrics": {**METRICS, "output_throughput": 300.0},
                                "errors": {"timeout": 2}}, key="k#1", repeat=1),
             _cell("crashed", key="k#2", repeat=2))  # fmt: skip
    assert group_row(RepeatGroup("g", cells)) == (
        "cfg", "2", "8", "ok 2/3", "200.0", "10.0", "20.1", "1.23", "2.35", "3", "2", "70.7%")  # fmt: skip


def test_one_measured_repeat_has_no_spread_and_none_measured_reads_zero() -> None:
    one = (_cell(measurement={"metrics": METRICS}), _cell("crashed", key="k#1", repeat=1))
    assert group_row(RepeatGroup("g", one))[-3:] == ("0", "1", "-")
    none = (_cell("crashed"), _cell("crashed", key="k#1", repeat=1))
    assert group_row(RepeatGroup("g", none)) == (
        "cfg", "2", "8", "crashed", "-", "-", "-", "-", "-", "-", "0", "-")  # fmt: skip
    zero = (_cell(measurement={"metrics": {"output_throughput": 0.0}}),
            _cell(measurement={"metrics": {"output_throughput": 0.0}}, key="k#1", repeat=1))  # fmt: skip
    assert group_row(RepeatGroup("g", zero))[4:] == ("0.0", "-", "-", "-", "-", "0", "2", "-")


def _search(status: str = "done", reason: str = "", **fields) -> SearchLine:
    data = {"over": "request_rate", "slo": {"p99_ttft_ms": 200.0, "p99_tpot_ms": None},
            "goodput": 0.95, "probes": [1, 2, 3], **fields}  # fmt: skip
    return SearchLine("s", "cfg", 2, status, data, reason)


def test_a_search_reads_the_highest_load_met_and_the_first_that_failed() -> None:
    assert search_lines([_search(met=4.5, failed=5.0)]) == [
        "search cfg (TP2) over request_rate: met 4.5, first failing 5 (3 probes;"
        " p99_ttft_ms <= 200; goodput >= 0.95)"
    ]
    stopped = _search("stopped", "the server crashed", met=None, failed=None, probes=None,
                      slo={"a": 1, "b": 2.5})  # fmt: skip
    assert search_lines([stopped]) == [
        "search cfg (TP2) over request_rate: met none (not even low), first failing none"
        " (high met it) (0 probes; a <= 1, b <= 2.5; goodput >= 0.95; stopped: the server"
        " crashed)"
    ]
    assert search_lines([]) == []


def test_the_table_aligns_by_terminal_cells_first_column_left() -> None:
    text = format_table(("name", "n"), [("a🙂", "1"), ("longer", "100")])
    assert text.split("\n") == ["name      n", "------  ---", "a🙂       1", "longer  100"]


def _write_run(path: Path, rows: list[dict]) -> Path:
    path.mkdir()
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _record(key: str, **extra) -> dict:
    return {"key": key, "config": "cfg", "tp": 1, "concurrency": 4, "status": "ok",
            "verdict": {"status": "ok"}, "measurement": {"metrics": METRICS}, **extra}  # fmt: skip


def test_a_run_s_table_has_its_title_header_rows_and_searches(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "run", [_record("a"), _record("b", concurrency=16),
                     {"record": "search", "key": "s", "config": "cfg", "tp": 1,
                      "status": "done", "search": {"over": "concurrency", "met": 4,
                                                   "failed": 16, "goodput": 0.9}}])  # fmt: skip
    lines = results_table(run).splitlines()
    assert lines[0] == f"{'=' * 10} gpudoctor bench: {run} (latencies in ms) {'=' * 10}"
    assert lines[1].split() == ["config", "TP", "c", "status", "out", "tok/s", "TTFT", "p50",
                                "TTFT", "p99", "TPOT", "p50", "TPOT", "p99", "errors"]  # fmt: skip
    assert lines[3].split() == ["cfg", "1", "4", "ok", "1234.6", "10.0", "20.1", "1.23",
                                "2.35", "0"]  # fmt: skip
    assert lines[4].split()[2] == "16"
    assert lines[5] == ("search cfg (TP1) over concurrency: met 4, first failing 16 (0 probes;"
                        " ; goodput >= 0.9)")  # fmt: skip
    assert len(lines) == 6


def test_a_rated_run_has_a_rate_column_and_a_repeated_one_n_and_spread(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "run", [
        _record("a#0", group="a", request_rate=2.0),
        _record("a#1", group="a", repeat=1, request_rate=2.0),
        _record("b", request_rate=None)])  # fmt: skip
    lines = results_table(run).splitlines()
    assert lines[1].split()[:5] == ["config", "TP", "c", "rate", "status"]
    assert lines[1].split()[-2:] == ["n", "±"]
    assert lines[3].split()[:5] == ["cfg", "1", "4", "2", "ok"]
    assert lines[3].split()[-2:] == ["2", "0.0%"]
    assert lines[4].split()[3] == "-" and lines[4].split()[-2:] == ["1", "-"]


def test_a_run_without_results_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert results_table(tmp_path / "empty") == (
        f"(no results: {tmp_path / 'empty' / 'results.jsonl'}: no such file (is"
        f" {tmp_path / 'empty'} a bench run directory?))"
    )


def test_with_its_plan_the_table_follows_the_plan_then_the_search_probes_by_load(
    tmp_path: Path,
) -> None:
    from gpudoctor.bench.plan import load_plan
    from tests.bench.campaign_support import stub_plan, write

    (tmp_path / "model").mkdir()
    plan = load_plan(write(tmp_path, stub_plan(tmp_path / "model", PLAN_CONFIGS, "[1, 2]")))
    first, second = (c.key for c in plan.cells())
    rows = [_record(second, concurrency=2), _record("stale", concurrency=64),
            _record("probe-b", concurrency=32, search="s"),
            _record("probe-a", concurrency=16, search="s"),
            _record(first, concurrency=1)]  # fmt: skip
    run = _write_run(tmp_path / "run", rows)
    lines = results_table(run, plan).splitlines()
    assert [line.split()[2] for line in lines[3:]] == ["1", "2", "16", "32"]
    assert [line.split()[2] for line in results_table(run).splitlines()[3:]] == [
        "2", "64", "32", "16", "1"]  # fmt: skip


def test_an_empty_last_column_leaves_no_trailing_spaces() -> None:
    assert format_table(("name", "note"), [("a", ""), ("b", "x")]).split("\n") == [
        "name  note", "----  ----", "a", "b        x"]  # fmt: skip


def test_the_reasons_of_crashed_and_skipped_cells_follow_the_table() -> None:
    """Issue 45.8: the closing table showed `crashed` and no reason; each configuration's
    reason now follows it, one line per reason, its loads together."""
    why = {"reason": "server exited with code 1 during startup: ValueError: bad len"}
    cells = [
        CellResult("k1", "cfg", 2, 1, "crashed", None, extra=why),
        CellResult("k2", "cfg", 2, 4, "crashed", None, extra=why),
        CellResult("k3", "cfg", 2, 8, "skipped", None, extra={"reason": "quirk x"}),
        CellResult("k4", "other", 1, 1, "crashed", None, extra=why),
        CellResult("k5", "cfg", 2, 2, "failed", None, extra={"reason": "all failed"}),
        CellResult("k6", "cfg", 2, 3, "ok", None, extra={"reason": "1 request failed"}),
        CellResult("k7", "cfg", 2, 9, "skipped", None, extra=None),
        CellResult("k8", "cfg", 4, 1, "crashed", None, extra=why),
    ]
    assert reason_lines(cells) == [
        f"why cfg (TP2) c=1, c=4 crashed: {why['reason']}",
        "why cfg (TP2) c=8 skipped: quirk x",
        f"why other (TP1) c=1 crashed: {why['reason']}",
        f"why cfg (TP4) c=1 crashed: {why['reason']}",
    ]
    assert reason_lines([]) == []


def test_every_string_of_the_run_reaches_the_terminal_escaped(tmp_path: Path) -> None:
    """Issue 46.6: a config name, a search's reason and a server signal's reason (quoting
    a hostile /metrics line) hold OSC 52, a title and a clear screen; the run directory's
    name a bell. Every one is shown escaped (terminal.printable), columns still aligned."""
    osc = "\x1b]52;c;cHduZWQ=\x07"
    why = f"ValueError: Invalid labels: a={osc}\x1b[2J"
    signals = {
        "url": "http://x/metrics",
        "signals": {"kv_cache_usage": {"available": False, "why": why}},
    }
    run = _write_run(tmp_path / "run\x07", [
        _record("a", config=f"c{osc}", measurement={"metrics": METRICS, "server_signals": signals}),
        {"record": "search", "key": "s", "config": f"s{osc}", "tp": 1, "status": "stopped",
         "reason": f"r{osc}", "search": {"over": "concurrency", "met": 4, "failed": 16}}])  # fmt: skip
    text = results_table(run)
    assert not any(ch in text for ch in "\x1b\x07")
    lines = text.splitlines()
    assert lines[0].startswith(f"{'=' * 10} gpudoctor bench: {tmp_path}/run\\x07 ")
    assert lines[3].split()[:3] == ["c\\x1b]52;c;cHduZWQ=\\x07", "1", "4"]
    assert (
        lines[4]
        == "server signals: not available (ValueError: Invalid labels: a=\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J)"
    )
    assert lines[5].startswith("search s\\x1b]52;c;cHduZWQ=\\x07 (TP1)") and "r\\x1b]52" in lines[5]
    assert len(lines[1]) == len(lines[2]) >= len(lines[3].rstrip())
