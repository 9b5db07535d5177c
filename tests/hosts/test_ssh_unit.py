"""SSH target parsing, ~/.ssh/config aliases, fingerprints, open_host (no server needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko
import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.connect import open_host
from gpudoctor.hosts.local import LocalHost
from gpudoctor.hosts.ssh import SSHHost, fingerprint, resolve_target, split_spec


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("pve1", (None, "pve1", None)),
        ("root@pve1", ("root", "pve1", None)),
        ("root@10.0.0.5:2222", ("root", "10.0.0.5", 2222)),
        ("admin@[fd00::1]:22", ("admin", "fd00::1", 22)),
        ("[fd00::1]", (None, "fd00::1", None)),
        ("fd00::1", (None, "fd00::1", None)),
    ],
)
def test_split_spec(spec: str, expected: tuple) -> None:
    assert split_spec(spec) == expected


@pytest.mark.parametrize("spec", ["root@", "root@host:0", "root@host:http", "root@host:70000"])
def test_split_spec_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(HostError, match=r"expected \[user@\]host\[:port\]"):
        split_spec(spec)


def test_resolve_target_honours_ssh_config(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(
        "Host pve1\n"
        "    HostName 192.0.2.10\n"
        "    User admin\n"
        "    Port 2200\n"
        "    IdentityFile ~/.ssh/pve_key\n"
        "Host *\n"
        "    User fallback\n"
    )
    target = resolve_target("pve1", ssh_config=str(config))
    assert (target.hostname, target.user, target.port) == ("192.0.2.10", "admin", 2200)
    assert target.identity_files == (str(Path("~/.ssh/pve_key").expanduser()),)
    assert target.known_hosts_name == "[192.0.2.10]:2200"
    # What the user typed wins over the config file.
    explicit = resolve_target("root@pve1:22", ssh_config=str(config))
    assert (explicit.user, explicit.port, explicit.known_hosts_name) == ("root", 22, "192.0.2.10")
    other = resolve_target("box", ssh_config=str(config))
    assert (other.hostname, other.user, other.port) == ("box", "fallback", 22)


def test_resolve_target_without_config(tmp_path: Path) -> None:
    target = resolve_target("pve2", ssh_config=str(tmp_path / "absent"))
    assert (target.hostname, target.user, target.port) == ("pve2", "root", 22)


def test_fingerprint_matches_ssh_keygen(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_file)], check=True)
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(key_file) + ".pub"], capture_output=True, text=True
    ).stdout.split()[1]
    key = paramiko.Ed25519Key.from_private_key_file(str(key_file))
    assert fingerprint(key) == listed


def test_open_host_picks_the_transport() -> None:
    assert isinstance(open_host("local"), LocalHost)
    remote = open_host("root@192.0.2.1:2222", ssh_config=None)
    assert isinstance(remote, SSHHost)
    assert (remote.target.hostname, remote.target.port) == ("192.0.2.1", 2222)
    assert remote.name == "root@192.0.2.1:2222"


def test_repr_never_shows_secrets() -> None:
    host = SSHHost("root@192.0.2.1", password="hunter2", passphrase="pass-phrase", ssh_config=None)
    assert "hunter2" not in repr(host)
    assert "pass-phrase" not in repr(host)
    assert "hunter2" not in str(vars(host).get("name"))


def test_silent_server_is_a_connect_timeout(tmp_path: Path) -> None:
    """A TCP port that accepts but never speaks SSH (a hung sshd, a wrong service) gives a
    clear error within the connect timeout instead of hanging."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
    thread.start()
    host = SSHHost(
        f"root@127.0.0.1:{port}",
        ssh_config=None,
        system_known_hosts=False,
        known_hosts=str(tmp_path / "known_hosts"),
        connect_timeout=1,
    )
    try:
        with pytest.raises(
            HostError, match=rf"root@127.0.0.1:{port}: cannot connect: no SSH handshake within 1 s"
        ):
            host.run(["true"])
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
