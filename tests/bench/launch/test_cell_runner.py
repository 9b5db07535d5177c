"""One cell on one running server -> one record in results.jsonl, in-process and fast:
every field a reader of results.jsonl relies on, what the load generator is asked for
(the clamped workload, the SLO, the signals' URLs, the kept text), a cell that cannot
fit, failed requests, and a server that dies during the cell (a real process).

The load generator is :class:`~tests.bench.launch.runner_support.RecordedMeasure`."""

from __future__ import annotations

import calendar
import dataclasses
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor.bench.cell_spec import SLO
from gpudoctor.bench.launch.cell_runner import EXIT_GRACE_S, RunningServer
from gpudoctor.bench.launch.server import ExternalServer, ServerProcess
from tests.bench.launch.runner_support import (
    Launch,
    RecordedMeasure,
    configs,
    measurement,
    open_launch,
    write_plan,
)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    plan = write_plan(tmp_path, configs("a", args="threads = 2"))
    with open_launch(tmp_path, plan) as launch:
        yield launch


def _external(launch: Launch, **facts: object) -> RunningServer:
    """A server that answers (a plan's running server): alive for the whole cell."""
    facts = {"max_context": 4096, **facts}
    return RunningServer(
        launch.plan.configs[0], ExternalServer(), "http://127.0.0.1:9/", facts, 0.0
    )


def test_a_measured_cell_is_one_ok_record_with_every_field(launch: Launch) -> None:
    measure = RecordedMeasure([measurement(4)])
    runner = launch.runner(measure, shard=(2, 3))
    cell = launch.plan.cells()[1]
    server = _external(launch, slot=1, gpus=["GPU-a"], port=9)
    assert runner.run(cell, server) is None
    [record] = launch.records()
    expected = {
        "key": cell.key, "config": "a", "tp": 1, "concurrency": 2, "status": "ok", "reason": "",
        "config_key": cell.config.key, "label": "a@tp1", "plan": "fast",
        "engine": {"name": "command", "version": "v7"}, "gpu_arch": "cpu",
        "args": {"threads": 2}, "gpus": ["GPU-a"], "slot": 1, "shard": "2/3",
        "raw": f"raw/{cell.key}.jsonl",
    }  # fmt: skip
    assert {k: record[k] for k in expected} == expected
    assert record["measurement"] == measurement(4)
    assert record["verdict"]["status"] == "ok" and record["server"] == server.facts
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["recorded_at"])
    assert set(record["timings"]) == {"measure_s", "cell_s"}
    assert 0 <= record["timings"]["measure_s"] <= record["timings"]["cell_s"]
    assert record["clamp"]["clamped"] is False and record["clamp"]["max_context"] == 4096
    assert "request_rate" not in record and "repeat" not in record
    assert launch.writer.counts == {
        "ok": 1,
        "failed": 0,
        "crashed": 0,
        "skipped": 0,
        "client_bound": 0,
    }
    measuring, done = launch.shown.getvalue().splitlines()[-2:]
    assert measuring == "bench: a@tp1 concurrency 2: measuring"
    assert done.startswith("bench: a@tp1 concurrency 2: ok [1/2 done: 1 ok, 0 failed, ")


def test_a_cell_without_a_shard_or_slot_has_no_placement_fields(launch: Launch) -> None:
    runner = launch.runner(RecordedMeasure([measurement(4)]))
    runner.run(launch.plan.cells()[0], _external(launch, port=9))
    [record] = launch.records()
    assert not {"shard", "slot", "gpus"} & set(record)
    runner.record(launch.plan.cells()[1], "skipped", reason="why", server="not a dict")
    assert not {"slot", "gpus"} & set(launch.records()[1])


