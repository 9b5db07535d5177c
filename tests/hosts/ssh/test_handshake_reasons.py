"""Why a handshake failed, in the words a user reads (``cannot connect: ...``): each
failure as paramiko reports it (the exception it raises, with the error it was raised
from, and whether the peer's banner arrived), and a ProxyCommand still running when the
peer turned out not to be an sshd. test_banner.py and test_connect.py meet the same
failures from real peers; this table holds every branch side by side."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import paramiko
import pytest

from gpudoctor.hosts.ssh.connect import _start_proxy, _stop, _why
from gpudoctor.hosts.ssh.target import SSHTarget

TARGET = SSHTarget(alias="box", hostname="127.0.0.1", port=2222, user="alice")
CLOSED = (
    "the peer closed the connection after T s without an SSH banner (port 2222 does not"
    " speak SSH, or sshd dropped this client: MaxStartups, TCP wrappers, fail2ban)"
)
NO_BANNER = "no SSH banner within T s (is an sshd listening on port 2222?)"


@pytest.fixture
def transport() -> Iterator[paramiko.Transport]:
    """A client transport on a socket pair, never started (as after a failed start)."""
    ours, theirs = socket.socketpair()
    try:
        yield paramiko.Transport(ours)
    finally:
        ours.close()
        theirs.close()


def raised_from(error: BaseException, cause: BaseException) -> BaseException:
    """Return ``error`` as paramiko raises it inside ``except`` of ``cause``."""
    try:
        try:
            raise cause
        except BaseException:
            raise error  # noqa: B904 - the implicit __context__ is what paramiko sets
    except BaseException as raised:
        return raised


def why(error: BaseException | None, transport: paramiko.Transport, banner: str = "") -> str:
    transport.remote_version = banner
    said = _why(error, transport, time.monotonic(), 1.0, TARGET, None)
    return re.sub(r"\d+\.\d s", "T s", said)


@pytest.mark.parametrize(
    ("error", "banner", "reason"),
    [
        (None, "", NO_BANNER),  # the timeout passed, nothing came
        (None, "SSH-2.0-OpenSSH_9.6", "the SSH key exchange did not finish within T s"),
        (
            raised_from(paramiko.SSHException("Error reading SSH protocol banner"), TimeoutError()),
            "",
            NO_BANNER,
        ),
        (paramiko.SSHException("Error reading SSH protocol bannertimed out"), "", NO_BANNER),
        (
            raised_from(paramiko.SSHException("Error reading SSH protocol banner"), EOFError()),
            "",
            CLOSED,
        ),
        (paramiko.SSHException("Error reading SSH protocol banner"), "", CLOSED),
        (
            paramiko.ssh_exception.IncompatiblePeer(
                "Incompatible ssh peer (no acceptable host key)"
            ),
            "SSH-2.0-x",
            "the server and gpudoctor share no SSH algorithm (Incompatible ssh peer (no"
            " acceptable host key))",
        ),
        (
            paramiko.SSHException('Indecipherable protocol version "HELO X"'),
            "",
            "port 2222 does not speak SSH: it sent 'HELO X' after T s",
        ),
        (
            paramiko.SSHException('Indecipherable protocol version "' + "y" * 70 + '"'),
            "",
            f"port 2222 does not speak SSH: it sent '{'y' * 60}' after T s",
        ),
        (
            EOFError(),
            "SSH-2.0-x",
            "the server closed the connection during the SSH handshake after T s",
        ),
        (
            raised_from(paramiko.SSHException("lost"), EOFError()),
            "SSH-2.0-x",
            "the server closed the connection during the SSH handshake after T s",
        ),
        (
            paramiko.SSHException("bad packet length"),
            "SSH-2.0-x",
            "SSH handshake failed after T s: bad packet length",
        ),
        (paramiko.SSHException(), "SSH-2.0-x", "SSH handshake failed after T s: SSHException"),
    ],
)
def test_each_handshake_failure_is_told_in_words(
    transport: paramiko.Transport, error: BaseException | None, banner: str, reason: str
) -> None:
    assert why(error, transport, banner) == reason


def test_a_proxy_command_still_running_leaves_the_reason_to_the_peer(
    transport: paramiko.Transport,
) -> None:
    """A ProxyCommand that reached a service which is no sshd and keeps running: the
    reason is what the peer sent, not the proxy (waited for half a second, not more)."""
    sock, proxy = _start_proxy("sleep 30")
    try:
        error = paramiko.SSHException('Indecipherable protocol version "220 smtp ready"')
        transport.remote_version = ""
        said = _why(error, transport, time.monotonic(), 1.0, TARGET, proxy)
        assert re.sub(r"\d+\.\d s", "T s", said) == (
            "port 2222 does not speak SSH: it sent '220 smtp ready' after T s"
        )
        assert proxy.poll() is None
    finally:
        sock.close()
        _stop(proxy)
