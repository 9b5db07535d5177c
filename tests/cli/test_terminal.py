"""With ``TERM=dumb`` or ``NO_COLOR``, not one escape sequence reaches the terminal.

Each command runs as a real subprocess whose stdin, stdout and stderr are a real
pseudo-terminal (python's ``pty``), so every "is it a tty?" branch takes its terminal
side; all bytes it writes are collected and searched for ESC (0x1b).
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys

import pytest

from tests.cli.support import REPO

ESC = b"\x1b"


def run_in_pty(args: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, bytes]:
    """Run ``python -m gpudoctor ARGS`` on a new pty; return (exit code, every byte written)."""
    leader, follower = pty.openpty()
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpudoctor", *args],
        stdin=follower, stdout=follower, stderr=follower, cwd=REPO,
        env={**base, "COLUMNS": "200", **env}, start_new_session=True,
    )  # fmt: skip
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([leader], [], [], timeout)
        if not ready:
            proc.kill()
            raise AssertionError(f"no output for {timeout} s: {b''.join(chunks)[-500:]!r}")
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the pty
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=timeout), b"".join(chunks)


COMMANDS = [
    ["check"],  # FAILs on this driverless machine: the coloured human report + progress
    ["check", "--only", "proc.usable", "-v"],
    ["check", "--timeout", "-1"],  # a usage error
    ["--help"],
    ["list"],
]


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> str:
    """An inventory of two nodes at a loopback port where nothing listens (the fleet's
    per-target progress line is what wrote ``\\r\\033[K``)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path_factory.mktemp("fleet") / "hosts.toml"
    nodes = "".join(
        f'[[nodes]]\nname = "n{i}"\nssh = "root@127.0.0.1:{port}"\ncts = [200]\n' for i in (1, 2)
    )
    path.write_text(nodes)
    return str(path)


@pytest.mark.parametrize("env", [{"NO_COLOR": "1", "TERM": "xterm-256color"}, {"TERM": "dumb"}])
@pytest.mark.parametrize("args", [*COMMANDS, ["check", "--inventory"]], ids=" ".join)
def test_no_escape_sequence_when_asked(args, env, inventory, tmp_path):
    if args[-1] == "--inventory":
        args = [*args, inventory]
        env = {**env, "HOME": str(tmp_path)}
    code, output = run_in_pty(args, env)
    assert output, "nothing was written"
    assert ESC not in output, output[max(0, output.find(ESC) - 80) : output.find(ESC) + 40]
    assert code in (0, 2, 3)


def test_a_real_terminal_does_get_them(inventory, tmp_path):
    """The control: the same runs on a colour terminal do write escape sequences (the
    progress lines and colours), so the test above can fail."""
    code, output = run_in_pty(["check"], {"TERM": "xterm-256color"})
    assert code == 3 and ESC in output
    env = {"TERM": "xterm-256color", "HOME": str(tmp_path)}
    code, output = run_in_pty(["check", "--inventory", inventory], env)
    assert code == 3 and b"\r\x1b[K" in output


def test_weights_progress_bars_obey_no_color(tmp_path):
    """`weights ensure` draws rich progress bars on a terminal: with NO_COLOR they become
    plain lines (no ESC), while the control run on xterm does draw them."""
    from tests.weights.conftest import WeightsCli, make_model_files
    from tests.weights.hub_server import HubServer

    server = HubServer(tmp_path / "hub")
    server.start()
    try:
        server.add_repo("acme/tiny").commit(make_model_files())
        home = tmp_path / "hf-home"
        home.mkdir()
        weights = WeightsCli(server, home)
        plain = weights.env({"NO_COLOR": "1", "TERM": "xterm-256color"})
        code, output = run_in_pty(
            ["weights", "ensure", "acme/tiny", "--to", str(tmp_path / "a")], plain
        )
        assert code == 0 and b"download" in output, output[-500:]
        assert ESC not in output
        colour = weights.env({"TERM": "xterm-256color"})
        colour.pop("NO_COLOR", None)
        code, output = run_in_pty(
            ["weights", "ensure", "acme/tiny", "--to", str(tmp_path / "b")], colour
        )
        assert code == 0 and ESC in output
    finally:
        server.stop()
