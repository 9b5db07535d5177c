"""`bench compare A B` in process: for each cell a user reads A's value, B's value, B / A
and whether that ratio is within the noise, from the bootstrap of the raw requests (the
interval of B / A itself) or from the spread of repeats; cells that cannot be compared are
listed apart, each with why.

Real run directories in tmp_path (results.jsonl and raw/ per-request files as the launcher
writes them); test_compare_interval_of_b_over_a.py drives the same through real campaigns
and the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results.compare import (
    COMPARED,
    CellRatio,
    Comparison,
    compare_cells,
    compare_runs,
    ratio,
)
from gpudoctor.bench.results.reader import CellResult, ResultsError, read_run


def _cell(key: str, status: str = "ok", repeat: int = 0, group: str = "", raw: str | None = None,
          completed: int = 10, **metrics: float) -> CellResult:  # fmt: skip
    measurement = {"metrics": metrics, "completed": completed, "duration_s": 1.0}
    return CellResult(key=key, config=f"cfg-{key}", tp=2, concurrency=8, status=status,
                      measurement=measurement if status == "ok" else None, raw=raw,
                      repeat=repeat, group=group or key, request_rate=4.0,
                      gpus=(f"GPU-{key}",))  # fmt: skip


def test_ratio_is_b_over_a_and_none_without_both_sides() -> None:
    assert ratio(4.0, 2.0) == 0.5
    assert ratio(2.0, 4.0) == 2.0
    assert ratio(0.0, 4.0) is None
    assert ratio(None, 4.0) is None
    assert ratio(4.0, None) is None
    assert ratio(2.0, 0.0) == 0.0


def test_a_matched_cell_reads_a_b_and_b_over_a_with_its_place() -> None:
    a = _cell("k", output_throughput=100.0, mean_ttft_ms=20.0)
    b = _cell("k", completed=12, output_throughput=50.0, mean_ttft_ms=30.0)
    done = compare_cells([a], [b])
    (cell,) = done.cells
    assert (cell.key, cell.config, cell.tp, cell.concurrency) == ("k", "cfg-k", 2, 8)
    assert cell.ratios["output_throughput"] == 0.5 and cell.ratios["mean_ttft_ms"] == 1.5
    assert cell.a["output_throughput"] == 100.0 and cell.b["mean_ttft_ms"] == 30.0
    assert cell.ratios["p99_tpot_ms"] is None and cell.a["p99_tpot_ms"] is None
    assert (cell.requests_a, cell.requests_b) == (10, 12)
    assert cell.request_rate == 4.0 and (cell.gpus_a, cell.gpus_b) == (("GPU-k",), ("GPU-k",))
    assert set(cell.ratios) == set(COMPARED) == set(cell.within_noise) == set(cell.intervals)
    assert all(v is None for v in cell.intervals.values())  # no run directories: no bootstrap
    assert all(v is None for v in cell.within_noise.values())
    assert all(v is None for v in cell.repeat_intervals.values())
    assert cell.repeats_a["output_throughput"] == {"values": [100.0], "mean": 100.0, "std": 0.0,
                                                   "rel_std": 0.0}  # fmt: skip
    assert cell.repeats_b["p99_tpot_ms"] is None and cell.signals == ()
    assert (done.only_a, done.only_b, done.not_measured, done.warnings) == ((), (), {}, ())


def test_cells_in_one_run_only_or_not_measured_in_both_are_listed_apart() -> None:
    cells_a = [_cell("both", output_throughput=1.0), _cell("a1"), _cell("crash-b"),
               _cell("a2"), _cell("crash-a", status="crashed")]  # fmt: skip
    cells_b = [_cell("b2"), _cell("crash-a"), _cell("both", output_throughput=2.0),
               _cell("crash-b", status="crashed"), _cell("b1")]  # fmt: skip
    done = compare_cells(cells_a, cells_b)
    assert [c.key for c in done.cells] == ["both"]
    assert done.only_a == ("a1", "a2") and done.only_b == ("b2", "b1")
    assert done.not_measured == {"crash-b": "A ok, B crashed", "crash-a": "A crashed, B ok"}


def test_matched_cells_keep_a_s_order() -> None:
    cells_a = [_cell(k, output_throughput=1.0) for k in ("z", "m", "a")]
    cells_b = [_cell(k, output_throughput=1.0) for k in ("a", "z", "m")]
    assert [c.key for c in compare_cells(cells_a, cells_b).cells] == ["z", "m", "a"]


def _repeats(key: str, *values: float, failed: int = -1) -> list[CellResult]:
    return [_cell(f"{key}#{i}", status="crashed" if i == failed else "ok", repeat=i, group=key,
                  output_throughput=v) for i, v in enumerate(values)]  # fmt: skip


def test_repeats_are_one_comparison_of_their_means_with_the_range_they_allow() -> None:
    done = compare_cells(_repeats("k", 100.0, 80.0), _repeats("k", 50.0, 70.0))
    (cell,) = done.cells
    assert cell.key == "k" and cell.a["output_throughput"] == 90.0
    assert cell.b["output_throughput"] == 60.0
    assert cell.ratios["output_throughput"] == 60.0 / 90.0
    assert cell.repeat_intervals["output_throughput"] == (50.0 / 100.0, 70.0 / 80.0)
    assert cell.within_noise["output_throughput"] is False
    assert (cell.requests_a, cell.requests_b) == (20, 20)
    spread = cell.repeats_a["output_throughput"]
    assert spread is not None and spread["values"] == [100.0, 80.0] and spread["mean"] == 90.0
    assert round(spread["std"], 6) == round(200**0.5, 6)
    assert round(spread["rel_std"], 6) == round(200**0.5 / 90.0, 6)


def test_repeats_whose_range_holds_one_are_within_the_noise() -> None:
    (cell,) = compare_cells(_repeats("k", 100.0, 80.0), _repeats("k", 95.0, 79.0)).cells
    assert cell.within_noise["output_throughput"] is True
    (cell,) = compare_cells(_repeats("k", 100.0, 80.0), _repeats("k", 100.0, 120.0)).cells
    assert cell.repeat_intervals["output_throughput"] == (1.0, 1.5)
    assert cell.within_noise["output_throughput"] is True  # the range's low edge is 1
    (cell,) = compare_cells(_repeats("k", 100.0, 80.0), _repeats("k", 60.0, 80.0)).cells
    assert cell.repeat_intervals["output_throughput"] == (0.6, 1.0)
    assert cell.within_noise["output_throughput"] is True  # the range's high edge is 1


def test_no_repeat_range_from_one_repeat_a_side_or_a_zero() -> None:
    (cell,) = compare_cells(_repeats("k", 100.0, 80.0, failed=1), _repeats("k", 5.0, 6.0)).cells
    assert cell.repeat_intervals["output_throughput"] is None
    assert cell.a["output_throughput"] == 100.0 and cell.requests_a == 10
    (cell,) = compare_cells(_repeats("k", 5.0, 6.0), _repeats("k", 100.0, 80.0, failed=0)).cells
    assert cell.repeat_intervals["output_throughput"] is None
    (cell,) = compare_cells(_repeats("k", 0.0, 6.0), _repeats("k", 1.0, 2.0)).cells
    assert cell.repeat_intervals["output_throughput"] is None
    assert cell.ratios["output_throughput"] == 1.5 / 3.0


def test_a_cell_with_some_repeats_measured_is_compared_and_none_measured_is_not() -> None:
    done = compare_cells(_repeats("k", 1.0, 2.0, failed=0), _repeats("k", 1.0, 2.0))
    assert [c.key for c in done.cells] == ["k"]
    crashed = [_cell("k#0", "crashed", 0, "k"), _cell("k#1", "skipped", 1, "k")]
    done = compare_cells(crashed, _repeats("k", 1.0, 2.0))
    assert done.cells == () and done.not_measured == {"k": "A ok 0/2, B ok"}


def _requests(n: int, seconds_per_token: float) -> list[dict]:
    rows = []
    for i in range(n):
        tokens = 8 + i % 3
        chunks = tuple(0.01 + seconds_per_token * (t + 1) for t in range(tokens))
        e2e = chunks[-1] + 0.001 * (i % 4)
        rows.append(RequestRecord(index=i, prompt_len=16, max_tokens=tokens, send_s=i * 0.01,
                                  ok=True, ttft_s=0.01 + 0.001 * (i % 5), e2e_s=e2e, wall_s=e2e,
                                  chunk_times_s=chunks, chunk_tokens=(1,) * tokens,
                                  output_tokens=tokens,
                                  usage_completion_tokens=tokens).to_json())  # fmt: skip
    return rows


def _run(path: Path, seconds_per_token: float, *keys: str, tail: str = "") -> Path:
    """A run directory whose cells ``keys`` hold 20 requests each at that token pace."""
    (path / "raw").mkdir(parents=True)
    lines = []
    for key in keys:
        rows = _requests(20, seconds_per_token)
        (path / "raw" / f"{key}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        tokens = sum(r["output_tokens"] for r in rows)
        duration = sum(r["wall_s"] for r in rows) / 4
        metrics = {"output_throughput": tokens / duration, "request_throughput": 20 / duration,
                   "mean_ttft_ms": 12.0, "mean_e2e_ms": 1000 * duration / 5}  # fmt: skip
        lines.append({"key": key, "config": "c", "tp": 1, "concurrency": 4, "status": "ok",
                      "verdict": {"status": "ok"}, "raw": f"raw/{key}.jsonl",
                      "measurement": {"metrics": metrics, "completed": 20, "errors": {},
                                      "duration_s": duration}})  # fmt: skip
    (path / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + tail)
    return path


def test_a_clearly_slower_b_has_its_b_over_a_interval_around_the_printed_ratio(
    tmp_path: Path,
) -> None:
    fast = _run(tmp_path / "fast", 0.001, "k")
    slow = _run(tmp_path / "slow", 0.008, "k")
    (cell,) = compare_runs(fast, slow).cells
    r = cell.ratios["output_throughput"]
    interval = cell.intervals["output_throughput"]
    assert r is not None and r < 0.5 and interval is not None
    assert interval[0] <= r <= interval[1] < 1.0
    assert cell.within_noise["output_throughput"] is False
    e2e = cell.intervals["mean_e2e_ms"]
    assert e2e is not None and e2e[0] > 1.0  # latencies: B / A above 1
    (back,) = compare_runs(slow, fast).cells
    back_interval = back.intervals["output_throughput"]
    assert back_interval is not None and back_interval[0] > 1.0
    assert back.ratios["output_throughput"] == 1 / r


def test_the_same_requests_on_both_sides_are_within_the_noise(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 0.004, "k")
    b = _run(tmp_path / "b", 0.004, "k")
    (cell,) = compare_runs(a, b).cells
    assert cell.intervals["output_throughput"] is not None
    assert cell.within_noise["output_throughput"] is True
    assert cell.ratios["output_throughput"] == 1.0


def test_without_a_side_s_raw_file_there_is_no_interval(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 0.004, "k")
    b = _run(tmp_path / "b", 0.008, "k")
    (b / "raw" / "k.jsonl").unlink()
    (cell,) = compare_runs(a, b).cells
    assert all(v is None for v in cell.intervals.values())
    assert cell.within_noise["output_throughput"] is None
    (cell,) = compare_runs(b, a).cells
    assert cell.intervals["output_throughput"] is None


def test_corrupt_lines_of_either_run_are_warned_about(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 0.004, "k", tail="{not json\n")
    b = _run(tmp_path / "b", 0.004, "k")
    done = compare_runs(a, b)
    assert len(done.warnings) == 1 and done.warnings[0].startswith(f"{a / 'results.jsonl'}: ")
    assert len(done.cells) == 1
    done = compare_runs(b, a)
    assert len(done.warnings) == 1 and "skipped 1 corrupt line(s)" in done.warnings[0]
    assert compare_runs(b, b).warnings == ()


def test_only_a_only_b_and_not_measured_come_through_compare_runs(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 0.004, "k", "a-only")
    b = _run(tmp_path / "b", 0.004, "k", "b-only")
    with (b / "results.jsonl").open("a") as f:
        f.write(json.dumps({"key": "a-only", "config": "c", "tp": 1, "concurrency": 4,
                            "status": "crashed"}) + "\n")  # fmt: skip
    done = compare_runs(a, b)
    assert [c.key for c in done.cells] == ["k"]
    assert (done.only_a, done.only_b) == ((), ("b-only",))
    assert done.not_measured == {"a-only": "A ok, B crashed"}


def test_the_json_names_every_part_and_how_the_noise_was_judged() -> None:
    cell = CellRatio("k", "c", 1, 4, {"output_throughput": 0.5})
    data = Comparison((cell,), ("x",), ("y",), {"z": "A ok, B crashed"}, ("w",)).to_json()
    assert data["cells"] == [vars(cell)]
    assert (data["only_a"], data["only_b"], data["not_measured"], data["warnings"]) == (
        ["x"], ["y"], {"z": "A ok, B crashed"}, ["w"])  # fmt: skip
    assert data["noise"] == (
        "95% bootstrap interval of B/A, 1000 resamples of the per-request records (first"
        " repeats); repeat_intervals = the B/A range across repeats; within_noise = either"
        " contains 1"
    )


def test_server_signals_are_shown_a_to_b() -> None:
    a = _cell("k", output_throughput=1.0)
    b = _cell("k", output_throughput=1.0)
    assert a.measurement is not None and b.measurement is not None
    a.measurement["server_signals"] = {"signals": {"running": {"available": True, "max": 3}}}
    b.measurement["server_signals"] = {"signals": {"running": {"available": True, "max": 7}}}
    (cell,) = compare_cells([a], [b]).cells
    assert "    running max: 3 -> 7" in cell.signals
    assert cell.ratios["output_throughput"] == 1.0


def test_b_s_repeats_are_reported_with_their_spread() -> None:
    (cell,) = compare_cells(_repeats("k", 100.0, 80.0), _repeats("k", 50.0, 70.0)).cells
    spread = cell.repeats_b["output_throughput"]
    assert spread is not None and spread["values"] == [50.0, 70.0] and spread["mean"] == 60.0


def test_repeats_below_one_still_give_a_range() -> None:
    (cell,) = compare_cells(_repeats("k", 0.5, 0.8), _repeats("k", 0.4, 0.6)).cells
    assert cell.repeat_intervals["output_throughput"] == (0.4 / 0.8, 0.6 / 0.5)


def test_a_metric_only_one_side_measured_has_no_range_and_no_ratio() -> None:
    a = [_cell(f"k#{i}", repeat=i, group="k", output_throughput=1.0) for i in range(2)]
    b = [_cell(f"k#{i}", repeat=i, group="k", output_throughput=1.0, mean_ttft_ms=5.0 + i)
         for i in range(2)]  # fmt: skip
    (cell,) = compare_cells(a, b).cells
    assert cell.repeat_intervals["mean_ttft_ms"] is None and cell.ratios["mean_ttft_ms"] is None
    (cell,) = compare_cells(b, a).cells
    assert cell.repeat_intervals["mean_ttft_ms"] is None


def test_with_one_run_directory_only_there_is_no_interval(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 0.004, "k")
    cells = compare_runs(a, a).cells
    assert cells[0].intervals["output_throughput"] is not None
    run = list(read_run(a).cells)
    (cell,) = compare_cells(run, run, a, None).cells
    assert cell.intervals["output_throughput"] is None
    (cell,) = compare_cells(run, run, None, a).cells
    assert cell.intervals["output_throughput"] is None


def test_lines_of_an_interrupted_earlier_attempt_do_not_count(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 0.004, "k")
    b = _run(tmp_path / "b", 0.004, "k")
    for run, ours in ((a, "now"), (b, "now")):
        path = run / "raw" / "k.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        earlier = [{**r, "run_id": "earlier"} for r in _requests(20, 0.05)]
        text = [json.dumps({**r, "run_id": ours}) for r in rows]
        if run == a:
            text += [json.dumps(r) for r in earlier]
        path.write_text("\n".join(text) + "\n")
        results = run / "results.jsonl"
        record = json.loads(results.read_text())
        record["measurement"]["client"] = {"run_id": ours}
        results.write_text(json.dumps(record) + "\n")
    (cell,) = compare_runs(a, b).cells
    assert cell.within_noise["output_throughput"] is True
    assert cell.intervals["output_throughput"] is not None


def _rename(run: Path, names: dict[str, str]) -> Path:
    """Give the cells of ``run`` the configuration names ``names`` ({key: config})."""
    lines = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    for line in lines:
        line["config"] = names[line["key"]]
    (run / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def test_runs_of_different_plans_are_one_line_naming_their_configs(tmp_path: Path) -> None:
    """Issue 47: `bench compare` of runs of different plans printed an empty table, then hex
    keys only in A / only in B, exit 0. No cell in common: it says so, with config names."""
    import pytest

    keys = [f"k{i}" for i in range(8)]
    a = _rename(_run(tmp_path / "a", 0.004, *keys), {k: f"cfg{k[1]}" for k in keys})
    b = _rename(_run(tmp_path / "b", 0.004, "x"), {"x": "other"})
    with pytest.raises(ResultsError) as info:
        compare_runs(a, b)
    assert str(info.value) == (
        f"no cell in common: {a} and {b} ran different plans (A: configs cfg0, cfg1, cfg2, cfg3,"
        " cfg4, cfg5 and 2 more; B: config other); compare two runs of the same plan"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "results.jsonl").write_text("")
    assert compare_runs(a, empty).only_a == tuple(keys)  # a run with no cell yet: no verdict
    assert compare_runs(empty, b).only_b == ("x",)


def test_a_common_cell_measured_on_one_side_only_is_no_different_plan(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", 0.004, "k")
    b = tmp_path / "b"
    b.mkdir()
    (b / "results.jsonl").write_text(json.dumps({"key": "k", "config": "c", "tp": 1,
                                                 "concurrency": 4, "status": "crashed"}) + "\n")  # fmt: skip
    done = compare_runs(a, b)
    assert done.cells == () and done.not_measured == {"k": "A ok, B crashed"}


def test_a_runs_configs_are_named_six_at_most_singular_for_one() -> None:
    """The edges of the names in that line: 1 is "config", 2 are "configs"; 6 are all named,
    the 7th is "and 1 more"."""
    from types import SimpleNamespace

    from gpudoctor.bench.results.compare import _configs

    def run(n: int) -> SimpleNamespace:
        return SimpleNamespace(cells=[SimpleNamespace(config=f"c{i}") for i in range(n)] * 2)

    assert _configs(run(1)) == "config c0"
    assert _configs(run(2)) == "configs c0, c1"
    assert _configs(run(6)) == "configs c0, c1, c2, c3, c4, c5"
    assert _configs(run(7)) == "configs c0, c1, c2, c3, c4, c5 and 1 more"
