"""The request-rate axis, repeats and the SLO search, run by the real campaign loop
against tests/bench/stream_server.py (a real streaming server on loopback)."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path

from gpudoctor.bench.cell_spec import rate_from_json
from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.launch.dry_run import dry_run
from gpudoctor.bench.load.arrivals import arrival_offsets
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.plan.search import passes
from gpudoctor.bench.results.compare import compare_runs
from gpudoctor.bench.results.reader import read_run
from gpudoctor.bench.results.run_dir import read_records
from gpudoctor.bench.results.summary_table import results_table
from tests.bench.campaign_support import stub_plan, wait_no_leftovers, write

ONE_CONFIG = '[[configs]]\nname = "a"\n'


def _records(out: Path) -> list[dict]:
    return read_records(out / "results.jsonl")[0]


def _raw(out: Path, record: dict) -> list[dict]:
    return [json.loads(line) for line in (out / record["raw"]).read_text().splitlines()]


def test_arrivals_are_seeded_with_the_mean_rate_and_the_burstiness_spread() -> None:
    """Gamma gaps of shape k and scale 1/(rate k): mean 1/rate, coefficient of variation
    1/sqrt(k) (k = 1: exponential, Poisson arrivals); the same seed, the same times."""
    assert arrival_offsets(50, 4.0, 0.5, seed=3) == arrival_offsets(50, 4.0, 0.5, seed=3)
    assert arrival_offsets(50, 4.0, 0.5, seed=3) != arrival_offsets(50, 4.0, 0.5, seed=4)
    assert arrival_offsets(5, math.inf) == [0.0] * 5
    for burstiness in (0.25, 1.0, 4.0):
        times = arrival_offsets(20001, 8.0, burstiness, seed=1)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        mean = statistics.fmean(gaps)
        assert abs(mean - 1 / 8.0) < 0.05 / 8.0, (burstiness, mean)
        cv = statistics.pstdev(gaps) / mean
        assert abs(cv - 1 / math.sqrt(burstiness)) < 0.08 / math.sqrt(burstiness), (burstiness, cv)


def test_request_rate_axis_runs_each_rate_once_resumes_and_compares(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """[axes] request_rate = [20, "inf"]: one cell per (concurrency, rate), keyed by
    both; every request leaves at or after its seeded arrival time; a second launch runs
    nothing; compare matches the cells (rate included) and the table shows the rate."""
    workload = "input_len = 32\noutput_len = 4\nnum_prompts = 12\nwarmup = 0\nburstiness = 2"
    text = stub_plan(tiny_model_dir, ONE_CONFIG, "[8]", workload).replace(
        "concurrency = [8]\n", 'concurrency = [8]\nrequest_rate = [20, "inf"]\n')  # fmt: skip
    plan = load_plan(write(tmp_path, text))
    assert [(c.concurrency, c.request_rate) for c in plan.cells()] == [(8, 20.0), (8, math.inf)]
    out = tmp_path / "run"
    summary = run_campaign(plan, LaunchOptions(out=out))
    # the paced cell may be client-bound on a starved box (no result, but measured: what is
    # asserted below is the schedule each request kept, late or not)
    assert (summary.ok + summary.client_bound, summary.failed, summary.server_starts) == (2, 0, 1)
    records = _records(out)
    assert [rate_from_json(r["request_rate"]) for r in records] == [20.0, math.inf]
    assert records[1]["request_rate"] == "inf"  # strict JSON: no Infinity literal
    paced = _raw(out, records[0])
    expected = arrival_offsets(12, 20.0, 2.0, seed=0)
    for request in paced:
        assert request["send_s"] >= expected[request["index"]] - 1e-3
    assert max(r["send_s"] for r in paced) >= expected[-1] - 1e-3
    burst = _raw(out, records[1])
    # inf: nobody waits for a clock (every request's arrival is at 0 s; how soon it really
    # left depends on the box, so the schedule is what is asserted, not a wall time)
    assert [r["intended_s"] for r in burst] == [0.0] * len(burst)
    assert [r["intended_s"] for r in sorted(paced, key=lambda r: r["index"])] == expected
    assert records[0]["measurement"]["client"]["burstiness"] == 2.0
    again = run_campaign(plan, LaunchOptions(out=out))
    assert (again.already_done, again.ok, again.server_starts) == (2, 0, 0)
    result = compare_runs(out, out)
    assert sorted(c.key for c in result.cells) == sorted(c.key for c in plan.cells())
    table = results_table(out, plan)
    assert "rate" in table.splitlines()[1] and " inf " in table
    assert wait_no_leftovers(out) == []


def test_repeats_run_each_cell_n_times_and_report_the_spread(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """repeats = 3: three records per cell (own keys, one group), resumable; the table
    shows the mean and the spread; compare uses the spread across repeats."""
    text = stub_plan(tiny_model_dir, ONE_CONFIG, "[1, 2]").replace(
        'name = "stub"', 'name = "stub"\nrepeats = 3')  # fmt: skip
    plan = load_plan(write(tmp_path, text))
    cells = plan.cells()
    assert len(cells) == 6 and len({c.key for c in cells}) == 6
    assert len({c.group for c in cells}) == 2
    one = load_plan(write(tmp_path, stub_plan(tiny_model_dir, ONE_CONFIG, "[1, 2]"), "one.toml"))
    assert {c.key for c in one.cells()} <= {c.key for c in cells}  # repeat 0 = the plain cell
    out = tmp_path / "run"
    assert run_campaign(plan, LaunchOptions(out=out)).ok == 6
    records = _records(out)
    assert sorted((r["concurrency"], r["repeat"]) for r in records) == [
        (n, i) for n in (1, 2) for i in range(3)
    ]
    assert len({r["group"] for r in records}) == 2
    table = results_table(out, plan).splitlines()
    assert table[1].split()[-2:] == ["n", "±"]
    assert len(table) == 5 and all(line.split()[-2] == "3" for line in table[3:])
    result = compare_runs(out, out)
    assert len(result.cells) == 2
    for cell in result.cells:
        spread = cell.repeats_a["output_throughput"]
        assert spread is not None and len(spread["values"]) == 3
        low, high = cell.repeat_intervals["output_throughput"]
        assert low <= 1.0 <= high and cell.within_noise["output_throughput"] is True
    assert run_campaign(plan, LaunchOptions(out=out)).already_done == 6


def _search_plan(tmp_path: Path, model: Path, high: int = 400) -> Path:
    workload = "input_len = 16\noutput_len = 8\nnum_prompts = 16\nwarmup = 0"
    text = stub_plan(model, ONE_CONFIG, "[16]", workload,
                     server_args='token-delay-ms = 3, max-running = 1')  # fmt: skip
    text += (f'[search]\nover = "request_rate"\nslo = {{ ttft_ms = 60 }}\ngoodput = 0.9\n'
             f"low = 2\nhigh = {high}\ntolerance = 20\n")  # fmt: skip
    return write(tmp_path, text)


def test_search_bisects_the_rate_with_ordinary_cells_exactly_once(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A server that generates one request at a time queues under load: the search
    finds the highest rate meeting TTFT <= 60 ms for 90 % of requests. Every probe is
    a recorded cell (once), the result line names the met and the first failing rate,
    a second launch reruns nothing, and the summary prints the result."""
    plan = load_plan(_search_plan(tmp_path, tiny_model_dir))
    assert plan.search is not None and plan.search.over == "request_rate"
    assert (
        dry_run(plan, LaunchOptions(out=tmp_path / "dry"), validate=False)["search"]["high"] == 400
    )
    out = tmp_path / "run"
    run_campaign(plan, LaunchOptions(out=out))
    records = _records(out)
    lines = [r for r in records if r.get("record") == "search"]
    probes = [r for r in records if r.get("search") == "request_rate"]
    assert len(lines) == 1 and lines[0]["status"] == "done"
    result = lines[0]["search"]
    assert len({r["key"] for r in probes}) == len(probes) == len(result["probes"])
    by_key = {r["key"]: r for r in probes}
    for probe in result["probes"]:  # each verdict is the probe cell's own attainment
        record = by_key[probe["key"]]
        assert rate_from_json(record["request_rate"]) == probe["load"]
        assert probe["passed"] == passes(record["measurement"], 0.9)
        assert record["measurement"]["metrics"]["slo_attainment"] is not None
    assert result["probes"][0]["load"] == 2 and result["probes"][1]["load"] == 400
    assert result["met"] is not None and result["failed"] is not None  # 2/s passes, 400/s not
    assert result["met"] < result["failed"] and result["failed"] - result["met"] <= 20
    run = read_run(out)
    assert [s.search["met"] for s in run.searches] == [result["met"]]
    again = run_campaign(plan, LaunchOptions(out=out))
    assert (again.ok, again.server_starts) == (0, 0)
    assert len(_records(out)) == len(records)
    assert f"met {result['met']:g}, first failing {result['failed']:g}" in results_table(out, plan)
    assert wait_no_leftovers(out) == []


def test_interrupted_search_resumes_from_its_recorded_probes(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A search stopped after its first probes (the result line and the later probes
    cut from results.jsonl, as a kill -9 would leave it) resumes: the recorded probes
    are not run again and the result is the same bisection."""
    plan = load_plan(_search_plan(tmp_path, tiny_model_dir))
    out = tmp_path / "run"
    run_campaign(plan, LaunchOptions(out=out))
    full = (out / "results.jsonl").read_text().splitlines(keepends=True)
    matrix_and_two = [line for line in full if '"record": "search"' not in line][:3]
    (out / "results.jsonl").write_text("".join(matrix_and_two))
    kept = {json.loads(line)["key"] for line in matrix_and_two}
    run_campaign(plan, LaunchOptions(out=out))
    records = _records(out)
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys))  # nothing recorded twice
    assert kept <= set(keys)
    line = next(r for r in records if r.get("record") == "search")
    assert [p["key"] for p in line["search"]["probes"]][:2] == [
        json.loads(x)["key"] for x in matrix_and_two[1:3]
    ]
