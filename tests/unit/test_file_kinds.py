"""Issue 21.4: odd files where a device node should be are named by their type (a FIFO, a
socket, a directory, a regular file), never "a other"; real files of each type on this
machine, seen through the LocalHost and the shell agent's parsers."""

from __future__ import annotations

import os
import socket

import pytest

from gpudoctor.context import CheckOptions, DeviceRequest
from gpudoctor.facts.nodes import a_kind
from gpudoctor.hosts.agent.shell_replies import stat_result
from gpudoctor.hosts.local import LocalHost
from gpudoctor.model import Status
from gpudoctor.runner import run_checks


def make(kind: str, path: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)
        sock.close()
    elif kind == "dir":
        os.mkdir(path)
    else:
        with open(path, "w") as fh:
            fh.write("not a node\n")


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("fifo", "a FIFO"),
        ("socket", "a socket"),
        ("dir", "a directory"),
        ("file", "a regular file"),
    ],
)
def test_device_nodes_names_the_file_type_at_a_device_path(tmp_path, kind, words) -> None:
    path = str(tmp_path / "kvm")
    make(kind, path)
    assert LocalHost().stat(path).kind == kind
    options = CheckOptions(devices=(DeviceRequest(path),), only=("device.nodes",))
    report = run_checks(LocalHost(), options)
    finding = next(f for f in report.findings if f.subject == path)
    assert finding.status is Status.FAIL
    assert finding.message == f"{path} is {words}, not a device node."
    assert finding.evidence[0].startswith(f"stat {path}: {words}, mode ")
    assert "other" not in finding.message


def test_a_fifo_where_an_nvidia_node_should_be_is_not_called_a_placeholder(tmp_path) -> None:
    """In an NVIDIA family (/dev/nvidia-uvm as a FIFO) the message names the FIFO and does
    not blame a bind mount's create= (that makes regular files and directories only)."""
    from tests.unit.scenarios import h200_host

    host = h200_host()
    st = host.nodes["/dev/nvidia-uvm"]
    host.nodes["/dev/nvidia-uvm"] = type(st)("/dev/nvidia-uvm", "fifo", 0o644)
    report = run_checks(host, CheckOptions(only=("device.nodes",)))
    fail = next(f for f in report.findings if f.subject == "/dev/nvidia-uvm")
    assert fail.status is Status.FAIL
    assert fail.message.startswith("/dev/nvidia-uvm is a FIFO, not a char device")
    assert "create=" not in fail.message and "rm /dev/nvidia-uvm" in fail.remediation


def test_the_shell_agent_answers_name_fifos_and_sockets(tmp_path) -> None:
    """The sh agent's two stat forms: ``stat -c %f`` (raw mode, hex) and ``ls -lnLd``."""
    fifo = str(tmp_path / "p")
    os.mkfifo(fifo)
    raw = f"{os.stat(fifo).st_mode:x}"
    assert stat_result(fifo, ["s", raw, "0", "0", "0", "0", "0", "0"])["kind"] == "fifo"
    ls_fifo = ["l", "prw-r--r--", "1", "0", "0", "0", "Jan", "1", "00:00", fifo]
    ls_sock = ["l", "srwxr-xr-x", "1", "0", "0", "0", "Jan", "1", "00:00", fifo]
    assert stat_result(fifo, ls_fifo)["kind"] == "fifo"
    assert stat_result(fifo, ls_sock)["kind"] == "socket"
    assert a_kind("weird") == "a file of unknown type (weird)"
