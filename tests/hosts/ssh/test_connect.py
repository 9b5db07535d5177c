"""Opening an authenticated SSH connection (:func:`connect`) against real SSH servers in
this process (tests/hosts/ssh/inproc_sshd.py: paramiko's server side on 127.0.0.1):
directly, through a ``ProxyCommand`` (bash's /dev/tcp), through one or two ``ProxyJump``
hops (``direct-tcpip`` channels, each hop's key verified); the host key checked before
any credential is sent; every failure one line, and nothing left open after it."""

from __future__ import annotations

import gc
import socket
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.auth import Credentials
from gpudoctor.hosts.ssh.connect import (
    ConnectSettings,
    _start_proxy,
    _stop,
    connect,
    failure_reason,
)
from gpudoctor.hosts.ssh.target import SSHTarget
from tests.hosts.ssh.inproc_sshd import Policy, Server, running
from tests.hosts.ssh.test_authenticate import make_key, unix_sockets_open
from tests.hosts.ssh.test_banner import elapsed_in, serve

NO_CREDENTIALS = Credentials()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$HOME in tmp_path with ``~/.ssh/id_ecdsa``: the identity a jump hop (resolved with
    OpenSSH's defaults) is logged in with."""
    (tmp_path / ".ssh").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return tmp_path


@pytest.fixture
def user_key(home: Path) -> paramiko.PKey:
    return make_key(home / ".ssh" / "id_ecdsa")


@pytest.fixture
def server(user_key: paramiko.PKey) -> Iterator[Server]:
    with running(Policy(keys={user_key.asbytes()})) as started:
        yield started


def target_for(server: Server | int, home: Path, **more: object) -> SSHTarget:
    port = server if isinstance(server, int) else server.port
    return SSHTarget(
        alias="box",
        hostname="127.0.0.1",
        port=port,
        user="alice",
        identity_files=(str(home / ".ssh" / "id_ecdsa"),),
        identity_agent="none",
        **more,  # type: ignore[arg-type]
    )


def settings_for(known: Path, **more: object) -> ConnectSettings:
    return ConnectSettings(
        known_hosts=str(known),
        ssh_config=None,
        use_config_known_hosts=False,
        **more,  # type: ignore[arg-type]
    )


def known(home: Path, *servers: Server) -> Path:
    path = home / "known_hosts"
    path.write_text("".join(s.known_hosts_line() for s in servers))
    return path


def test_a_known_host_is_connected_and_logged_in(server: Server, home: Path) -> None:
    conn = connect(target_for(server, home), settings_for(known(home, server)), NO_CREDENTIALS)
    try:
        assert conn.transport.is_authenticated()
        assert conn.trusted == "known host key"
        assert (conn.hops, conn.proxy) == ([], None)
        sock = conn.transport.sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0  # no Nagle delay
        assert conn.transport.remote_version.startswith("SSH-2.0-paramiko")
    finally:
        conn.close()
    assert server.wait_closed()
    assert server.attempts[0].user == "alice"


@pytest.mark.parametrize(
    ("given", "configured", "used"), [(3.0, 7.0, 3.0), (None, 7.0, 7.0), (None, None, 10.0)]
)
def test_each_step_waits_the_given_timeout_else_the_configs_else_10_s(
    server: Server, home: Path, given: float | None, configured: float | None, used: float
) -> None:
    """``--connect-timeout`` wins over ``ConnectTimeout``, which wins over 10 s: the
    banner, the key exchange and the login each get it."""
    target = target_for(server, home, connect_timeout=configured)
    conn = connect(target, settings_for(known(home, server), connect_timeout=given), NO_CREDENTIALS)
    try:
        transport = conn.transport
        timeouts = (transport.banner_timeout, transport.handshake_timeout, transport.auth_timeout)
        assert timeouts == (used, used, used)
    finally:
        conn.close()


def test_an_unknown_host_key_is_refused_before_any_credential_is_sent(
    server: Server, home: Path
) -> None:
    with pytest.raises(HostError) as exc:
        connect(target_for(server, home), settings_for(home / "known_hosts"), NO_CREDENTIALS)
    assert f"box (alice@127.0.0.1:{server.port}): unknown SSH host key ecdsa-sha2-nistp256" in (
        str(exc.value)
    )
    assert server.wait_closed()  # the client hung up
    assert server.attempts == []


def test_a_new_host_key_is_saved_when_the_user_accepts_new_keys(server: Server, home: Path) -> None:
    kh = home / "known_hosts"
    conn = connect(
        target_for(server, home), settings_for(kh, accept_new_host_key=True), NO_CREDENTIALS
    )
    conn.close()
    assert conn.trusted.startswith(f"new host key saved to {kh}")
    assert kh.read_text() == server.known_hosts_line()


def test_the_host_key_known_hosts_holds_is_the_one_asked_for(
    home: Path, user_key: paramiko.PKey
) -> None:
    """A host with an ECDSA and an RSA key, known_hosts holding the RSA one: the RSA key
    is asked for first (as ssh orders it), so the host is known, not "changed"."""
    rsa = paramiko.RSAKey.generate(1024)  # small: made fast; its size is not the point
    policy = Policy(keys={user_key.asbytes()})
    with running(policy, host_keys=[paramiko.ECDSAKey.generate(), rsa]) as server:
        kh = home / "known_hosts"
        kh.write_text(server.known_hosts_line(rsa))
        conn = connect(target_for(server, home), settings_for(kh), NO_CREDENTIALS)
        try:
            assert conn.transport.get_remote_server_key().asbytes() == rsa.asbytes()
            assert conn.trusted == "known host key"
        finally:
            conn.close()


def test_a_refused_login_closes_the_connection(server: Server, home: Path) -> None:
    server.policy.keys = set()
    with pytest.raises(HostError, match=r"^box \(alice@127.0.0.1:\d+\): SSH authentication failed"):
        connect(target_for(server, home), settings_for(known(home, server)), NO_CREDENTIALS)
    assert server.wait_closed()


BASH_TCP = "bash -c 'exec 3<>/dev/tcp/%h/%p; cat <&3 & exec cat >&3'"


def test_a_proxy_command_carries_the_connection_and_is_stopped_at_close(
    server: Server, home: Path
) -> None:
    command = BASH_TCP.replace("%h", "127.0.0.1").replace("%p", str(server.port))
    target = target_for(server, home, proxy_command=command)
    conn = connect(target, settings_for(known(home, server)), NO_CREDENTIALS)
    proxy = conn.proxy
    assert proxy is not None and proxy.poll() is None
    assert conn.transport.is_authenticated()
    conn.close()
    assert proxy.poll() is not None  # the process group was stopped and reaped
    assert proxy.stderr_file.closed  # type: ignore[attr-defined]


@pytest.fixture
def hop(user_key: paramiko.PKey) -> Iterator[Server]:
    with running(Policy(keys={user_key.asbytes()})) as started:
        yield started


def test_a_jump_host_carries_the_connection_and_each_key_is_verified(
    server: Server, hop: Server, home: Path
) -> None:
    target = target_for(server, home, proxy_jump=(f"root@127.0.0.1:{hop.port}",))
    conn = connect(target, settings_for(known(home, server, hop)), NO_CREDENTIALS)
    try:
        assert conn.transport.is_authenticated()
        assert [h.target.port for h in conn.hops] == [hop.port]
        assert hop.forwards == [("127.0.0.1", server.port)]
        assert [a.user for a in hop.attempts] == ["root"]
    finally:
        conn.close()
    assert hop.wait_closed() and server.wait_closed()


def test_a_jump_host_is_resolved_with_the_config_the_user_gave(
    server: Server, hop: Server, home: Path
) -> None:
    """``ssh -F FILE -J jumpbox``: the hop's alias comes from FILE, not ~/.ssh/config."""
    config = home / "given_config"
    config.write_text(f"Host jumpbox\n  HostName 127.0.0.1\n  Port {hop.port}\n  User root\n")
    settings = ConnectSettings(known_hosts=str(known(home, server, hop)), ssh_config=str(config),
                               use_config_known_hosts=False)  # fmt: skip
    conn = connect(target_for(server, home, proxy_jump=("jumpbox",)), settings, NO_CREDENTIALS)
    try:
        assert [(h.target.alias, h.target.port) for h in conn.hops] == [("jumpbox", hop.port)]
        assert [a.user for a in hop.attempts] == ["root"]
    finally:
        conn.close()
    assert hop.wait_closed() and server.wait_closed()


def test_two_jump_hosts_are_crossed_in_order(
    server: Server, hop: Server, home: Path, user_key: paramiko.PKey
) -> None:
    with running(Policy(keys={user_key.asbytes()})) as second:
        chain = (f"root@127.0.0.1:{hop.port}", f"root@127.0.0.1:{second.port}")
        target = target_for(server, home, proxy_jump=chain)
        conn = connect(target, settings_for(known(home, server, hop, second)), NO_CREDENTIALS)
        try:
            assert [h.target.port for h in conn.hops] == [hop.port, second.port]
            assert hop.forwards == [("127.0.0.1", second.port)]
            assert second.forwards == [("127.0.0.1", server.port)]
            assert conn.hops[1].hops == []
        finally:
            conn.close()
        assert second.wait_closed() and hop.wait_closed()


def test_a_jump_host_that_cannot_reach_the_target_says_so(hop: Server, home: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    target = target_for(port, home, proxy_jump=(f"root@127.0.0.1:{hop.port}",))
    with pytest.raises(HostError) as exc:
        connect(target, settings_for(known(home, hop)), NO_CREDENTIALS)
    assert str(exc.value) == (
        f"box (alice@127.0.0.1:{port}): the jump host 127.0.0.1 cannot reach "
        f"127.0.0.1:{port}: Connect failed"
    )
    assert hop.wait_closed()


def test_a_jump_host_that_never_answers_is_given_up_at_the_timeout(
    user_key: paramiko.PKey, home: Path
) -> None:
    """The hop logs in but never answers the request to reach the target (a hung sshd):
    the connection fails at the connect timeout, in one line."""
    with running(Policy(keys={user_key.asbytes()}, hold_forwards=threading.Event())) as hung:
        target = target_for(2222, home, proxy_jump=(f"root@127.0.0.1:{hung.port}",))
        with pytest.raises(HostError) as exc:
            connect(target, settings_for(known(home, hung), connect_timeout=0.5), NO_CREDENTIALS)
        assert str(exc.value) == (
            "box (alice@127.0.0.1:2222): the jump host 127.0.0.1 cannot reach 127.0.0.1:2222:"
            " Timeout opening channel."
        )
        assert hung.forwards == [("127.0.0.1", 2222)]


def test_a_jump_host_that_fails_is_named(server: Server, hop: Server, home: Path) -> None:
    spec = f"root@127.0.0.1:{hop.port}"
    target = target_for(server, home, proxy_jump=(spec,))
    with pytest.raises(HostError) as exc:
        connect(target, settings_for(known(home, server)), NO_CREDENTIALS)  # hop unknown
    assert str(exc.value).startswith(
        f"jump host {spec}: root@127.0.0.1:{hop.port}: unknown SSH host key"
    )


def reply(data: bytes) -> Callable[[socket.socket], None]:
    """A peer that sends ``data`` and closes."""

    def handler(conn: socket.socket) -> None:
        conn.sendall(data)
        conn.close()

    return handler


@pytest.mark.parametrize(
    ("sent", "reason", "tail"),
    [
        (b"hello\r\n" * 100, "port {port} does not speak SSH: it sent 'hello' after ", " s"),
        (b"SSH-garbage\r\n", "SSH handshake failed after ", " s: Invalid SSH banner"),
        (
            b"SSH-1.5-old\r\n",
            "the server and gpudoctor share no SSH algorithm (Incompatible version (1.5 ",
            "instead of 2.0))",
        ),
    ],
    ids=["other-protocol", "bad-banner", "ssh-1"],
)
def test_a_peer_that_is_no_ssh_server_is_one_line(
    home: Path, sent: bytes, reason: str, tail: str
) -> None:
    for port in serve(reply(sent)):
        with pytest.raises(HostError) as exc:
            connect(target_for(port, home), settings_for(home / "kh"), NO_CREDENTIALS)
        message = str(exc.value)
        assert message.startswith(
            f"box (alice@127.0.0.1:{port}): cannot connect: " + reason.format(port=port)
        )
        assert message.endswith(tail) and "\n" not in message


def test_a_proxy_command_that_ignores_term_is_killed_at_close(server: Server, home: Path) -> None:
    """A ProxyCommand that outlives its connection and is deaf to SIGTERM (``trap ''
    TERM``, inherited by what it runs) is killed with SIGKILL after 2 s, and reaped."""
    bridge = BASH_TCP.replace("%h", "127.0.0.1").replace("%p", str(server.port))
    command = f"sh -c \"trap '' TERM; {bridge}; exec sleep 60\""
    conn = connect(
        target_for(server, home, proxy_command=command),
        settings_for(known(home, server)),
        NO_CREDENTIALS,
    )
    proxy = conn.proxy
    assert proxy is not None
    conn.close()
    assert proxy.returncode == -9  # SIGKILL, after TERM was ignored
    assert proxy.stderr_file.closed  # type: ignore[attr-defined]


def test_a_peer_that_stalls_mid_handshake_is_hung_up_on(home: Path) -> None:
    """A peer that sends its banner and then nothing (a hung sshd): the handshake fails
    at the timeout and the client closes its side (the peer sees the end)."""
    hung_up = threading.Event()

    def stall(conn: socket.socket) -> None:
        conn.sendall(b"SSH-2.0-stalled\r\n")
        while conn.recv(65536):
            pass  # the client's banner and KEXINIT, then the end
        hung_up.set()

    for port in serve(stall):
        with pytest.raises(HostError, match=r"cannot connect: "):
            connect(
                target_for(port, home),
                settings_for(home / "kh", connect_timeout=0.5),
                NO_CREDENTIALS,
            )
        assert hung_up.wait(60)


def test_a_proxy_commands_end_of_the_socket_pair_is_closed_at_once() -> None:
    """Only the proxy holds its end of the socket pair: gpudoctor closes its copy at once
    (not left to the garbage collector, which warns of an unclosed socket), so that it
    reads EOF as soon as the proxy exits."""
    gc.collect()  # earlier tests' garbage warns now, not below
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        sock, proc = _start_proxy("sleep 60")  # a socket dropped here warns at once
    try:
        assert [str(w.message) for w in caught if w.category is ResourceWarning] == []
    finally:
        sock.close()
        _stop(proc)


def test_a_proxy_command_that_cannot_start_is_one_line_and_leaves_no_socket() -> None:
    """A ProxyCommand the kernel refuses to start (one argument over 128 KiB: E2BIG):
    one line naming the failure, and the socket pair is closed at once (checked while
    the error, which keeps the failed call's frame, is still held)."""
    before = unix_sockets_open()
    with pytest.raises(HostError) as exc:
        _start_proxy("echo " + "x" * 200_000)
    assert unix_sockets_open() == before
    message = str(exc.value)
    assert message.startswith("cannot start the ProxyCommand 'echo xxx")
    assert message.endswith("[Errno 7] Argument list too long: '/bin/sh'")


@pytest.mark.parametrize(
    ("stderr", "said"),
    [
        ("", ""),  # a silent proxy: its status alone
        (r"printf 'no route\n\377 host down\n\n' >&2", ": \ufffd host down"),  # not UTF-8
        ("head -c 3000 /dev/zero | tr '\\0' x >&2", ": " + "x" * 2000),  # a flood: its end
    ],
)
def test_a_proxy_command_that_dies_is_reported_with_the_last_line_it_said(
    home: Path, stderr: str, said: str
) -> None:
    """A ProxyCommand that exits before the handshake: its exit status and the last
    line of its stderr (decoded with replacement, at most its last 2000 bytes), or its
    status alone when it said nothing."""
    command = f'sh -c "{stderr}{"; " if stderr else ""}exit 7"'
    with pytest.raises(HostError) as exc:
        connect(target_for(1, home, proxy_command=command), settings_for(home / "kh"),
                NO_CREDENTIALS)  # fmt: skip
    message = str(exc.value)
    took = elapsed_in(message)
    assert message == (
        f"box (alice@127.0.0.1:1): cannot connect: the ProxyCommand exited with status 7"
        f" after {took} s{said}"
    )


def test_a_failure_is_named_by_its_reason_its_text_or_its_type() -> None:
    assert failure_reason(paramiko.ChannelException(2, "Connect failed")) == "Connect failed"
    assert failure_reason(OSError("No route to host")) == "No route to host"
    assert failure_reason(EOFError()) == "EOFError"
    assert failure_reason(paramiko.SSHException()) == "SSHException"
