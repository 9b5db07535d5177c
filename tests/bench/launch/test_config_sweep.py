"""One configuration on one server, and the serial strategy, in-process and fast: a real
server process (runner_support.TINY_SERVER) started, swept and stopped by the real
lifecycle; a server that cannot start (each cell crashed, the configuration quirked); a
server dying in a cell (the rest of its sweep skipped, retryable); the serial order, each
configuration's preflight before its own server. The load generator is
:class:`~tests.bench.launch.runner_support.RecordedMeasure`."""

from __future__ import annotations

import dataclasses
import os
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from gpudoctor.bench.launch.cell_runner import RunningServer
from gpudoctor.bench.launch.config_sweep import serve_and_sweep, serving, sweep
from gpudoctor.bench.launch.serial import run_serial
from gpudoctor.bench.launch.server import tagged_processes
from gpudoctor.bench.launch.server_lifecycle import StartFailed
from gpudoctor.bench.launch.slots import Gpu, Slot
from gpudoctor.bench.launch.steps import CampaignError
from gpudoctor.bench.plan.quirks import load_quirks
from tests.bench.launch.runner_support import (
    Launch,
    RecordedMeasure,
    configs,
    kill_server,
    measurement,
    open_launch,
    write_plan,
)


def _launch(tmp_path: Path, body: str, command: list[str] | None = None,
            concurrency: str = "[1, 2]") -> AbstractContextManager[Launch]:  # fmt: skip
    return open_launch(tmp_path, write_plan(tmp_path, body, command, concurrency=concurrency))


def _servers(launch: Launch) -> list[dict]:
    from gpudoctor.bench.results.run_dir import read_records

    return read_records(launch.rundir.path / "servers.jsonl")[0]


def test_a_configuration_is_started_swept_in_order_and_stopped(tmp_path: Path) -> None:
    with _launch(tmp_path, configs("a")) as launch:
        plan = launch.plan
        measure = RecordedMeasure([measurement(4), measurement(4)])
        servers = launch.servers()
        serve_and_sweep(servers, launch.runner(measure), plan.configs[0], plan.cells())
        records = launch.records()
        assert [(r["concurrency"], r["status"]) for r in records] == [(1, "ok"), (2, "ok")]
        assert records[0]["server"]["max_context"] == 4096
        [line] = _servers(launch)
        assert line["label"] == "a@tp1" and line["pid"] == records[1]["server"]["pid"]
        assert line["exit_code"] is not None  # stopped
        assert not tagged_processes(launch.tag)
        assert launch.state_json()["running"] == []
        assert servers.live == {} and servers.starts == 1
        assert (
            f"bench: a@tp1: ready in {records[0]['server']['startup_s']:.1f} s, max context 4096"
            in (launch.shown.getvalue().splitlines())
        )
        assert not launch.quirks.exists()


def test_a_server_that_cannot_start_crashes_each_cell_and_is_quirked(tmp_path: Path) -> None:
    command = ["/bin/sh", "-c", "echo 'fatal: out of memory'; exit 1", "{port}"]
    with _launch(tmp_path, configs("a"), command) as launch:
        plan = launch.plan
        measure = RecordedMeasure([])
        servers = launch.servers()
        with serving(servers, launch.runner(measure), plan.configs[0], plan.cells()) as got:
            assert isinstance(got, StartFailed) and got.exited
        [quirk] = [q for q in load_quirks(launch.quirks) if q.source != "shipped"]
        assert quirk.reason == got.reason and quirk.arch == "cpu"
        assert len(launch.records()) == 2
        serve_and_sweep(servers, launch.runner(measure), plan.configs[0], plan.cells())
        assert measure.calls == []
        records = launch.records()
        reason = (
            "server failed to start: server exited with code 1 during startup: fatal: out of memory"
        )
        assert [(r["concurrency"], r["status"], r["reason"]) for r in records] == [
            (1, "crashed", reason), (2, "crashed", reason)
        ] * 2  # fmt: skip
        assert records[0]["server_log_tail"][-1] == "fatal: out of memory"
        assert records[0]["server"]["argv"][:2] == ["/bin/sh", "-c"]
        assert launch.writer.counts["crashed"] == 4


def test_a_server_that_only_missed_its_readiness_deadline_is_no_crash_quirk(
    tmp_path: Path,
) -> None:
    """Issue 45.2: a slow start was written down as a crash quirk (skipped forever after)."""
    command = ["/bin/sh", "-c", "echo 'ERROR still loading'; exec sleep 60", "{port}"]
    plan = write_plan(tmp_path, configs("a"), command)
    plan = dataclasses.replace(plan, engine=dataclasses.replace(plan.engine, startup_timeout_s=0.3))
    with open_launch(tmp_path, plan) as launch:
        servers = launch.servers()
        runner = launch.runner(RecordedMeasure([]))
        with serving(servers, runner, plan.configs[0], plan.cells()) as got:
            assert isinstance(got, StartFailed) and not got.exited
        assert got.reason == "server failed to start: server not ready after 0 s: still loading"
        assert [r["status"] for r in launch.records()] == ["crashed", "crashed"]
        assert not launch.quirks.exists()


