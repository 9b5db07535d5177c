"""A configuration's server, start to stop (:class:`ServerLifecycle`), in-process and fast:
what it records (state.json while it runs, one servers.jsonl line when it stops), the GPUs
it is given, a port taken meanwhile retried once, a server that exits, hangs or is not
there, and the local quirks table after a crash.

Real server processes started by the launcher: ``python -m http.server`` serving
``/health`` and ``/v1/models`` (tests/bench/launch/inproc_launch.py), or a short shell
line where a failing server is wanted; a server the user started is a loopback HTTP
server in a thread of this process."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.bench.launch.server_lifecycle import StartFailed
from gpudoctor.bench.launch.slots import Gpu, Slot
from gpudoctor.bench.launch.steps import CampaignError
from gpudoctor.bench.plan import Plan
from tests.bench.launch.inproc_launch import (
    Launch,
    ServedDir,
    http_server_engine,
    load,
    plan_text,
    served_dir,
)

SERVE = f'exec {sys.executable} -m http.server --bind 127.0.0.1 --directory "$0" "$1"'


def _plan(tmp_path: Path, engine: str) -> Plan:
    return load(tmp_path, plan_text(tmp_path, engine))


def _shell(tmp_path: Path, script: str, extra: str = "") -> str:
    """Return ``[engine]`` lines running ``sh -c SCRIPT SERVED PORT`` as the server."""
    served = served_dir(tmp_path / "served")
    words = ["sh", "-c", script, str(served), "{port}"]
    return f"command = {json.dumps(words)}\nstartup_timeout_s = 30\nstop_timeout_s = 5\n{extra}"


@pytest.fixture
def launch(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Launch]:
    """A launch whose engine is ``python -m http.server`` (or the one ``request.param``
    returns: an indirect parameter)."""
    make = getattr(request, "param", None)
    engine = make(tmp_path) if make else http_server_engine(served_dir(tmp_path / "s"))
    run = Launch(_plan(tmp_path, engine), tmp_path / "run")
    yield run
    run.close()


def _state(launch: Launch) -> dict[str, Any]:
    return json.loads((launch.out / "state.json").read_text())


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(x.decode().partition("=")[::2] for x in raw if x)


def test_a_started_server_is_ready_recorded_while_it_runs_and_once_when_it_stops(
    launch: Launch,
) -> None:
    config = launch.plan.configs[0]
    server = launch.servers.start(config)
    facts = server.facts
    assert server.process.alive() and server.base_url == f"http://127.0.0.1:{facts['port']}"
    assert (facts["attempt"], facts["log"], facts["max_context"]) == (1, "logs/a@tp1.log", 4096)
    assert facts["pid"] == server.process.pid and facts["startup_s"] > 0
    assert facts["argv"][-1] == str(facts["port"]) and "slot" not in facts
    assert facts["log_ready_s"] is None  # http.server never prints an engine's ready line
    assert launch.servers.ports == {facts["port"]} and launch.servers.starts == 1
    (running,) = _state(launch)["running"]
    assert {k: running[k] for k in ("label", "slot", "pid", "gpus", "gpu_indices", "log")} == {
        "label": "a@tp1", "slot": 0, "pid": server.process.pid, "gpus": [], "gpu_indices": [],
        "log": "logs/a@tp1.log"}  # fmt: skip
    env = _environ(server.process.pid)
    assert env["GPUDOCTOR_BENCH_TAG"] == launch.servers.tag and "CUDA_VISIBLE_DEVICES" not in env
    assert f"bench: a@tp1: starting server on port {facts['port']}\n" in launch.said()

    before = time.monotonic()
    launch.servers.stop(server)
    took = time.monotonic() - before

    assert not server.process.alive() and launch.servers.live == {}
    assert launch.servers.ports == set() and _state(launch)["running"] == []
    (line,) = launch.servers_lines()
    assert line["exit_code"] == server.process.returncode and line["exit_code"] is not None
    assert (line["label"], line["config_key"], line["port"]) == ("a@tp1", config.key,
                                                                 facts["port"])  # fmt: skip
    assert isinstance(line["stop_s"], float) and 0 <= line["stop_s"] <= took + 0.001
    assert line["startup_s"] <= line["config_wall_s"] <= time.monotonic() - server.started


def test_a_slots_server_sees_only_its_gpus_and_carries_its_slots_tag(launch: Launch) -> None:
    slot = Slot(3, (Gpu(2, "GPU-c", "H200"), Gpu(5, "GPU-f", "H200")))
    server = launch.servers.start(launch.plan.configs[0], slot)
    env = _environ(server.process.pid)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-c,GPU-f"
    assert env["PYTHONUNBUFFERED"] == "1"  # the engine's environment stays
    assert env["GPUDOCTOR_BENCH_TAG"] == launch.servers.tag + ":slot3/"
    facts = server.facts
    assert (facts["slot"], facts["gpus"], facts["gpu_indices"]) == (3, ["GPU-c", "GPU-f"], [2, 5])
    assert launch.servers.live == {3: server.process}
    (running,) = _state(launch)["running"]
    assert (running["slot"], running["gpus"], running["gpu_indices"]) == (3, ["GPU-c", "GPU-f"],
                                                                         [2, 5])  # fmt: skip
    assert f"starting server on port {facts['port']} (slot 3, GPU 2,5)\n" in launch.said()
    launch.servers.stop(server)
    assert launch.servers.live == {} and launch.servers_lines()[0]["slot"] == 3


def test_stop_leaves_another_slots_server_in_state_json(launch: Launch) -> None:
    one = launch.servers.start(launch.plan.configs[0], Slot(1, (Gpu(0, "GPU-a"),)))
    two = launch.servers.start(launch.plan.configs[0], Slot(2, (Gpu(1, "GPU-b"),)))
    assert one.facts["port"] != two.facts["port"]
    launch.servers.stop(one)
    assert [r["slot"] for r in _state(launch)["running"]] == [2]
    assert launch.servers.live == {2: two.process} and two.process.alive()
    launch.servers.stop_all()
    assert not two.process.alive()
    launch.servers.stop(two)


def _port_taken_once(message: str) -> Any:
    def engine(tmp_path: Path) -> str:
        marker = tmp_path / "tried"
        script = f'if mkdir "{marker}" 2>/dev/null; then echo "{message}"; exit 1; fi; {SERVE}'
        return _shell(tmp_path, script)

    return engine


PORT_TAKEN = [
    "OSError: [Errno 98] Address already in use",  # Python's socket.bind (vLLM, SGLang)
    "bind: Address Already In Use",  # C servers (llama.cpp's strerror), any case
    "[Errno 98] error while attempting to bind",
    "Error: listen EADDRINUSE 127.0.0.1",  # Node-style servers
]


@pytest.mark.parametrize("launch", [_port_taken_once(m) for m in PORT_TAKEN], indirect=True)
def test_a_port_taken_meanwhile_is_retried_once_on_another(launch: Launch) -> None:
    server = launch.servers.start(launch.plan.configs[0])
    assert server.facts["attempt"] == 2 and server.process.alive()
    assert launch.servers.starts == 2
    assert "bench: a@tp1: port was taken meanwhile; retrying on another\n" in launch.said()
    first = launch.servers_lines()[0]  # the first attempt's server, stopped
    assert first["attempt"] == 1 and first["exit_code"] == 1
    launch.servers.stop(server)


def _port_always_taken(tmp_path: Path) -> str:
    return _shell(tmp_path, 'echo "OSError: [Errno 98] Address already in use"; exit 1')


@pytest.mark.parametrize("launch", [_port_always_taken], indirect=True)
def test_a_port_taken_twice_fails_the_start(launch: Launch) -> None:
    with pytest.raises(StartFailed) as failed:
        launch.servers.start(launch.plan.configs[0])
    assert failed.value.reason == (
        "server failed to start: server exited with code 1 during startup:"
        " OSError: [Errno 98] Address already in use"
    )
    assert failed.value.exited and failed.value.facts["attempt"] == 2 and launch.servers.starts == 2
    assert "OSError: [Errno 98] Address already in use" in failed.value.tail
    assert launch.servers.live == {} and launch.servers.ports == set()


def _exits(tmp_path: Path) -> str:
    return _shell(tmp_path, 'echo "CUDA out of memory" >&2; exit 3')


@pytest.mark.parametrize("launch", [_exits], indirect=True)
def test_a_server_that_exits_is_not_retried_and_its_last_lines_are_kept(launch: Launch) -> None:
    with pytest.raises(StartFailed) as failed:
        launch.servers.start(launch.plan.configs[0])
    assert str(failed.value) == "server failed to start: server exited with code 3 during startup"
    assert failed.value.tail[-1] == "CUDA out of memory" and failed.value.facts["attempt"] == 1
    assert launch.servers.starts == 1 and "retrying" not in launch.said()
    (line,) = launch.servers_lines()
    assert line["exit_code"] == 3 and _state(launch)["running"] == []


def _never_ready(tmp_path: Path) -> str:
    empty = tmp_path / "empty"  # serves no /health: never ready
    empty.mkdir()
    return http_server_engine(empty).replace("startup_timeout_s = 30", "startup_timeout_s = 1")


@pytest.mark.parametrize("launch", [_never_ready], indirect=True)
def test_a_server_never_ready_is_stopped(launch: Launch) -> None:
    with pytest.raises(
        StartFailed, match=r"server failed to start: server not ready after 1 s"
    ) as failed:
        launch.servers.start(launch.plan.configs[0])
    assert not failed.value.exited  # it only missed its deadline: no crash quirk (issue 45.2)
    assert launch.servers.live == {} and launch.servers.ports == set()
    (line,) = launch.servers_lines()
    assert line["exit_code"] is not None


def test_an_interrupt_while_waiting_stops_the_server(
    launch: Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = []

    def ctrl_c(client: Any, base_url: str) -> bool:  # stands for Ctrl-C during the wait
        started.extend(launch.servers.live.values())
        raise KeyboardInterrupt

    monkeypatch.setattr(launch.engine, "is_ready", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        launch.servers.start(launch.plan.configs[0])
    assert started and not started[0].alive() and launch.servers.live == {}
    assert len(launch.servers_lines()) == 1


def _one_port(tmp_path: Path) -> str:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    _HELD.append(holder)
    port = holder.getsockname()[1]
    served = served_dir(tmp_path / "s")
    return http_server_engine(served, f'port_range = "{port}-{port}"\n')


_HELD: list[socket.socket] = []


@pytest.mark.parametrize("launch", [_one_port], indirect=True)
def test_no_free_port_stops_the_campaign_before_anything_starts(launch: Launch) -> None:
    try:
        with pytest.raises(CampaignError) as stopped:
            launch.servers.start(launch.plan.configs[0])
        port = _HELD[-1].getsockname()[1]
        assert str(stopped.value) == (
            f"no free port in engine.port_range {port}-{port} (1 port(s), all in use on"
            " 127.0.0.1): widen the range or stop what listens there (ss -ltnp);"
            " nothing was run for a@tp1"
        )
        assert launch.servers.starts == 0 and launch.servers_lines() == []
    finally:
        _HELD.pop().close()


def test_ports_handed_out_are_not_handed_out_again_until_their_server_stops(
    tmp_path: Path,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        low = s.getsockname()[1]
    engine = http_server_engine(served_dir(tmp_path / "s"), f'port_range = "{low}-{low + 1}"\n')
    launch = Launch(_plan(tmp_path, engine), tmp_path / "run")
    try:
        first = launch.servers._pick_port()
        second = launch.servers._pick_port()  # the first server may not listen yet
        assert {first, second} == {low, low + 1}
    finally:
        launch.close()


def test_a_running_server_the_user_started_is_measured_and_left_running(
    tmp_path: Path,
) -> None:
    with ServedDir(served_dir(tmp_path / "served")) as url:
        launch = Launch(_plan(tmp_path, f'server_url = "{url}"\n'), tmp_path / "run")
        server = launch.servers.start(launch.plan.configs[0])
        port = int(url.rsplit(":", 1)[1])
        assert {k: server.facts[k] for k in ("launched", "url", "port", "max_context")} == {
            "launched": False, "url": url, "port": port, "max_context": 4096}  # fmt: skip
        assert server.process.pid is None and launch.servers.starts == 0
        (running,) = _state(launch)["running"]
        assert running.pop("since")
        assert running == {"label": "a@tp1", "slot": 0, "pid": None, "gpus": [],
                           "gpu_indices": [], "log": None, "url": url}  # fmt: skip
        assert f"bench: a@tp1: measuring the running server at {url} (not started)\n" in (
            launch.said()
        )
        launch.state.cell("0", 4)  # what the cell runner says when it measures a cell on it
        assert _state(launch)["running"][0]["concurrency"] == 4
        launch.servers.stop(server)
        launch.close()
        (line,) = launch.servers_lines()
        assert line["exit_code"] is None and line["launched"] is False


def test_a_running_server_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # nothing listens there
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    engine = f'server_url = "{url}"\nready_path = "/ready"\nstartup_timeout_s = 1\n'
    launch = Launch(_plan(tmp_path, engine), tmp_path / "run")
    try:
        with pytest.raises(CampaignError) as stopped:
            launch.servers.start(launch.plan.configs[0])
    finally:
        launch.close()
    assert str(stopped.value) == (
        f"engine.server_url {url} does not answer (GET /ready): start the server first,"
        " or remove server_url to let gpudoctor start one"
    )
    assert stopped.value.__cause__ is None and stopped.value.__suppress_context__


def test_a_crash_adds_the_configuration_to_the_local_quirks_table(launch: Launch) -> None:
    config = launch.plan.configs[0]
    launch.servers.record_crash(config, "server exited with code -11 during the cell")
    text = launch.servers.quirks_path.read_text()
    assert f'match = {{ config_key = "{config.key}" }}' in text
    assert 'reason = "server exited with code -11 during the cell"' in text
    assert 'engine = "command"' in text and 'engine_version = "stub-1"' in text
    assert 'arch = "cpu"' in text
    assert launch.said() == (
        f"bench: a@tp1: added to the local quirks table {launch.servers.quirks_path}\n"
    )


def test_a_server_we_stopped_is_not_a_crash(launch: Launch) -> None:
    launch.writer.stopping.set()
    launch.servers.record_crash(launch.plan.configs[0], "server exited with code -15")
    assert not launch.servers.quirks_path.exists() and launch.said() == ""


def test_a_quirks_table_that_cannot_be_written_is_a_warning(tmp_path: Path) -> None:
    table = tmp_path / "quirks-dir"
    table.mkdir()  # a directory where the table should be
    engine = http_server_engine(served_dir(tmp_path / "s"))
    launch = Launch(_plan(tmp_path, engine), tmp_path / "run", quirks=table)
    try:
        launch.servers.record_crash(launch.plan.configs[0], "crashed")
    finally:
        launch.close()
    said = launch.said()
    assert said.startswith("bench: warning: cannot add to the local quirks table: ")
    assert said.count("\n") == 1 and "added to" not in said
    assert os.listdir(table) == []


def _says_ready(tmp_path: Path) -> str:
    return _shell(tmp_path, f'echo "INFO:     Application startup complete."; {SERVE}')


@pytest.mark.parametrize("launch", [_says_ready], indirect=True)
def test_the_servers_own_ready_line_is_timed(launch: Launch) -> None:
    server = launch.servers.start(launch.plan.configs[0])
    log_ready_s = server.facts["log_ready_s"]
    assert log_ready_s is not None and log_ready_s == round(log_ready_s, 3)
    assert 0 < log_ready_s <= server.facts["startup_s"] + 0.001
    assert server.facts["startup_s"] == round(server.facts["startup_s"], 3)
    launch.servers.stop(server)


def _stubborn(tmp_path: Path) -> str:
    return _shell(tmp_path, f"trap '' TERM; {SERVE}").replace(
        "stop_timeout_s = 5", "stop_timeout_s = 1"
    )


@pytest.mark.parametrize("launch", [_stubborn], indirect=True)
def test_a_server_that_ignores_sigterm_is_killed_after_the_plans_stop_timeout(
    launch: Launch,
) -> None:
    one = launch.servers.start(launch.plan.configs[0])
    launch.servers.stop(one)
    assert one.process.returncode == -9 and launch.servers_lines()[0]["exit_code"] == -9
    two = launch.servers.start(launch.plan.configs[0], Slot(1, (Gpu(0, "GPU-a"),)))
    launch.servers.stop_all()  # interrupted: every server stopped the same way
    assert two.process.returncode == -9
    launch.servers.stop(two)


def _no_max_model_len(tmp_path: Path) -> str:
    served = served_dir(tmp_path / "served")
    (served / "v1" / "models").write_text(json.dumps({"data": [{"id": "tiny"}]}))
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    return http_server_engine(served)


@pytest.mark.parametrize("launch", [_no_max_model_len], indirect=True)
def test_a_server_that_does_not_say_its_context_gets_the_model_directorys(
    launch: Launch,
) -> None:
    server = launch.servers.start(launch.plan.configs[0])  # the plan's model is tmp_path
    assert server.facts["max_context"] == 2048
    launch.servers.stop(server)
