"""SSHHost's deadlines against a real SSH server in this process
(tests/hosts/ssh/inproc_sshd.py): a command that ignores TERM is killed and said to be
late, the default deadline is the one sent, a file operation past its call timeout stops
the agent and names the host, a server that stops answering channel requests is given
up, and a client interrupted mid-command exits at once (no thread of run() holds it)."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

import gpudoctor
from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh import host as ssh_host
from gpudoctor.hosts.ssh.host import SSHHost
from tests.hosts.ssh.inproc_sshd import Policy, Server, running
from tests.hosts.ssh.test_authenticate import make_key
from tests.support.signals import default_signals

HOSTILE = Path(__file__).parents[2] / "fakes" / "hostile_agent.py"
INTERRUPTED = Path(__file__).with_name("interrupted_client.py")


@pytest.fixture
def key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> paramiko.PKey:
    """The client key at tmp_path/id; HOME in tmp_path (no key or agent of the user)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return make_key(tmp_path / "id")


def host_for(server: Server, tmp_path: Path, **opts: Any) -> SSHHost:
    """Return an SSHHost for ``server`` with the key at tmp_path/id, trusting only it."""
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts_line())
    settings: dict[str, Any] = {"key_filename": str(tmp_path / "id"), "known_hosts": str(known),
                                "ssh_config": None, "system_known_hosts": False,
                                "connect_timeout": 20}  # fmt: skip
    return SSHHost(f"alice@127.0.0.1:{server.port}", **{**settings, **opts})


@pytest.fixture
def server(key: paramiko.PKey) -> Iterator[Server]:
    with running(Policy(keys={key.asbytes()})) as started:
        yield started


def test_a_command_that_ignores_term_is_killed_and_said_to_be_late(
    server: Server, tmp_path: Path
) -> None:
    """TERM at the deadline is ignored; KILL 2 s later. The status is 137 and the result
    says timed out (without ``; exit $?`` the killed ``timeout`` would be reported as a
    signal paramiko drops: returncode -1, not timed out; measured on OpenSSH's sshd)."""
    host = host_for(server, tmp_path)
    try:
        late = host.run(["sh", "-c", "trap '' TERM; sleep 30"], timeout=0.5)
        assert (late.returncode, late.timed_out, late.duration_s >= 0.475) == (137, True, True)
        assert host.run(["sh", "-c", "exit 137"]).timed_out is False  # 137, but not late
    finally:
        host.close()


class SteppedClock:
    """Stands in for ``time.monotonic`` in gpudoctor/hosts/ssh/host.py only (paramiko keeps
    the real one): each reading is the next of ``readings`` (seconds), so the time run()
    measures between its two readings is exact, as no real clock gives it."""

    def __init__(self, *readings: float) -> None:
        self._readings = iter(readings)

    def monotonic(self) -> float:
        return next(self._readings)


@pytest.mark.parametrize(("elapsed_end", "late"), [(119.0, True), (118.99, False)])
def test_status_124_is_late_from_95_percent_of_the_deadline(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, elapsed_end: float,
    late: bool,
) -> None:  # fmt: skip
    """A 124 that comes 19.0 s into a 20 s deadline (95 %: ``timeout``'s own clock and the
    SSH round trips differ a little from ours) is the deadline; one at 18.99 s is the
    command's own exit status."""
    host = host_for(server, tmp_path)
    monkeypatch.setattr(ssh_host, "time", SteppedClock(100.0, elapsed_end))
    try:
        done = host.run(["sh", "-c", "exit 124"], timeout=20)
    finally:
        host.close()
    assert (done.returncode, done.timed_out, done.duration_s) == (124, late, elapsed_end - 100.0)


def test_a_command_without_a_deadline_runs_under_30_s(server: Server, tmp_path: Path) -> None:
    host = host_for(server, tmp_path)
    try:
        assert host.run(["true"]).returncode == 0
    finally:
        host.close()
    assert server.commands == ["timeout -k 2 30 true; exit $?"]


def test_a_file_operation_past_the_call_timeout_stops_the_agent_and_names_the_host(
    server: Server, tmp_path: Path
) -> None:
    """The remote "python" is an agent that says hello and never answers
    (tests/fakes/hostile_agent.py ``silent``)."""
    silent = tmp_path / "silent-python"
    silent.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {HOSTILE} silent\n")
    silent.chmod(0o755)
    host = host_for(server, tmp_path, call_timeout=0.5)
    host.python = str(silent)
    try:
        with pytest.raises(HostError) as stopped:
            host.files.stat("/dev/null")
    finally:
        host.close()
    assert re.fullmatch(
        rf"{re.escape(host.name)}: stat got no answer within 0\.5 s; the agent was stopped.*",
        str(stopped.value),
    )
    assert server.commands[0].startswith(f"{silent} -I -c ")


def test_a_server_that_stops_answering_channel_requests_is_given_up(
    key: paramiko.PKey, tmp_path: Path
) -> None:
    """Logged in, then the server never answers the session request: the channel is given
    up at the connect timeout (each SSH step's), one line, not waited for an hour."""
    hold = threading.Event()
    with running(Policy(keys={key.asbytes()}, hold_sessions=hold)) as server:
        host = host_for(server, tmp_path)
        try:
            host.connect()  # under 20 s per step; then 0.5 s for the channel
            host.settings = dataclasses.replace(host.settings, connect_timeout=0.5)
            with pytest.raises(HostError) as given_up:
                host.run(["true"])
        finally:
            hold.set()
            host.close()
    assert str(given_up.value) == (
        f"{host.name}: cannot open an SSH channel: Timeout opening channel."
    )


@pytest.mark.signals
def test_a_client_interrupted_mid_command_exits_at_once(server: Server, tmp_path: Path) -> None:
    """Ctrl-C while ``sleep 600`` runs remotely and the host is never closed: the process
    still ends (run()'s threads are daemons; a thread left waiting for the remote
    command would hold the interpreter for 600 s)."""
    host = host_for(server, tmp_path)  # writes tmp_path/known_hosts
    try:  # the same client in this process: the server answers (and mutmut, which picks
        # the tests to run per mutant by what they call in-process, picks this one)
        assert host.run(["true"]).returncode == 0
    finally:
        host.close()
    known = tmp_path / "known_hosts"
    mark = tmp_path / "running"
    env = {**os.environ, "PYTHONPATH": str(Path(gpudoctor.__file__).resolve().parents[1])}
    client = subprocess.Popen(
        [sys.executable, str(INTERRUPTED), f"alice@127.0.0.1:{server.port}",
         str(tmp_path / "id"), str(known), str(mark)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, preexec_fn=default_signals,
    )  # fmt: skip
    try:
        out, err = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
    assert (client.returncode, out, err) == (0, b"interrupted\n", b"")
    assert mark.exists()  # the remote command did run


def test_a_process_left_holding_stdout_is_not_waited_for_past_the_grace(
    key: paramiko.PKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sleep 600 & echo hi``: the status comes when sh exits (as OpenSSH's sshd sends it),
    the sleep keeps stdout open. run() waits RUN_GRACE (0.5 s here) for stdout's end, then
    returns what came: rc 0, "hi", not timed out, not after 600 s."""
    monkeypatch.setattr(ssh_host, "RUN_GRACE", 0.5)
    with running(Policy(keys={key.asbytes()}, status_at_exit=True)) as server:
        host = host_for(server, tmp_path)
        try:
            done = host.run(["sh", "-c", "sleep 600 & echo hi"], timeout=60)
        finally:
            host.close()
    assert (done.returncode, done.stdout, done.timed_out) == (0, "hi\n", False)