def test_the_load_generator_gets_the_cell_its_server_and_the_plan_limits(launch: Launch) -> None:
    measure = RecordedMeasure([measurement(4), measurement(4)])
    cell = launch.plan.cells()[0]
    launch.state.start("0", {"slot": 0, "label": "a@tp1"})
    launch.runner(measure).run(cell, _external(launch, gpus=["GPU-b"]))
    [call] = measure.calls
    rundir = launch.rundir.path
    assert call.target.base_url == "http://127.0.0.1:9/"
    assert call.target.served_model == str(Path(launch.plan.source).parent / "m")
    assert call.target.tokenizer_dir == call.target.served_model
    assert call.target.raw_path == rundir / "raw" / f"{cell.key}.jsonl"
    assert call.target.label == "a@tp1-c1"
    assert call.target.trace_path == rundir / "trace" / "a_tp1-c1.json"
    assert call.target.metrics_url is None
    assert call.target.metrics_note == 'the plan sets no [engine] metrics_path (e.g. "/metrics")'
    assert call.target.flush_cache_path is None
    assert call.workload == launch.plan.workload and call.concurrency == 1
    assert call.slo == launch.plan.slo
    limits = launch.plan.limits
    assert call.options == {
        "telemetry": False, "progress": launch.reporter.requests,
        "timeout_s": limits.request_timeout_s, "cell_timeout_s": limits.cell_timeout_s,
        "keep_text": False, "max_total_tokens": None, "telemetry_gpus": ["GPU-b"],
    }  # fmt: skip
    running = launch.state_json()["running"]
    assert running[0]["concurrency"] == 1 and "cell_since" in running[0]
    # on a GPU the telemetry is sampled
    launch.runner(measure, arch="sm_90").run(launch.plan.cells()[1], _external(launch))
    assert measure.calls[1].options["telemetry"] is True


def test_a_speculative_rate_cell_keeps_its_text_at_its_own_rate(tmp_path: Path) -> None:
    plan = write_plan(
        tmp_path,
        "prompts_per_concurrency = 3\n" + configs("s", args='speculative-algorithm = "EAGLE"'),
        head="",
    )
    with open_launch(tmp_path, plan) as launch:
        measure = RecordedMeasure([measurement(6)])
        cell = dataclasses.replace(plan.cells()[1], request_rate=2.5)
        launch.runner(measure).run(cell, _external(launch))
        [call] = measure.calls
        assert call.workload.request_rate == 2.5 and call.workload.num_prompts == 6
        assert call.options["keep_text"] is True
        assert launch.records()[0]["request_rate"] == 2.5


def test_a_search_probe_is_judged_by_the_search_slo(tmp_path: Path) -> None:
    body = "[slo]\nttft_ms = 100\n[search]\nslo = { ttft_ms = 250 }\nhigh = 8\n" + configs("a")
    plan = write_plan(tmp_path, body)
    with open_launch(tmp_path, plan) as launch:
        measure = RecordedMeasure([measurement(4), measurement(4)])
        probe = plan.probe(plan.configs[0], 4.0)
        launch.runner(measure).run(probe, _external(launch))
        assert measure.calls[0].slo == SLO(ttft_ms=250)
        launch.runner(measure).run(plan.cells()[0], _external(launch))  # a matrix cell
        assert measure.calls[1].slo == SLO(ttft_ms=100)


def test_a_search_without_its_own_slo_uses_the_plan_slo(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, "[slo]\nttft_ms = 100\n[search]\nhigh = 8\n" + configs("a"))
    with open_launch(tmp_path, plan) as launch:
        measure = RecordedMeasure([measurement(4)])
        launch.runner(measure).run(plan.probe(plan.configs[0], 4.0), _external(launch))
        assert measure.calls[0].slo == SLO(ttft_ms=100)


def test_an_earlier_attempt_raw_file_is_removed_before_the_cell_runs(launch: Launch) -> None:
    cell = launch.plan.cells()[0]
    raw = launch.rundir.raw_path(cell.key)
    raw.write_text('{"from": "an interrupted attempt"}\n')
    seen: list[bool] = []
    measure = RecordedMeasure([measurement(4)], during=lambda t: seen.append(t.raw_path.exists()))
    launch.runner(measure).run(cell, _external(launch))
    assert seen == [False]


def test_a_cell_that_cannot_fit_is_skipped_for_good_and_nothing_is_sent(launch: Launch) -> None:
    measure = RecordedMeasure([])
    cell = launch.plan.cells()[0]
    assert launch.runner(measure).run(cell, _external(launch, max_context=40)) is None
    assert measure.calls == []
    [record] = launch.records()
    assert record["status"] == "skipped" and record["retryable"] is False
    assert record["reason"] == (
        "cannot fit: output_len 16 + overhead 32 leaves -8 input tokens of a 40-token context"
        " (minimum 16)"
    )
    assert record["clamp"]["max_context"] == 40 and record["measurement"] is None
    assert not launch.rundir.raw_path(cell.key).exists()
    assert launch.writer.counts["skipped"] == 1


