"""What report.md and report.html state before any number: the workload and SLO the run
used (from its own plan.toml), the cells a reader must know about, the status counts and
the machine (run.json) as a person reads it. Real run directories in tmp_path."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.bench.results.reader import CellResult
from gpudoctor.bench.results.report_facts import (
    attention,
    machine_rows,
    slo_text,
    status_counts,
    workload_rows,
)


def _run(tmp_path: Path, plan: str | None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    if plan is not None:
        (run / "plan.toml").write_text(plan)
    return run


def test_a_plan_silent_on_the_workload_reads_the_defaults(tmp_path: Path) -> None:
    assert workload_rows(_run(tmp_path, 'name = "p"\n')) == [
        ("prompts", "random"),
        ("lengths", "1024 in / 128 out tokens"),
        ("requests", "64 per cell, seed 0"),
        ("arrivals", "closed loop (a new request as each one ends, up to the concurrency)"),
        ("warmup", "2 request(s), not measured"),
        ("ignore_eos", "yes: exact output lengths"),
        ("API", "/v1/completions"),
        ("repeats", "1"),
    ]


def test_every_workload_setting_is_stated(tmp_path: Path) -> None:
    plan = """repeats = 3
[workload]
kind = "jsonl"
dataset_path = "/data/p.jsonl"
input_len = 100
output_len = 20
range_ratio = 0.5
prompts_per_concurrency = 4
seed = 7
warmup = 0
ignore_eos = false
api = "chat"
request_rate = 2.5
burstiness = 0.5
unknown_key = 1
"""
    assert workload_rows(_run(tmp_path, plan)) == [
        ("prompts", "jsonl from /data/p.jsonl"),
        (
            "lengths",
            "100 in / 20 out tokens (each drawn in [0.5 x, 1 x]) (random kind; a"
            " dataset's own lengths otherwise)",
        ),
        ("requests", "4 x concurrency per cell, seed 7"),
        (
            "arrivals",
            "open loop, 2.5 req/s, gamma, burstiness 0.5 arrivals (capped by the concurrency)",
        ),
        ("warmup", "0 request(s), not measured"),
        ("ignore_eos", "no: replies end at EOS"),
        ("API", "/v1/chat/completions"),
        ("repeats", "3"),
    ]


def test_a_rate_axis_is_the_arrival_rate_and_burstiness_one_is_poisson(tmp_path: Path) -> None:
    plan = "[workload]\nburstiness = 1.0\n[axes]\nrequest_rate = [1.0, 4.0]\n"
    rows = dict(workload_rows(_run(tmp_path, plan)))
    assert rows["arrivals"] == (
        "open loop, 1, 4 req/s, Poisson arrivals (capped by the concurrency)"
    )


def test_an_unreadable_or_missing_plan_states_no_workload(tmp_path: Path) -> None:
    assert workload_rows(_run(tmp_path, None)) == []
    (tmp_path / "run" / "plan.toml").write_text("not = [toml")
    assert workload_rows(tmp_path / "run") == []
    assert slo_text(tmp_path / "run") == "no SLO set ([slo] in the plan): goodput is not computed"
    (tmp_path / "run" / "plan.toml").unlink()
    (tmp_path / "run" / "plan.toml").symlink_to(tmp_path / "elsewhere.toml")
    (tmp_path / "elsewhere.toml").write_text("[workload]\nseed = 9\n")
    assert workload_rows(tmp_path / "run") == []


def test_a_workload_that_is_no_table_reads_the_defaults(tmp_path: Path) -> None:
    rows = dict(workload_rows(_run(tmp_path, 'workload = "x"\n')))
    assert rows["requests"] == "64 per cell, seed 0"


def test_the_slo_names_each_limit(tmp_path: Path) -> None:
    run = _run(tmp_path, "[slo]\nttft_ms = 200\ntpot_ms = 50.5\ne2el_ms = 1000\nother = 3\n")
    assert slo_text(run) == (
        "TTFT ≤ 200 ms, TPOT ≤ 50.5 ms, E2E latency ≤ 1000 ms, other ≤ 3 ms (goodput:"
        " successful requests meeting all of them, per second)"
    )


def test_a_search_s_slo_counts_when_the_plan_has_no_slo_table(tmp_path: Path) -> None:
    run = _run(tmp_path, '[search]\nover = "request_rate"\n[search.slo]\nttft_ms = 300\n')
    assert slo_text(run).startswith("TTFT ≤ 300 ms (goodput")
    other = tmp_path / "other"
    other.mkdir()
    both = _run(other, "[slo]\nttft_ms = 1\n[search.slo]\nttft_ms = 300\n")
    assert slo_text(both).startswith("TTFT ≤ 1 ms (goodput")


def test_no_slo_says_goodput_is_not_computed(tmp_path: Path) -> None:
    assert slo_text(_run(tmp_path, "[slo]\n")) == (
        "no SLO set ([slo] in the plan): goodput is not computed"
    )


def _cell(key: str, status: str = "ok", reason: str = "", rate: float | None = None,
          **flags: str) -> CellResult:  # fmt: skip
    return CellResult(key=key, config=f"cfg-{key}", tp=2, concurrency=4, status=status,
                      measurement={"metrics": {}} if status == "ok" else None,
                      request_rate=rate, extra={"reason": reason, **flags})  # fmt: skip


def test_cells_needing_attention_come_failed_and_flagged_first_then_crashed_and_skipped() -> None:
    cells = [_cell("c", "crashed", "CUDA out of memory"), _cell("ok"),
             _cell("f", "failed", "all 4 requests failed"), _cell("s", "skipped", "after a crash"),
             _cell("x", suspect="Xid 79", client_bound="sent less", rate=2.0),
             _cell("g", "failed")]  # fmt: skip
    assert attention(cells) == [
        ("cfg-f (TP2) c=4", "FAILED", "all 4 requests failed"),
        ("cfg-x (TP2) c=4 r=2", "suspect", "Xid 79"),
        ("cfg-x (TP2) c=4 r=2", "client-bound", "sent less"),
        ("cfg-g (TP2) c=4", "FAILED", "its requests failed"),
        ("cfg-c (TP2) c=4", "crashed", "CUDA out of memory"),
        ("cfg-s (TP2) c=4", "skipped", "after a crash"),
    ]
    assert attention([_cell("ok"), _cell("ok2")]) == []


def test_status_counts_count_each_status_and_the_flagged_ok_cells() -> None:
    cells = [_cell("a"), _cell("b", suspect="Xid"), _cell("c", client_bound="late"),
             _cell("d", client_bound="late"), _cell("e", "failed", suspect="Xid"),
             _cell("f", "crashed"), _cell("g", "skipped"), _cell("h", "skipped")]  # fmt: skip
    assert status_counts(cells) == (
        "8 cells: 4 ok, 1 failed, 1 crashed, 2 skipped (1 suspect, 2 client-bound among the ok)."
    )
    assert status_counts([_cell("a")]) == "1 cells: 1 ok, 0 failed, 0 crashed, 0 skipped."
    assert status_counts([]) == "0 cells: 0 ok, 0 failed, 0 crashed, 0 skipped."


def test_the_machine_reads_as_a_person_reads_it() -> None:
    facts = {
        "gpus": [{"index": 0, "name": "NVIDIA H200", "memory_bytes": 150 * 2**30, "uuid": "GPU-a"},
                 {"index": 1, "name": None, "uuid": "GPU-b"}, "garbage"],
        "launches": [{"at": "earlier"}],
        "driver_version": "570.1",
        "cuda_visible_devices": None,
        "numa_nodes": [],
        "mig": False,
        "exclusive": True,
        "clock_mhz": 1980.0,
        "topology": {"b": 2, "a": [1]},
        "empty_table": {},
    }  # fmt: skip
    assert machine_rows(facts) == [
        ("GPU 0", "NVIDIA H200, 150 GiB, GPU-a"),
        ("GPU 1", "–, GPU-b"),
        ("GPU –", "–, –"),
        ("driver version", "570.1"),
        ("cuda visible devices", "–"),
        ("numa nodes", "none"),
        ("mig", "no"),
        ("exclusive", "yes"),
        ("clock mhz", "1980"),
        ("topology", '{"a": [1], "b": 2}'),
        ("empty table", "{}"),
    ]
    assert machine_rows({"gpus": []}) == [("gpus", "none")]
    assert machine_rows({"long": {"k": "x" * 1000}})[0][1] == ('{"k": "' + "x" * 1000)[:400]
    assert machine_rows({"pairs": [[1, 2], ["a"]], "nested": [{}, {"a": 1, "b": None}]}) == [
        ("pairs", "1, 2, a"), ("nested", "none, a 1, b –")]  # fmt: skip


def test_an_open_loop_without_burstiness_is_poisson(tmp_path: Path) -> None:
    rows = dict(workload_rows(_run(tmp_path, "[workload]\nrequest_rate = 3.0\n")))
    assert rows["arrivals"] == "open loop, 3 req/s, Poisson arrivals (capped by the concurrency)"


def test_a_plan_that_is_not_utf8_is_still_read(tmp_path: Path) -> None:
    run = _run(tmp_path, None)
    (run / "plan.toml").write_bytes(
        '[workload]\ndataset_path = "/data/caf\xe9.jsonl"\n'.encode("latin-1")
    )
    rows = dict(workload_rows(run))
    assert rows["prompts"] == "random from /data/caf\ufffd.jsonl"
    assert slo_text(run) == "no SLO set ([slo] in the plan): goodput is not computed"
