"""Logging in as ``ssh -o BatchMode=yes`` does (:func:`authenticate`), against a real SSH
server in this process (tests/hosts/ssh/inproc_sshd.py: paramiko's server side on
127.0.0.1): which keys reach the server in which order, when a password is sent, and the
one line a user gets when nothing worked (every key tried, every key skipped and why,
never a secret)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.auth import Credentials, authenticate
from gpudoctor.hosts.ssh.target import SSHTarget
from tests.hosts.ssh.inproc_sshd import Policy, Server, running
from tests.hosts.ssh.test_auth_keys import agent, ssh_add  # noqa: F401 - the fixture

NO_CREDENTIALS = Credentials()
HINT = (
    "; load a key into ssh-agent (ssh-add), set IdentityFile for this host in "
    "~/.ssh/config, or pass --identity"
)


def make_key(path: Path, passphrase: str | None = None) -> paramiko.ECDSAKey:
    """Write a new ECDSA key to ``path`` (and ``path.pub``); return it."""
    key = paramiko.ECDSAKey.generate()
    key.write_private_key_file(str(path), password=passphrase)
    path.with_name(path.name + ".pub").write_text(
        f"{key.get_name()} {key.get_base64()} {path.name}-comment\n"
    )
    return key


def target_for(server: Server, *identities: Path, **more: object) -> SSHTarget:
    return SSHTarget(
        alias="box",
        hostname="127.0.0.1",
        port=server.port,
        user="alice",
        identity_files=tuple(str(p) for p in identities),
        identity_agent=more.pop("identity_agent", "none"),  # type: ignore[arg-type]
        **more,  # type: ignore[arg-type]
    )


@pytest.fixture
def server() -> Iterator[Server]:
    with running() as started:
        yield started


def login(server: Server, target: SSHTarget, creds: Credentials = NO_CREDENTIALS) -> None:
    """Open a real SSH transport to ``server`` and run :func:`authenticate` on it; the
    transport is closed again whatever happens."""
    transport = paramiko.Transport(socket.create_connection(("127.0.0.1", server.port)))
    try:
        transport.start_client(timeout=30)
        authenticate(transport, target, creds, 30)
        assert transport.is_authenticated()
    finally:
        transport.close()


def failure(server: Server, target: SSHTarget, creds: Credentials = NO_CREDENTIALS) -> str:
    with pytest.raises(HostError) as exc:
        login(server, target, creds)
    return str(exc.value)


def test_keys_are_offered_in_order_until_the_server_takes_one(
    server: Server, tmp_path: Path
) -> None:
    first, second, _third = (make_key(tmp_path / n) for n in ("first", "second", "third"))
    server.policy.keys = {second.asbytes()}
    login(server, target_for(server, tmp_path / "first", tmp_path / "second", tmp_path / "third"))
    assert server.offered_blobs == [first.asbytes(), second.asbytes()]
    assert [a.user for a in server.attempts] == ["alice", "alice"]


def test_refusal_names_every_key_tried_and_every_key_skipped(
    server: Server, tmp_path: Path
) -> None:
    """No key is taken: one line with each key offered, each identity skipped and why
    (an encrypted file without a passphrase), the password attempt, and what to do;
    the password itself never appears."""
    make_key(tmp_path / "a")
    make_key(tmp_path / "b")
    make_key(tmp_path / "locked", passphrase="s3cret-pass")
    (tmp_path / "a-copy").write_bytes((tmp_path / "a").read_bytes())  # offered once
    make_key(tmp_path / "pubonly")
    (tmp_path / "pubonly").unlink()  # only pubonly.pub is left, and no agent
    (tmp_path / "junk").write_text("not a key\n")
    server.policy.password = "right"
    names = ("a", "a-copy", "pubonly.pub", "locked", "junk", "missing", "b")
    files = [tmp_path / n for n in names]
    message = failure(server, target_for(server, *files), Credentials(password="wrong-pw"))
    a, b, locked, pub, junk = (
        str(tmp_path / n) for n in ("a", "b", "locked", "pubonly.pub", "junk")
    )
    assert message == (
        f"box (alice@127.0.0.1:{server.port}): SSH authentication failed (tried: {a}; {b}; "
        f"password; {pub} is a public key and no ssh-agent is reachable; {locked} is "
        f"encrypted (load it into ssh-agent: ssh-add {locked}); {junk} cannot be loaded "
        f"(ValueError)){HINT}"
    )
    assert [a.method for a in server.attempts] == ["publickey", "publickey", "password"]


def test_no_key_and_no_password_says_no_usable_key(server: Server, tmp_path: Path) -> None:
    message = failure(server, target_for(server, tmp_path / "missing"))
    assert message == (
        f"box (alice@127.0.0.1:{server.port}): SSH authentication failed "
        f"(tried: no usable key){HINT}"
    )
    assert server.attempts == []


def test_password_logs_in_after_the_keys_fail(server: Server, tmp_path: Path) -> None:
    key = make_key(tmp_path / "a")
    server.policy.password = "right"
    login(server, target_for(server, tmp_path / "a"), Credentials(password="right"))
    assert [(a.method, a.detail) for a in server.attempts] == [
        ("publickey", key.asbytes()),
        ("password", b"right"),
    ]


def test_no_password_is_sent_when_a_key_logs_in(server: Server, tmp_path: Path) -> None:
    key = make_key(tmp_path / "a")
    server.policy.keys = {key.asbytes()}
    server.policy.password = "right"
    login(server, target_for(server, tmp_path / "a"), Credentials(password="right"))
    assert [a.method for a in server.attempts] == ["publickey"]


def test_a_server_that_takes_only_passwords_gets_no_more_keys(
    server: Server, tmp_path: Path
) -> None:
    """``PubkeyAuthentication no`` on the server: the first key's refusal names the
    allowed methods; no other key is offered, and a given password still logs in."""
    make_key(tmp_path / "a")
    make_key(tmp_path / "b")
    server.policy.allowed = "password,keyboard-interactive"
    server.policy.password = "right"
    target = target_for(server, tmp_path / "a", tmp_path / "b")
    message = failure(server, target)
    assert message == (
        f"box (alice@127.0.0.1:{server.port}): SSH authentication failed (tried: no usable "
        f"key; the server allows only password, keyboard-interactive){HINT}"
    )
    assert server.attempts == []
    login(server, target, Credentials(password="right"))
    assert [a.method for a in server.attempts] == ["password"]


def test_a_key_that_is_only_a_first_factor_says_what_the_server_wants_next(
    server: Server, tmp_path: Path
) -> None:
    """``AuthenticationMethods publickey,password``: the key is accepted as a first factor;
    without a password the line says the server wants one too, with it the login works."""
    key = make_key(tmp_path / "a")
    server.policy.first_factor_keys = {key.asbytes()}
    server.policy.password = "right"
    target = target_for(server, tmp_path / "a")
    message = failure(server, target)
    assert message == (
        f"box (alice@127.0.0.1:{server.port}): SSH authentication failed (tried: "
        f"{tmp_path / 'a'} (server wants also password, keyboard-interactive)){HINT}"
    )
    login(server, target, Credentials(password="right"))
    assert [a.method for a in server.attempts][-2:] == ["publickey", "password"]


def test_a_password_that_is_only_a_first_factor_is_not_a_login(server: Server) -> None:
    """The password is right but the server wants a key too: no login, and the password
    is not listed as tried (it was accepted, the login is incomplete)."""
    server.policy.first_factor_keys = {b"some other key"}
    server.policy.password = "right"
    message = failure(server, target_for(server), Credentials(password="right"))
    assert "(tried: no usable key)" in message
    assert [a.method for a in server.attempts] == ["password"]


def test_a_server_that_drops_the_connection_mid_login_is_one_line(
    server: Server, tmp_path: Path
) -> None:
    make_key(tmp_path / "a")
    make_key(tmp_path / "b")
    server.policy.drop_on_auth = True
    message = failure(server, target_for(server, tmp_path / "a", tmp_path / "b"))
    assert message == (
        f"box (alice@127.0.0.1:{server.port}): SSH authentication broke off: No existing session"
    )


def test_a_server_that_never_answers_fails_at_the_timeout(tmp_path: Path) -> None:
    """The timeout given is the authentication's: a server that never answers a login
    request fails then, naming the key it was offered (the server is let go after)."""
    make_key(tmp_path / "a")
    with running(Policy(hold_auth=threading.Event())) as server:
        transport = paramiko.Transport(socket.create_connection(("127.0.0.1", server.port)))
        try:
            transport.start_client(timeout=30)
            with pytest.raises(HostError) as exc:
                authenticate(transport, target_for(server, tmp_path / "a"), Credentials(), 0.5)
        finally:
            transport.close()
    assert f"(tried: {tmp_path / 'a'}){HINT}" in str(exc.value)


def unix_sockets_open() -> int:
    """Return how many Unix-domain sockets this process holds (``ls -l /proc/self/fd``
    against ``/proc/net/unix``): the agent connection is one; the loopback SSH server's
    sockets are TCP and do not count."""
    with open("/proc/net/unix") as fh:
        unix = {line.split()[6] for line in fh.readlines()[1:]}
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in unix:
            held += 1
    return held


def test_an_agent_key_logs_in_and_the_agent_connection_is_closed(
    server: Server,
    tmp_path: Path,
    agent: str,  # noqa: F811 - the fixture
) -> None:
    """``IdentityAgent``: the agent's key logs in, and the connection to the agent is
    closed again, whether the login worked or not (no file descriptor left behind)."""
    key = make_key(tmp_path / "inagent")
    ssh_add(agent, str(tmp_path / "inagent"))
    (tmp_path / "inagent").unlink()  # only the agent holds it now
    target = target_for(server, identity_agent=agent)
    server.policy.keys = {key.asbytes()}
    before = unix_sockets_open()
    login(server, target)
    assert server.offered_blobs == [key.asbytes()]
    assert unix_sockets_open() == before
    server.policy.keys = set()
    with pytest.raises(HostError) as exc:
        login(server, target)
    # the error's traceback keeps authenticate's frame (and its agent) alive: closed anyway
    assert unix_sockets_open() == before
    # ssh-add names a PEM key (no comment inside) by its path
    assert f"(tried: agent key {tmp_path / 'inagent'}){HINT}" in str(exc.value)