def test_a_dataset_cell_records_how_many_prompts_were_cut(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"prompt": "hi"}\n')
    plan = write_plan(tmp_path, 'kind = "jsonl"\ndataset_path = "d.jsonl"\n' + configs("a"))
    with open_launch(tmp_path, plan) as launch:
        measure = RecordedMeasure([measurement(4, prompts_cut=3), measurement(4)])
        runner = launch.runner(measure)
        runner.run(plan.cells()[0], _external(launch))
        runner.run(plan.cells()[1], _external(launch))
        assert measure.calls[0].options["max_total_tokens"] == 4096 - 32
        assert [r["clamp"]["prompts_cut"] for r in launch.records()] == [3, 0]


def test_failed_requests_on_a_live_server_are_a_failed_cell(launch: Launch) -> None:
    measure = RecordedMeasure([measurement(0, {"http_500": 4})])
    assert launch.runner(measure).run(launch.plan.cells()[0], _external(launch)) is None
    [record] = launch.records()
    assert record["status"] == "failed" and record["reason"] == "all 4 requests failed (http_500 4)"
    assert launch.writer.counts["failed"] == 1
    assert (
        launch.shown.getvalue()
        .splitlines()[-1]
        .startswith(
            "bench: a@tp1 concurrency 1: FAILED (all 4 requests failed (http_500 4)) [1/2 done: 0 ok,"
        )
    )


def _process(launch: Launch, script: str) -> ServerProcess:
    return ServerProcess(
        ["/bin/sh", "-c", script], {}, launch.rundir.path / "logs" / "a.log", launch.tag
    )


def test_a_server_found_dead_after_the_cell_makes_it_crashed(launch: Launch) -> None:
    process = _process(launch, "echo 'CUDA error: an illegal memory access'; exit 3")
    process.wait_exit(30)
    server = RunningServer(
        launch.plan.configs[0], process, "http://127.0.0.1:9", {"max_context": 4096}, 0.0
    )
    measure = RecordedMeasure([measurement(4)])
    reason = launch.runner(measure).run(launch.plan.cells()[0], server)
    # the engine's own last error line is in the reason (issue 45.8)
    assert (
        reason == "server exited with code 3 during the cell: CUDA error: an illegal memory access"
    )
    [record] = launch.records()
    assert record["status"] == "crashed" and record["reason"] == reason
    assert record["server_log_tail"][-1] == "CUDA error: an illegal memory access"
    assert record["measurement"] == measurement(4) and "verdict" not in record
    assert launch.writer.counts["crashed"] == 1


@pytest.mark.parametrize("error", ["disconnect", "connect"])
def test_a_server_dying_as_its_requests_break_is_crashed_not_failed(
    launch: Launch, error: str
) -> None:
    # the server takes a moment to exit after its connections closed (its exit lands
    # within the runner's grace, later than the requests' failure)
    process = _process(
        launch, "trap 'sleep 0.3; exit 9' TERM; echo armed; while :; do sleep 0.05; done"
    )
    while "armed" not in process.tail():  # the trap is set: SIGTERM now runs it
        process.wait_exit(0.01)
    server = RunningServer(
        launch.plan.configs[0], process, "http://127.0.0.1:9", {"max_context": 4096}, 0.0
    )
    dying = RecordedMeasure([measurement(1, {error: 3})],
                            during=lambda _t: process.proc.send_signal(signal.SIGTERM))  # fmt: skip
    try:
        reason = launch.runner(dying).run(launch.plan.cells()[0], server)
    finally:
        process.stop(grace_s=5)
    assert reason == "server exited with code 9 during the cell"
    assert launch.records()[0]["status"] == "crashed"
    assert 0.3 < EXIT_GRACE_S <= 5


