"""Fixtures for the weights tests: a Hub stand-in on loopback, real tmpfs mounts, the CLI.

huggingface_hub reads HF_* variables once, at import (recipe pitfall 1), so a test that
runs the CLI against the Hub runs it as a fresh process whose environment sets
HF_ENDPOINT, telemetry off, no token, and its own isolated HF_HOME (pitfall 2: a shared
cache could serve files without a request and make a test pass for the wrong reason).
The in-process tests of hub.py (test_hub_errors.py, test_hub_files.py) use the fixture
``hf`` instead: it points the module constants read at call time (endpoint, home, token
file) at the test's own Hub and folders (tests/weights/hf_inprocess.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import lab_unavailable
from tests.support.signals import default_signals
from tests.weights.hf_inprocess import PROXY_VARS, TOKEN_VARS
from tests.weights.hub_server import HubServer
from tests.weights.range_server import Server, start_servers, stop_servers

REPO_ROOT = Path(__file__).resolve().parents[2]
HF_VARS_TO_DROP = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HUB_OFFLINE",
    "HF_HUB_CACHE",
    "HF_ENDPOINT",
)


@dataclass(frozen=True)
class CliRun:
    """One finished ``gpudoctor weights`` process."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class WeightsCli:
    """Runs ``python -m gpudoctor.commands.weights`` against the hub, with an isolated HF_HOME."""

    def __init__(self, hub: HubServer, hf_home: Path) -> None:
        self.hub = hub
        self.hf_home = hf_home
        self.endpoint = hub.url

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in HF_VARS_TO_DROP}
        env.update(
            HF_ENDPOINT=self.endpoint,
            HF_HOME=str(self.hf_home),
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_UPDATE_CHECK="1",
            PYTHONPATH=str(REPO_ROOT),
        )
        env.update(extra or {})
        return env

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gpudoctor.commands.weights", *args]

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> CliRun:
        proc = subprocess.run(
            self.command(*args),
            capture_output=True,
            text=True,
            env=self.env(env),
            cwd=REPO_ROOT,
            timeout=timeout,
        )
        return CliRun(proc.returncode, proc.stdout, proc.stderr)

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(env),
            cwd=REPO_ROOT,
            start_new_session=True,
            preexec_fn=default_signals,  # the test may Ctrl-C it
        )


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Return the list of the paths this process fsyncs during the test, in order (what
    ``strace -e trace=fsync`` shows): ``os.fsync`` wrapped, each file still flushed."""
    flushed: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return flushed


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubServer]:
    """A started Hub stand-in (function scope: its own repos and request log)."""
    server = HubServer(tmp_path / "hub-storage")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No token anywhere: every place looked at unset, HOME an empty folder; return HOME."""
    for name in TOKEN_VARS:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def hf(hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_token: Path):
    """huggingface_hub pointed at ``hub``, with its own home, no token and no proxy."""
    from huggingface_hub import constants

    home = tmp_path / "hf-home"
    for name in HF_VARS_TO_DROP + PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    return hub


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    """Two started range servers on loopback: the Hub's ``/resolve/`` and its CDN."""
    made = start_servers(2)
    try:
        yield made
    finally:
        stop_servers(made)


@pytest.fixture
def cli(hub: HubServer, tmp_path: Path) -> WeightsCli:
    """The CLI runner bound to ``hub`` with its own HF_HOME."""
    home = tmp_path / "hf-home"
    home.mkdir()
    return WeightsCli(hub, home)


class TmpfsMounts:
    """Real tmpfs mounts (``mount -t tmpfs -o size=N tmpfs DIR``), unmounted at teardown."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounted: list[Path] = []

    def __call__(self, size: str, name: str = "shm", mode: str = "0755") -> Path:
        point = self.root / name
        point.mkdir(parents=True)
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode={mode}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            lab_unavailable(f"cannot mount tmpfs (needs root): {proc.stderr.strip()}")
        self.mounted.append(point)
        return point

    def cleanup(self) -> None:
        for point in reversed(self.mounted):
            subprocess.run(["umount", "-l", str(point)], capture_output=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[TmpfsMounts]:
    """Factory for real tmpfs mounts of a given size; all unmounted after the test."""
    mounts = TmpfsMounts(tmp_path / "mnt")
    try:
        yield mounts
    finally:
        mounts.cleanup()


def make_model_files(
    seed: int = 1, shard_sizes: tuple[int, ...] = (1_500_000, 1_200_000, 900_000)
) -> dict[str, bytes]:
    """Return a small fake checkpoint: safetensors shards (LFS) plus small config files."""
    import random

    rng = random.Random(seed)
    n = len(shard_sizes)
    files: dict[str, bytes] = {
        f"model-{i + 1:05d}-of-{n:05d}.safetensors": rng.randbytes(size)
        for i, size in enumerate(shard_sizes)
    }
    files["config.json"] = b'{"architectures": ["LlamaForCausalLM"], "seed": %d}\n' % seed
    files["tokenizer/tokenizer_config.json"] = b'{"model_max_length": 4096}\n'
    files["model.safetensors.index.json"] = b'{"weight_map": {}}\n'
    return files


def dir_files(root: Path) -> dict[str, bytes]:
    """Return {relative path: bytes} of the regular files under ``root``."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def model_part(files: dict[str, bytes]) -> dict[str, bytes]:
    """The files of a finished model dir, without gpudoctor's manifest."""
    return {k: v for k, v in files.items() if k != ".gpudoctor-manifest.json"}
