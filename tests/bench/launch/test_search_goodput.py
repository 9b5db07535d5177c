"""The SLO search's goodput is "at least": a probe whose SLO attainment equals the goodput
passes, so ``goodput = 1.0`` is met by a server that answers every request within the SLO.

The real campaign loop bisecting against tests/bench/stream_server.py (a real streaming
server on loopback) whose every request meets a generous TTFT SLO."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.plan.search import passes
from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import stub_plan, wait_no_leftovers, write


def test_goodput_one_is_met_when_every_request_meets_the_slo(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    workload = "input_len = 16\noutput_len = 4\nnum_prompts = 8\nwarmup = 0"
    text = stub_plan(tiny_model_dir, '[[configs]]\nname = "a"\n', "[4]", workload)
    text += ('[search]\nover = "request_rate"\nslo = { ttft_ms = 60000 }\ngoodput = 1.0\n'
             "low = 2\nhigh = 8\ntolerance = 1\n")  # fmt: skip
    out = tmp_path / "run"
    run_campaign(load_plan(write(tmp_path, text)), LaunchOptions(out=out))
    records = read_records(out / "results.jsonl")[0]
    probes = [r for r in records if r.get("search") == "request_rate"]
    assert probes and all(
        r["measurement"]["metrics"]["slo_attainment"] == 1.0 for r in probes
    )  # every request met the SLO
    (line,) = [r for r in records if r.get("record") == "search"]
    assert line["status"] == "done"
    assert line["search"]["met"] == 8 and line["search"]["failed"] is None
    assert all(p["passed"] is True for p in line["search"]["probes"])
    assert wait_no_leftovers(out) == []


def test_an_attainment_equal_to_the_goodput_passes() -> None:
    measured = {"metrics": {"slo_attainment": 0.75}}  # 3 of 4 requests within the SLO
    assert passes(measured, 0.75)
    assert not passes(measured, 0.76)
    assert passes({"metrics": {"slo_attainment": 1.0}}, 1.0)