def test_a_server_dying_in_a_cell_skips_the_rest_of_its_sweep(tmp_path: Path) -> None:
    with _launch(tmp_path, configs("a"), concurrency="[1, 2, 3]") as launch:
        plan = launch.plan
        measure = RecordedMeasure([measurement(1, {"disconnect": 3})], during=kill_server)
        servers = launch.servers()
        runner = launch.runner(measure)
        with serving(servers, runner, plan.configs[0], plan.cells()) as server:
            assert isinstance(server, RunningServer)
            reason = sweep(servers, runner, server, plan.cells())
        assert reason == "not run: the server of a@tp1 crashed at concurrency 1"
        records = launch.records()
        assert [(r["concurrency"], r["status"]) for r in records] == [
            (1, "crashed"), (2, "skipped"), (3, "skipped")
        ]  # fmt: skip
        assert records[0]["reason"] == "server exited with code 3 during the cell"
        assert all(r["reason"] == reason and r["retryable"] is True for r in records[1:])
        assert all(r["server"]["pid"] == records[0]["server"]["pid"] for r in records)
        [quirk] = [q for q in load_quirks(launch.quirks) if q.source != "shipped"]
        assert quirk.reason == "server exited with code 3 during the cell"
        assert len(measure.calls) == 1
        assert _servers(launch)[0]["exit_code"] == 3


def test_a_sweep_that_finishes_says_nothing_stopped_it(tmp_path: Path) -> None:
    with _launch(tmp_path, configs("a")) as launch:
        plan = launch.plan
        servers, runner = launch.servers(), launch.runner(RecordedMeasure([measurement(4)] * 2))
        with serving(servers, runner, plan.configs[0], plan.cells()) as server:
            assert isinstance(server, RunningServer)
            assert sweep(servers, runner, server, plan.cells()) is None
        assert [r["status"] for r in launch.records()] == ["ok", "ok"]


def test_the_server_is_stopped_when_the_sweep_is_interrupted(tmp_path: Path) -> None:
    with _launch(tmp_path, configs("a")) as launch:
        plan = launch.plan
        servers = launch.servers()
        runner = launch.runner(None)
        with (
            pytest.raises(KeyboardInterrupt),
            serving(servers, runner, plan.configs[0], plan.cells()) as server,
        ):
            assert isinstance(server, RunningServer) and server.process.alive()
            raise KeyboardInterrupt
        assert not server.process.alive() and not tagged_processes(launch.tag)
        assert [line["label"] for line in _servers(launch)] == ["a@tp1"]
        assert launch.records() == []


def test_serial_runs_each_configuration_after_its_preflight_one_server_at_a_time(
    tmp_path: Path,
) -> None:
    with _launch(tmp_path, configs("a") + configs("b", args="threads = 2")) as launch:
        plan = launch.plan
        seen: list[tuple[str, int, int]] = []

        def preflight(when: str) -> None:
            seen.append((when, len(_servers(launch)), len(tagged_processes(launch.tag))))

        groups = [(c, [cell for cell in plan.cells() if cell.config == c]) for c in plan.configs]
        run_serial(launch.servers(), launch.runner(RecordedMeasure([measurement(4)] * 4)),
                   preflight, groups)  # fmt: skip
        # each preflight before its own server, after the previous one stopped
        assert seen == [("config a@tp1", 0, 0), ("config b@tp1", 1, 0)]
        assert [(r["config"], r["concurrency"]) for r in launch.records()] == [
            ("a", 1), ("a", 2), ("b", 1), ("b", 2)
        ]  # fmt: skip
        assert [line["label"] for line in _servers(launch)] == ["a@tp1", "b@tp1"]


def test_a_failed_preflight_stops_serial_before_that_configuration_starts(tmp_path: Path) -> None:
    with _launch(tmp_path, configs("a") + configs("b", args="threads = 2")) as launch:
        plan = launch.plan

        def preflight(when: str) -> None:
            if when == "config b@tp1":
                raise CampaignError("preflight (config b@tp1) failed: gpu.visible")

        groups = [(c, [cell for cell in plan.cells() if cell.config == c]) for c in plan.configs]
        with pytest.raises(CampaignError, match="config b@tp1"):
            run_serial(launch.servers(), launch.runner(RecordedMeasure([measurement(4)] * 4)),
                       preflight, groups)  # fmt: skip
        assert [r["config"] for r in launch.records()] == ["a", "a"]
        assert [line["label"] for line in _servers(launch)] == ["a@tp1"]
        assert os.path.exists(launch.rundir.path / "servers.jsonl")


def test_a_slot_server_runs_on_its_gpus_and_its_crash_is_quirked(tmp_path: Path) -> None:
    with _launch(tmp_path, configs("a")) as launch:
        plan = launch.plan
        measure = RecordedMeasure([measurement(1, {"disconnect": 3})], during=kill_server)
        slot = Slot(2, (Gpu(1, "GPU-b"),))
        serve_and_sweep(
            launch.servers(), launch.runner(measure), plan.configs[0], plan.cells(), slot
        )
        records = launch.records()
        assert [(r["status"], r["slot"], r["gpus"]) for r in records] == [
            ("crashed", 2, ["GPU-b"]), ("skipped", 2, ["GPU-b"])
        ]  # fmt: skip
        [quirk] = [q for q in load_quirks(launch.quirks) if q.source != "shipped"]
        assert quirk.reason == "server exited with code 3 during the cell"
