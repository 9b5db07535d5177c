"""Shared by the plan, engines and launch tests: an isolated quirks table (fixtures their
conftest.py files take in), plan writers, leak checks."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpudoctor.bench.launch.server import tagged_processes
from gpudoctor.bench.launch.steps import run_id

HERE = Path(__file__).parent
DATA = HERE / "data"
STREAM_SERVER = HERE / "stream_server.py"


@pytest.fixture(autouse=True)
def local_quirks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the local quirks table at a per-test file (never the user's)."""
    path = tmp_path / "local-quirks.toml"
    monkeypatch.setenv("GPUDOCTOR_BENCH_QUIRKS", str(path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the CLI's --help cache
    return path


@pytest.fixture(scope="session")
def help_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return an engine --help cache shared by the session (one `transformers serve --help`)."""
    return tmp_path_factory.mktemp("engine-help")


def stub_plan(
    model_dir: Path,
    configs: str = '[[configs]]\nname = "a"\n[[configs]]\nname = "b"\nargs = { token-delay-ms = 1 }\n',
    concurrency: str = "[1, 2, 3]",
    workload: str = "input_len = 32\noutput_len = 8\nnum_prompts = 4\nwarmup = 0",
    server_args: str = "",
    extra: str = "",
) -> str:
    """Return a plan whose engine is tests/bench/stream_server.py."""
    command = [
        sys.executable,
        str(STREAM_SERVER),
        "--model",
        "{model}",
        "--host",
        "{host}",
        "--port",
        "{port}",
    ]
    cmd = ", ".join(f'"{w}"' for w in command)
    return (
        textwrap.dedent(
            f"""\
        name = "stub"
        [model]
        path = "{model_dir}"
        [engine]
        name = "command"
        command = [{cmd}]
        version = "stub-1"
        startup_timeout_s = 30
        stop_timeout_s = 5
        """
        )
        + (f"args = {{ {server_args} }}\n" if server_args else "")
        + textwrap.dedent(
            f"""\
        [axes]
        concurrency = {concurrency}
        [preflight]
        enabled = false
        [workload]
        """
        )
        + workload
        + "\n"
        + configs
        + extra
    )


def write(tmp_path: Path, text: str, name: str = "plan.toml") -> Path:
    """Write a plan file and return its path."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def wait_no_leftovers(out: Path, timeout_s: float = 30.0) -> list:
    """Return the processes of run ``out`` still alive after up to ``timeout_s`` (guardian reaping)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = tagged_processes(run_id(out))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
