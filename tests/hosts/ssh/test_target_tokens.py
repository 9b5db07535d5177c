"""Every ssh_config option gpudoctor takes from ``ssh -G`` (and from paramiko's parser when
no ``ssh`` exists), with OpenSSH's ``%`` tokens and ``~`` expanded as ``ssh`` expands them
when it connects: one config file, both readers, the same :class:`SSHTarget`."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
from pathlib import Path

import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.target import SSHTarget, expand, resolve_target, target_from_options

CONFIG = """\
Host pve*
  HostName node-%h.lab
  User admin
  Port 2222
  IdentityFile ~/keys/%h-%p-%r-%n-%u-%i-%%
  CertificateFile %d/certs/%k.pub
  UserKnownHostsFile ~/kh1 %d/kh2 ~/kh1
  GlobalKnownHostsFile /site/known /site/known
  RevokedHostKeys ~/revoked
  IdentityAgent %d/agent.sock
  ProxyCommand nc %h %p
  HostKeyAlias pve-alias
  ConnectTimeout 7
  IdentitiesOnly yes
  HashKnownHosts yes
  StrictHostKeyChecking accept-new
"""


def expected(home: str) -> SSHTarget:
    me, uid = getpass.getuser(), os.getuid()
    return SSHTarget(
        alias="pve1",
        hostname="node-pve1.lab",
        port=2222,
        user="admin",
        identity_files=(f"{home}/keys/node-pve1.lab-2222-admin-pve1-{me}-{uid}-%",),
        identities_only=True,
        certificate_files=(f"{home}/certs/pve-alias.pub",),
        identity_agent=f"{home}/agent.sock",
        user_known_hosts=(f"{home}/kh1", f"{home}/kh2"),
        global_known_hosts=("/site/known",),
        host_key_alias="pve-alias",
        strict_host_key_checking="accept-new",
        proxy_command="nc node-pve1.lab 2222",
        connect_timeout=7.0,
        hash_known_hosts=True,
        revoked_host_keys=(f"{home}/revoked",),
    )


@pytest.mark.parametrize("reader", ["ssh -G", "paramiko"])
def test_every_option_is_read_and_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str, passwd_home: str
) -> None:
    if reader == "ssh -G" and not shutil.which("ssh"):
        pytest.skip("needs the OpenSSH client")
    if reader == "paramiko":
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    config = tmp_path / "config"
    config.write_text(CONFIG)
    target = resolve_target("pve1", ssh_config=str(config))
    assert target == expected(passwd_home)


def test_what_the_command_line_says_wins_over_the_config(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(CONFIG)
    target = resolve_target("ops@pve1:2200", ssh_config=str(config))
    assert (target.user, target.port) == ("ops", 2200)
    assert target.proxy_command == "nc node-pve1.lab 2200"
    assert resolve_target("pve1", user="root", port=22, ssh_config=str(config)).user == "root"


def test_options_left_unset_take_openssh_defaults() -> None:
    target = target_from_options("box", {})
    assert target == SSHTarget(alias="box", hostname="box", port=22, user=getpass.getuser())
    unset = target_from_options(
        "box",
        {"identityagent": ["SSH_AUTH_SOCK"], "proxycommand": ["none"], "proxyjump": ["none"],
         "connecttimeout": ["none"], "stricthostkeychecking": ["false"],
         "identitiesonly": ["true"], "hashknownhosts": ["true"]},
    )  # fmt: skip
    assert (unset.identity_agent, unset.proxy_command, unset.proxy_jump) == (None, None, ())
    assert (unset.connect_timeout, unset.strict_host_key_checking) == (None, "no")
    assert unset.identities_only and unset.hash_known_hosts
    assert target_from_options("box", {"identityagent": ["NONE"]}).identity_agent == "none"


def test_each_token_expands_as_openssh_documents_it() -> None:
    target = SSHTarget(alias="pve1", hostname="10.0.0.5", port=2222, user="admin")
    tokens = {
        "%": "%", "h": "10.0.0.5", "p": "2222", "r": "admin", "n": "pve1", "k": "10.0.0.5",
        "u": getpass.getuser(), "d": os.path.expanduser("~"), "i": str(os.getuid()),
        "l": socket.gethostname(), "L": socket.gethostname().split(".")[0],
    }  # fmt: skip
    from gpudoctor.hosts.ssh.target import _tokens

    assert _tokens(target, None) == tokens
    assert _tokens(target, "pve-alias")["k"] == "pve-alias"
    assert expand("%h:%p %%h 50%", tokens) == "10.0.0.5:2222 %h 50%"
    assert expand("~/x-%r", tokens) == f"{os.path.expanduser('~')}/x-admin"
    assert expand("~/x-%r", tokens, home=False) == "~/x-admin"
    with pytest.raises(HostError) as caught:
        expand("nc %h %z", tokens)
    assert str(caught.value) == "unknown token %z in the SSH configuration value 'nc %h %z'"