def test_nothing_is_recorded_once_the_launch_is_stopping(launch: Launch) -> None:
    # Ctrl-C during the cell: the measurement returns, the cell is not finished
    stop = RecordedMeasure([measurement(4)], during=lambda _t: launch.writer.stopping.set())
    runner = launch.runner(stop)
    assert runner.run(launch.plan.cells()[1], _external(launch)) is None
    runner.record(launch.plan.cells()[0], "skipped", reason="x")
    assert launch.records() == [] and launch.writer.counts == dict.fromkeys(
        ("ok", "failed", "crashed", "skipped", "client_bound"), 0
    )
    assert launch.shown.getvalue().splitlines()[-1].endswith("concurrency 2: measuring")


def test_without_a_measure_given_the_load_generator_measures(launch: Launch) -> None:
    from gpudoctor.bench.load.loadgen import measure_cell

    runner = launch.runner(None)
    assert runner._measure() is measure_cell


def test_the_signals_urls_and_the_trace_name_follow_the_cell(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, configs("a"), head="", engine='metrics_path = "/metrics"\n')
    with open_launch(tmp_path, plan) as launch:
        measure = RecordedMeasure([measurement(4)] * 2)
        runner = launch.runner(measure)
        rated = dataclasses.replace(plan.cells()[1], request_rate=2.5, repeat=1)
        runner.run(rated, _external(launch))
        target = measure.calls[0].target
        assert target.metrics_url == "http://127.0.0.1:9/metrics" and target.metrics_note == ""
        assert target.label == "a@tp1-c2-r2.5-rep1"
        assert target.trace_path == launch.rundir.path / "trace" / "a_tp1-c2-r2.5-rep1.json"


def test_an_engine_with_a_cache_to_flush_gets_it_flushed(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    path = tmp_path / "plan.toml"
    path.write_text('name = "s"\n[model]\npath = "m"\n[engine]\nname = "sglang"\n'
                    '[axes]\nconcurrency = [1]\n[[configs]]\nname = "a"\n')  # fmt: skip
    from gpudoctor.bench.plan import load_plan

    with open_launch(tmp_path, load_plan(path)) as launch:
        measure = RecordedMeasure([measurement(4)])
        launch.runner(measure).run(launch.plan.cells()[0], _external(launch))
        assert measure.calls[0].target.flush_cache_path == "/flush_cache"


def test_state_json_shows_the_cell_on_its_slot(launch: Launch) -> None:
    launch.state.start("0", {"slot": 0, "label": "other"})
    launch.state.start("1", {"slot": 1, "label": "a@tp1"})
    runner = launch.runner(RecordedMeasure([measurement(4)]))
    runner.run(launch.plan.cells()[1], _external(launch, slot=1))
    slots = {r["slot"]: r for r in launch.state_json()["running"]}
    assert slots[1]["concurrency"] == 2 and "concurrency" not in slots[0]


def test_the_timings_are_seconds_to_a_tenth_of_a_millisecond(launch: Launch) -> None:
    runner = launch.runner(RecordedMeasure([measurement(4)]))
    before = time.monotonic()
    runner.run(launch.plan.cells()[0], _external(launch))
    took = time.monotonic() - before
    timings = launch.records()[0]["timings"]
    for value in timings.values():
        assert isinstance(value, float) and round(value, 4) == value
    assert 0 <= timings["measure_s"] <= timings["cell_s"] <= took + 1e-4


def test_recorded_at_is_utc_whatever_the_local_zone(
    launch: Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "XST-9")  # nine hours east of UTC
    time.tzset()
    try:
        before = time.time()
        launch.runner(RecordedMeasure([measurement(4)])).run(
            launch.plan.cells()[0], _external(launch)
        )
        after = time.time()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    stamp = launch.records()[0]["recorded_at"]
    at = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    assert int(before) <= at <= after


def test_a_server_that_stays_up_after_broken_connections_is_failed_not_crashed(
    launch: Launch,
) -> None:
    # the connections broke but the process lives on (a hung server): after the grace it is
    # judged by its requests
    process = _process(launch, "echo up; exec sleep 300")
    server = RunningServer(
        launch.plan.configs[0], process, "http://127.0.0.1:9", {"max_context": 4096}, 0.0
    )
    try:
        reason = launch.runner(RecordedMeasure([measurement(0, {"disconnect": 4})])).run(
            launch.plan.cells()[0], server
        )
        assert process.alive()
    finally:
        process.stop(grace_s=5)
    assert reason is None and launch.records()[0]["status"] == "failed"
