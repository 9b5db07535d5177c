"""The paramiko fallback (no ``ssh`` binary on PATH: paramiko parses ssh_config) against
a real sshd on 127.0.0.1, reached through a real ProxyCommand run by ``/bin/sh``; and
the host/user name rules compared with the real ``ssh -G`` on a corpus of names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.host import SSHHost
from tests.lab.sshd import SSHD, LabSSHD

pytestmark = pytest.mark.lab

# A ProxyCommand: records its argv (one JSON list a line), then relays stdin/stdout to
# HOST PORT (argv[2], argv[3]).
RELAY = r"""
import json, socket, sys, threading
with open(sys.argv[1], "a") as log:
    log.write(json.dumps(sys.argv[2:]) + "\n")
sock = socket.create_connection(("127.0.0.1", int(sys.argv[3])))
def up():
    while chunk := sys.stdin.buffer.read1(65536):
        sock.sendall(chunk)
    sock.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while chunk := sock.recv(65536):
    sys.stdout.buffer.write(chunk); sys.stdout.buffer.flush()
"""


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabSSHD]:
    from tests.conftest import lab_unavailable

    if os.geteuid() != 0 or not os.path.exists(SSHD) or not shutil.which("ssh"):
        lab_unavailable(f"the fallback tests need root, {SSHD} and ssh (the reference)")
    server = LabSSHD(tmp_path_factory.mktemp("ssh-fallback"), None)
    try:
        server.start()
        server.authorize(server.client_key.with_suffix(".pub"))
    except Exception as exc:
        server.stop()
        lab_unavailable(f"the lab sshd cannot start: {exc}")
    yield server
    server.stop()


@pytest.fixture
def no_ssh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PATH without an ``ssh`` binary: gpudoctor falls back to paramiko's parser."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert shutil.which("ssh") is None


def config(server: LabSSHD, folder: Path, command: str) -> tuple[Path, Path]:
    """Write an ssh_config whose every host goes through the relay ProxyCommand
    ``command`` (tokens in it); return (config, the relay's argv log)."""
    relay, log = folder / "relay.py", folder / "relay.log"
    relay.write_text(RELAY)
    (folder / "known_hosts").write_text(server.known_hosts_line.replace(
        f"[127.0.0.1]:{server.port}", "*") + "\n")  # fmt: skip
    path = folder / "ssh_config"
    path.write_text(
        "Host *\n"
        f"  ProxyCommand {sys.executable} {relay} {log} {command}\n"
        f"  IdentityFile {server.client_key}\n  IdentitiesOnly yes\n  IdentityAgent none\n"
        f"  UserKnownHostsFile {folder / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n"
    )
    return path, log


def reach(spec: str, ssh_config: Path) -> str:
    host = SSHHost(spec, ssh_config=str(ssh_config), connect_timeout=10.0)
    try:
        result = host.run(["id", "-un"])
        assert result.ok, result.stderr
        return result.stdout.strip()
    finally:
        host.close()


def test_fallback_expands_tokens_once_with_the_login_user(
    sshd: LabSSHD, tmp_path: Path, no_ssh: None
) -> None:
    """Through the fallback, %h %p %r reach the ProxyCommand as single words with the
    user asked for (paramiko's own expansion put the config's User, or the local user,
    in %r), and %% is one percent sign (paramiko expanded the value a second time)."""
    path, log = config(sshd, tmp_path, f"%h {sshd.port} %r %%h")
    assert reach("root@127.0.0.1", path) == "root"
    assert log.read_text().splitlines() == [f'["127.0.0.1", "{sshd.port}", "root", "%h"]']


@pytest.mark.parametrize(
    "spec",
    ["127.0.0.1;touch${IFS}MARK", "127.0.0.1$(touch${IFS}MARK)", "root;touch${IFS}MARK@127.0.0.1",
     "ro`touch${IFS}MARK`ot@127.0.0.1"],
)  # fmt: skip
def test_fallback_refuses_names_a_shell_would_run(
    sshd: LabSSHD, tmp_path: Path, no_ssh: None, spec: str
) -> None:
    """Attack: without an ``ssh`` binary, a host or user name holding shell syntax (an
    inventory entry, a `--host` pasted from elsewhere) went unquoted into ProxyCommand's
    %h/%r, and /bin/sh ran it: `--host '127.0.0.1;touch X'` created X. OpenSSH refuses
    such names before any expansion (ssh_valid_hostname/ssh_valid_ruser); so does
    gpudoctor, with one line, and nothing runs."""
    marker = tmp_path / "pwned"
    path, log = config(sshd, tmp_path, f"%h {sshd.port} %r")
    with pytest.raises(HostError, match="contains characters ssh refuses") as caught:
        reach(spec.replace("MARK", str(marker)), path)
    assert "\n" not in str(caught.value)
    assert not marker.exists()
    assert not log.exists(), "the ProxyCommand never started"


NAMES = ["pve1", "pve1.example.com", "10.0.0.5", "-oProxyCommand=x", "a b", "a\tb", "a\nb",
         "a;b", "a&b", "a|b", "a$b", "a`b`", "a'b", 'a"b', "a\\b", "a(b)", "a{b}", "a<b", "a>b",
         "a,b", "a*b", "a?b", "a[b]", "a~b", "a!b", "a#b", "a=b", "a%b", "a\x7fb", "a\x01b",
         "ä.example", "a_b", "-", "a-"]  # fmt: skip
USERS = ["root", "r-1", "a b", "a -b", "a\\", "a\\b", "a$b", "a;b", "a`b", "a(b", "a\x01b",
         "-root", "a,b", "a*b", "user@realm", "a'b", 'a"b', "a|b", "a&b", "a<b"]  # fmt: skip


def test_name_rules_match_ssh(sshd: LabSSHD) -> None:
    """Every name is judged as the real `ssh -G` judges it (host and `-l user`)."""
    from gpudoctor.hosts.ssh.target import valid_hostname, valid_user

    for name in NAMES:
        done = subprocess.run(["ssh", "-G", "-F", "none", "--", name], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)  # fmt: skip
        assert valid_hostname(name) is (done.returncode == 0), (name, done.stderr)
    for user in USERS:
        done = subprocess.run(["ssh", "-G", "-F", "none", "-l", user, "host"],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)  # fmt: skip
        assert valid_user(user) is (done.returncode == 0), (user, done.stderr)
