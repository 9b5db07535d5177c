"""What a user passes to ``SSHHost`` is what the connection uses: an unknown host key is
refused unless they asked to save it, ``user``/``port`` beside the spec, a password, a key's
passphrase, the known_hosts files their ssh config names (and only those when asked), a
jump host named in that config; and stdout that is not UTF-8 still reads. Against a real SSH server in the test process (tests/hosts/ssh/inproc_sshd.py)."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.host import SSHHost
from tests.hosts.ssh.inproc_sshd import Policy, running
from tests.hosts.ssh.test_authenticate import make_key
from tests.hosts.ssh.test_host_deadlines import host_for


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of the test's own: no key, agent or known_hosts of the machine's user."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return tmp_path


def ran(host: SSHHost, argv: list[str]) -> str:
    """Run ``argv`` on ``host``, close it, and return its stdout (rc 0 asserted)."""
    try:
        result = host.run(argv)
    finally:
        host.close()
    assert result.returncode == 0, result
    return result.stdout


def serving(key: paramiko.PKey) -> running:
    return running(Policy(keys={key.asbytes()}))


def test_a_host_never_seen_is_refused_unless_its_key_may_be_saved(home: Path) -> None:
    key = make_key(home / "id")
    known = home / "known_hosts"
    known.write_text("")
    with serving(key) as server:
        spec = f"alice@127.0.0.1:{server.port}"
        opts = dict(key_filename=str(home / "id"), known_hosts=str(known), ssh_config=None,
                    system_known_hosts=False)  # fmt: skip
        with pytest.raises(HostError) as refused:
            ran(SSHHost(spec, **opts), ["true"])  # the default: never trusted silently
        assert "unknown SSH host key" in str(refused.value)
        assert known.read_text() == "" and server.commands == []
        assert ran(SSHHost(spec, accept_new_host_key=True, **opts), ["echo", "in"]) == "in\n"
    assert known.read_text() == server.known_hosts_line()


def test_user_and_port_given_apart_from_the_spec_are_the_ones_used(home: Path) -> None:
    key = make_key(home / "id")
    with serving(key) as server:
        known = home / "known_hosts"
        known.write_text(server.known_hosts_line())
        host = SSHHost("127.0.0.1", user="bob", port=server.port, key_filename=str(home / "id"),
                       known_hosts=str(known), ssh_config=None, system_known_hosts=False)  # fmt: skip
        assert ran(host, ["echo", "ok"]) == "ok\n"
    assert {a.user for a in server.attempts} == {"bob"}


def test_a_password_logs_in(home: Path) -> None:
    with running(Policy(password="s3cret")) as server:
        known = home / "known_hosts"
        known.write_text(server.known_hosts_line())
        host = SSHHost(f"carol@127.0.0.1:{server.port}", password="s3cret",
                       known_hosts=str(known), ssh_config=None, system_known_hosts=False)  # fmt: skip
        assert ran(host, ["echo", "ok"]) == "ok\n"
    assert [(a.method, a.detail) for a in server.attempts][-1] == ("password", b"s3cret")


def test_a_passphrase_unlocks_the_key_file(home: Path) -> None:
    key = make_key(home / "locked", passphrase="pp")
    with serving(key) as server:
        known = home / "known_hosts"
        known.write_text(server.known_hosts_line())
        host = SSHHost(f"alice@127.0.0.1:{server.port}", key_filename=str(home / "locked"),
                       passphrase="pp", known_hosts=str(known), ssh_config=None,
                       system_known_hosts=False)  # fmt: skip
        assert ran(host, ["echo", "ok"]) == "ok\n"
    assert key.asbytes() in server.offered_blobs


@pytest.mark.parametrize("system_known_hosts", [True, False])
def test_the_known_hosts_file_the_ssh_config_names_is_read_unless_asked_not_to(
    home: Path, system_known_hosts: bool
) -> None:
    """By default the UserKnownHostsFile the config names makes the host known; with
    ``system_known_hosts=False`` it is not read, so the host's key is unknown there."""
    key = make_key(home / "id")
    with serving(key) as server:
        config_known = home / "config_known_hosts"
        config_known.write_text(server.known_hosts_line())
        config = home / "config"
        config.write_text(f"Host box\n  HostName 127.0.0.1\n  Port {server.port}\n  User alice\n"
                          f"  IdentityFile {home / 'id'}\n"
                          f"  UserKnownHostsFile {config_known}\n")  # fmt: skip
        host = SSHHost("box", ssh_config=str(config), system_known_hosts=system_known_hosts)
        if system_known_hosts:
            assert ran(host, ["echo", "ok"]) == "ok\n"
            return
        with pytest.raises(HostError) as refused:
            ran(host, ["true"])
        assert "unknown SSH host key" in str(refused.value) and server.commands == []


def test_stdout_that_is_not_utf8_reads_with_replacement_characters(home: Path) -> None:
    key = make_key(home / "id")
    with serving(key) as server:
        host = host_for(server, home)
        assert ran(host, ["printf", "\\377ok"]) == "\ufffdok"


def test_a_host_whose_server_went_away_says_so_at_every_call(home: Path) -> None:
    key = make_key(home / "id")
    with serving(key) as server:
        host = host_for(server, home)
        assert host.run(["true"]).returncode == 0
    dead = host._conn.transport  # type: ignore[union-attr]
    dead.join(30)  # the client has seen the server go
    assert not dead.is_active()
    try:
        for _ in range(2):  # the dead connection is dropped, then every connect fails
            with pytest.raises(HostError):
                host.run(["true"])
    finally:
        host.close()


def test_a_jump_host_named_only_in_the_given_config_carries_the_connection(home: Path) -> None:
    """``ssh -F FILE box`` where FILE says ``ProxyJump jumpbox``: the hop's name, port,
    user, key and known_hosts come from FILE too."""
    key = make_key(home / "id")
    with serving(key) as server, serving(key) as hop:
        known = home / "config_known_hosts"
        known.write_text(server.known_hosts_line() + hop.known_hosts_line())
        config = home / "config"
        config.write_text(f"Host box\n  HostName 127.0.0.1\n  Port {server.port}\n  User alice\n"
                          f"  ProxyJump jumpbox\n"
                          f"Host jumpbox\n  HostName 127.0.0.1\n  Port {hop.port}\n  User root\n"
                          f"Host *\n  IdentityFile {home / 'id'}\n"
                          f"  UserKnownHostsFile {known}\n")  # fmt: skip
        assert ran(SSHHost("box", ssh_config=str(config)), ["echo", "ok"]) == "ok\n"
    assert hop.forwards == [("127.0.0.1", server.port)]
    assert [a.user for a in hop.attempts] == ["root"]
    assert server.commands == ["timeout -k 2 30 echo ok; exit $?"]
