"""``[engine] server_url``: a plan pointed at a server already running (issue 34 item 8).
The launcher starts no server, checks that it answers, measures every cell against it,
leaves it running, and records that it did not launch it; a URL where nothing answers is
one line naming it; a plan that also says how to start a server is refused.

Real ``gpudoctor bench`` processes; the running server is tests/bench/stream_server.py,
started by the test on a loopback port (it stands for an inference server the user runs)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import STREAM_SERVER, write
from tests.support.signals import default_signals


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args],
                          capture_output=True, text=True, timeout=180, env=env)  # fmt: skip


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _plan(model: Path, url: str, engine_extra: str = "", configs: str = "") -> str:
    return (
        f'name = "ext"\n[model]\npath = "{model}"\n[engine]\nname = "command"\n'
        f'server_url = "{url}"\nversion = "stub-1"\n{engine_extra}'
        "[axes]\nconcurrency = [1, 2]\n[preflight]\nenabled = false\n"
        "[workload]\ninput_len = 32\noutput_len = 8\nnum_prompts = 4\nwarmup = 0\n" + configs
    )


@pytest.fixture
def running_server(tiny_model_dir: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """A stream server the user started, answering /health before the test goes on."""
    port = _port()
    log = tmp_path / "requests.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(STREAM_SERVER), "--model", str(tiny_model_dir), "--port", str(port),
         "--request-log", str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=default_signals,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            assert proc.poll() is None, "the stream server exited"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)  # the server binds within a second; polled, not assumed
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_cells_are_measured_against_the_running_server_which_is_left_running(
    tmp_path: Path, tiny_model_dir: Path, running_server: tuple[str, subprocess.Popen]
) -> None:
    url, proc = running_server
    plan = write(tmp_path, _plan(tiny_model_dir, url))
    out = tmp_path / "run"

    done = _bench(str(plan), "--out", str(out))

    assert done.returncode == 0, done.stdout + done.stderr
    assert f"measuring the running server at {url} (not started)" in done.stderr
    records = read_records(out / "results.jsonl")[0]
    assert [r["status"] for r in records] == ["ok", "ok"], records
    assert all(r["server"]["launched"] is False and r["server"]["url"] == url for r in records)
    assert all(r["measurement"]["completed"] == 4 for r in records)
    servers = read_records(out / "servers.jsonl")[0]
    assert len(servers) == 1 and servers[0]["launched"] is False and servers[0]["exit_code"] is None
    assert proc.poll() is None  # still running: not ours to stop
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 8  # every request of both cells went to it
    assert "0 server start(s)" in done.stdout + done.stderr


def test_a_url_where_nothing_answers_is_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    url = f"http://127.0.0.1:{_port()}"
    plan = write(tmp_path, _plan(tiny_model_dir, url, "startup_timeout_s = 1\n"))
    out = tmp_path / "run"

    proc = _bench(str(plan), "--out", str(out))

    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("gpudoctor: error: ") and f"engine.server_url {url} does not answer" in last
    )
    assert "start the server first" in last
    assert read_records(out / "results.jsonl")[0] == []  # nothing recorded: a resume runs all


@pytest.mark.parametrize(
    ("engine_extra", "configs", "needle"),
    [
        ('port_range = "30000-30100"\n', "", "engine.port_range: says how to start a server"),
        ("args = { x = 1 }\n", "", "engine.args: says how to start a server"),
        (
            "",
            '[[configs]]\nname = "a"\n[[configs]]\nname = "b"\ntp = [2]\n',
            "configs: with engine.server_url",
        ),
        ("", '[[configs]]\nname = "a"\nargs = { x = 1 }\n', "configs: with engine.server_url"),
    ],
)
def test_a_plan_that_also_starts_a_server_is_refused(
    tmp_path: Path, tiny_model_dir: Path, engine_extra: str, configs: str, needle: str
) -> None:
    plan = write(tmp_path, _plan(tiny_model_dir, "http://127.0.0.1:1", engine_extra, configs))
    proc = _bench(str(plan), "--dry-run", "--no-validate", "--out", str(tmp_path / "o"))
    assert proc.returncode == 1 and needle in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_dry_run_says_no_server_is_started(tmp_path: Path, tiny_model_dir: Path) -> None:
    plan = write(tmp_path, _plan(tiny_model_dir, "http://127.0.0.1:1"))
    proc = _bench(str(plan), "--dry-run", "--json", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert any("no server is started" in n for n in result["notes"])
    assert result["configs"][0]["command"] == [] and len(result["cells"]) == 2
    human = _bench(str(plan), "--dry-run", "--out", str(tmp_path / "o"))
    assert human.returncode == 0 and "no server is started" in human.stdout, human.stderr
    assert "  $ " not in human.stdout  # no command line for a server gpudoctor does not start
