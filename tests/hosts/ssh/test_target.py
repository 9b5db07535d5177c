"""SSH target parsing, ~/.ssh/config aliases, fingerprints, open_host (no server needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko
import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.connect import open_host
from gpudoctor.hosts.local import LocalHost
from gpudoctor.hosts.ssh.host import SSHHost, fingerprint, resolve_target, split_spec


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


def test_resolve_target_reads_what_ssh_reads(tmp_path: Path, passwd_home: str) -> None:
    """``ssh -G`` resolves Match, Include, several IdentityFiles and known_hosts files,
    HostKeyAlias, ProxyJump and ProxyCommand; gpudoctor takes them all."""
    (tmp_path / "site.conf").write_text(
        "Host pve*\n  UserKnownHostsFile ~/kh/site1 /etc/site1_known\n  IdentitiesOnly yes\n"
    )
    config = tmp_path / "config"
    config.write_text(
        f"Include {tmp_path}/site.conf\n"
        "Match host pve2\n  HostKeyAlias pve2.site1\n"
        "Host pve2\n  HostName 10.0.0.2\n  ProxyJump admin@bastion:2022,bastion2\n"
        "  IdentityFile ~/.ssh/site1_%r\n  IdentityFile ~/.ssh/other\n"
        "  CertificateFile ~/.ssh/site1-cert.pub\n  StrictHostKeyChecking accept-new\n"
        "  ConnectTimeout 7\n  IdentityAgent none\n"
        "Host pve3\n  ProxyCommand nc -X connect -x proxy:3128 %h %p\n"
    )
    target = resolve_target("pve2", ssh_config=str(config))
    home = passwd_home
    assert (target.hostname, target.port, target.host_key_alias) == ("10.0.0.2", 22, "pve2.site1")
    assert target.known_hosts_name == "pve2.site1"
    assert target.user_known_hosts == (f"{home}/kh/site1", "/etc/site1_known")
    assert target.identity_files == (
        f"{home}/.ssh/site1_{target.user}",
        f"{home}/.ssh/other",
    )
    assert target.certificate_files == (f"{home}/.ssh/site1-cert.pub",)
    assert target.identities_only and target.identity_agent == "none"
    assert target.proxy_jump == ("admin@bastion:2022", "bastion2")
    assert (target.strict_host_key_checking, target.connect_timeout) == ("accept-new", 7.0)
    other = resolve_target("root@pve3:2200", ssh_config=str(config))
    assert other.proxy_command == "nc -X connect -x proxy:3128 pve3 2200"
    assert other.proxy_jump == () and other.host_key_alias is None
    assert other.known_hosts_name == "[pve3]:2200"


def test_bad_ssh_config_is_one_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host x\n  NoSuchOption yes\n")
    with pytest.raises(
        HostError,
        match=r"(?i)x: the SSH client configuration is not valid: .*line 2: bad configuration option: nosuchoption",
    ):
        resolve_target("x", ssh_config=str(config))


def test_strict_host_key_checking_values(tmp_path: Path) -> None:
    """ssh -G spells yes/no as true/false; gpudoctor maps them back, and its policy never
    goes below accept-new (``no`` still refuses a changed key, see ssh_trust)."""
    from gpudoctor.hosts.ssh.trust import policy_for

    config = tmp_path / "config"
    modes = {}
    for value in ("yes", "no", "accept-new", "ask"):
        config.write_text(f"Host h\n  StrictHostKeyChecking {value}\n")
        target = resolve_target("h", ssh_config=str(config))
        modes[value] = (target.strict_host_key_checking, policy_for(target, None, False).mode)
    assert modes == {
        "yes": ("yes", "yes"),
        "no": ("no", "accept-new"),
        "accept-new": ("accept-new", "accept-new"),
        "ask": ("ask", "yes"),
    }
    assert policy_for(resolve_target("h", ssh_config=None), None, True).mode == "accept-new"


def test_home_is_honoured_for_the_default_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With $HOME elsewhere (tests, sudo -E) the config and known_hosts of $HOME are used."""
    ssh_dir = tmp_path / ".ssh"
    ssh_dir.mkdir()
    (ssh_dir / "config").write_text("Host box\n  HostName 192.0.2.7\n  Port 2201\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    target = resolve_target("box")
    assert (target.hostname, target.port) == ("192.0.2.7", 2201)
    assert target.user_known_hosts[0] == str(ssh_dir / "known_hosts")


def test_without_an_ssh_binary_paramiko_parses_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``ssh`` on PATH (a minimal image): paramiko's parser stands in, with OpenSSH's
    defaults for what the file does not say."""
    config = tmp_path / "config"
    config.write_text(
        "Host pve1\n  HostName 192.0.2.10\n  Port 2200\n  ProxyJump bastion\n"
        "  UserKnownHostsFile /site/kh\n"
    )
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    target = resolve_target("pve1", ssh_config=str(config))
    assert (target.hostname, target.port, target.proxy_jump) == ("192.0.2.10", 2200, ("bastion",))
    assert target.user_known_hosts == ("/site/kh",)
    assert target.global_known_hosts == ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
    assert target.identity_files[0] == str(Path("~/.ssh/id_rsa").expanduser())
