"""Host capabilities are declared on the Host base class with defaults (issue 20.4): every
Host answers ``has_python``, ``run_opens_session``, ``connect``, ``open_stream`` and
``prefetch``, and no caller probes a Host with getattr/hasattr any more."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpudoctor.fleet.nodehost import NodeHost
from gpudoctor.hosts.agent.client import AgentHost, local_agent_host
from gpudoctor.hosts.base import Host, HostError
from gpudoctor.hosts.local import LocalHost
from gpudoctor.hosts.ssh.host import SSHHost
from tests.fakes.recorded_host import RecordedHost

PACKAGE = Path(__file__).resolve().parents[2] / "gpudoctor"
CAPABILITIES = ("has_python", "run_opens_session", "connect", "open_stream", "prefetch")


def test_the_base_class_declares_every_capability() -> None:
    for name in CAPABILITIES:
        assert name in vars(Host), name
    host = RecordedHost({})
    assert host.has_python is True
    assert host.run_opens_session is False
    assert host.connect() is host
    assert host.prefetch([("stat", {"path": "/"})]) == 0
    with pytest.raises(HostError, match="cannot start a command stream on this kind of host"):
        host.open_stream(["true"])


def test_which_hosts_pay_a_session_per_command() -> None:
    assert SSHHost.run_opens_session is True
    assert LocalHost.run_opens_session is False
    assert AgentHost.run_opens_session is False


def test_a_local_host_opens_a_real_stream() -> None:
    stream = LocalHost().open_stream(["sh", "-c", "read line; echo got $line"])
    try:
        stream.write(b"one\n")
        assert stream.readline(100) == b"got one\n"
    finally:
        stream.close()


def test_a_node_wraps_only_a_host_whose_run_opens_a_session() -> None:
    class SessionHost(LocalHost):
        run_opens_session = True

    plain = NodeHost(LocalHost())
    assert plain._runner is plain.inner
    wrapped = NodeHost(SessionHost(name="node"))
    try:
        assert isinstance(wrapped._runner, AgentHost)
        parent = wrapped.run(["sh", "-c", "cat /proc/$PPID/cmdline"]).stdout
        assert "gpudoctor-agent" in parent  # the command ran under the node's one agent
    finally:
        wrapped.close()


def test_an_agent_without_pipelining_prefetches_nothing() -> None:
    host = local_agent_host()
    try:
        assert host.prefetch([("stat", {"path": "/"})]) == 0  # the python agent: one by one
        assert host.stat("/").kind == "dir"
    finally:
        host.close()


def test_no_caller_probes_a_host_capability_with_getattr() -> None:
    probe = re.compile(rf"\b(?:getattr|hasattr)\([^)]*[\"'](?:{'|'.join(CAPABILITIES)})[\"']")
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if probe.search(line)
    ]
    assert offenders == []
    assert probe.search('getattr(host, "open_stream", None)')  # the scan is not vacuous
