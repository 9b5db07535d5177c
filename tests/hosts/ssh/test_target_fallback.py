"""Reading the SSH client configuration when ``ssh -G`` cannot answer: no ``ssh`` binary
(a minimal image: paramiko's parser stands in, with OpenSSH's defaults for what no file
says), and an ``ssh`` that is there but broken (one line naming what failed). Plus the
corners of ``ssh -G``'s output a user's config can produce (``none`` values, several
files on one line, yes/no spellings)."""

from __future__ import annotations

import getpass
import os
import stat
from pathlib import Path

import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.target import (
    SSHTarget,
    expand,
    resolve_target,
    split_spec,
    target_from_options,
)

HOME = os.path.expanduser("~")
DEFAULT_KEYS = tuple(
    f"{HOME}/.ssh/{name}"
    for name in ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk")
)


@pytest.fixture
def no_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH without ``ssh``."""
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))


@pytest.mark.usefixtures("no_ssh")
def test_without_ssh_and_without_a_config_openssh_defaults_apply() -> None:
    assert resolve_target("box", ssh_config=None) == SSHTarget(
        alias="box",
        hostname="box",
        port=22,
        user=getpass.getuser(),
        identity_files=DEFAULT_KEYS,
        user_known_hosts=(f"{HOME}/.ssh/known_hosts", f"{HOME}/.ssh/known_hosts2"),
        global_known_hosts=("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"),
    )
    typed = resolve_target("ops@box:2200", ssh_config=None)
    assert (typed.hostname, typed.user, typed.port) == ("box", "ops", 2200)


@pytest.mark.usefixtures("no_ssh")
def test_without_ssh_the_config_is_read_and_the_command_line_wins(tmp_path: Path) -> None:
    """paramiko's parser: several IdentityFile lines in order, ``%r`` the login user that
    was asked for (not the config's ``User``), what the user typed over the file."""
    config = tmp_path / "config"
    config.write_text(
        "Host pve1\n  User admin\n  Port 2201\n  IdentityFile ~/k/%r-one\n"
        "  IdentityFile /keys/%r-two\n  UserKnownHostsFile /kh/a /kh/b\n"
        "  IdentityAgent none\n  ProxyCommand nc %h %p\n"
    )
    from_file = resolve_target("pve1", ssh_config=str(config))
    assert (from_file.hostname, from_file.user, from_file.port) == ("pve1", "admin", 2201)
    assert from_file.identity_files == (f"{HOME}/k/admin-one", "/keys/admin-two")
    assert from_file.user_known_hosts == ("/kh/a", "/kh/b")
    assert from_file.identity_agent == "none"
    assert from_file.proxy_command == "nc pve1 2201"
    typed = resolve_target("ops@pve1:2300", ssh_config=str(config))
    assert (typed.user, typed.port) == ("ops", 2300)
    assert typed.identity_files == (f"{HOME}/k/ops-one", "/keys/ops-two")
    assert typed.proxy_command == "nc pve1 2300"
    assert resolve_target("pve1", user="root", port=2022, ssh_config=str(config)).identity_files[
        1
    ] == ("/keys/root-two")
    missing = resolve_target("pve1", ssh_config=str(tmp_path / "absent"))
    assert (missing.user, missing.port, missing.identity_files) == (
        getpass.getuser(),
        22,
        DEFAULT_KEYS,
    )


def broken_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """Put an ``ssh`` on PATH made of ``script``: it stands for a damaged OpenSSH client
    install (a binary for another architecture, a wrapper that fails)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(script)
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_an_ssh_that_cannot_run_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    broken_ssh(tmp_path, monkeypatch, "#!/nonexistent/interpreter\n")
    with pytest.raises(HostError) as exc:
        resolve_target("box", ssh_config=None)
    message = str(exc.value)
    assert message.startswith("box: cannot run ssh -G to read the SSH configuration: ")
    assert "No such file or directory" in message and "\n" not in message


def test_an_ssh_that_fails_silently_names_its_exit_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken_ssh(tmp_path, monkeypatch, "#!/bin/sh\nexit 3\n")
    with pytest.raises(HostError) as exc:
        resolve_target("box", ssh_config=None)
    assert str(exc.value) == (
        "box: the SSH client configuration is not valid: exit status 3; "
        "fix it (`ssh -G box` shows the same error)"
    )


def test_an_ssh_failure_is_reported_by_its_first_real_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ssh's tty warning is not the reason; the first other line is."""
    broken_ssh(
        tmp_path,
        monkeypatch,
        "#!/bin/sh\necho 'Pseudo-terminal will not be allocated' >&2\n"
        "echo 'line 3: Bad key types' >&2\necho 'second' >&2\nexit 255\n",
    )
    with pytest.raises(HostError) as exc:
        resolve_target("box", ssh_config=None)
    assert str(exc.value).startswith(
        "box: the SSH client configuration is not valid: line 3: Bad key types; fix it"
    )


def test_ssh_is_asked_with_the_typed_user_and_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ssh -G -F none -l USER -p PORT -- HOST`` (stdin closed): a wrapper that prints
    what it was given shows it."""
    broken_ssh(
        tmp_path,
        monkeypatch,
        '#!/bin/sh\nread -r line && echo "stdin open" >&2 && exit 9\n'
        'echo "hostname $*"\necho "user u"\necho "port 22"\n',
    )
    target = resolve_target("ops@box:2200", ssh_config=None)
    assert target.hostname == "-G -F none -l ops -p 2200 -- box"
    assert resolve_target("box", ssh_config=None).hostname == "-G -F none -- box"


def test_none_values_and_spellings_of_ssh_g_output() -> None:
    """What ``ssh -G`` prints for a user's ``none`` / yes-no spellings: no path called
    ``none``, each known_hosts or revoked file once, in order."""
    target = target_from_options(
        "box",
        {
            "hostname": ["10.0.0.9"],
            "port": ["2222"],
            "user": ["ops"],
            "userknownhostsfile": ["/a /b /a none"],
            "globalknownhostsfile": ["none"],
            "revokedhostkeys": ["/r1 /r2"],
            "identityfile": ["/id one", "NONE", "/id one"],
            "certificatefile": ["none"],
            "identitiesonly": ["YES"],
            "hashknownhosts": ["Yes"],
            "stricthostkeychecking": ["True"],
            "proxyjump": ["a,,b"],
            "proxycommand": ["NONE"],
            "connecttimeout": ["2.5"],
            "identityagent": ["~/agent-%r"],
        },
    )
    assert target == SSHTarget(
        alias="box",
        hostname="10.0.0.9",
        port=2222,
        user="ops",
        identity_files=("/id one",),
        identities_only=True,
        identity_agent=f"{HOME}/agent-ops",
        user_known_hosts=("/a", "/b"),
        revoked_host_keys=("/r1", "/r2"),
        strict_host_key_checking="yes",
        proxy_jump=("a", "b"),
        connect_timeout=2.5,
        hash_known_hosts=True,
    )
    keeps_tilde = target_from_options("box", {"proxycommand": ["~/bin/hop %h"]})
    assert keeps_tilde.proxy_command == "~/bin/hop box"
    empty = target_from_options(
        "box",
        {"hostname": [""], "port": [""], "user": [""], "stricthostkeychecking": [""],
         "identitiesonly": [""], "hashknownhosts": [""]},
    )  # fmt: skip
    assert empty == SSHTarget(alias="box", hostname="box", port=22, user=getpass.getuser())


def test_ports_1_and_65535_are_ports_0_and_65536_are_not() -> None:
    assert split_spec("box:1") == (None, "box", 1)
    assert split_spec("box:65535") == (None, "box", 65535)
    for bad in ("box:0", "box:65536", "[::1]:0"):
        with pytest.raises(HostError) as exc:
            split_spec(bad)
        assert str(exc.value) == f"bad port in {bad!r}: expected [user@]host[:port]"
    with pytest.raises(HostError) as exc:
        split_spec("-oProxyCommand=x")
    assert str(exc.value) == "bad host '-oProxyCommand=x': expected [user@]host[:port]"


def test_a_user_ssh_refuses_is_refused_before_ssh_runs() -> None:
    with pytest.raises(HostError, match=r"^bad user 'a;reboot': the user name contains"):
        resolve_target("box", user="a;reboot", ssh_config=None)


def test_tokens_expand_in_text_that_is_not_ascii() -> None:
    tokens = {"%": "%", "h": "hôte", "r": "jürgen"}
    assert expand("/clés/%r@%h 50%", tokens, home=False) == "/clés/jürgen@hôte 50%"
    assert expand("é%%", tokens, home=False) == "é%"


def test_ssh_g_never_reads_our_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ssh -G`` runs with stdin closed: a ``Match exec`` in the user's config cannot
    eat what was typed into gpudoctor (or wait on a terminal). The wrapper ssh here
    fails when anything reaches its stdin."""
    broken_ssh(
        tmp_path,
        monkeypatch,
        '#!/bin/sh\nif read -r line; then echo "stdin: $line" >&2; exit 9; fi\necho "hostname h"\n',
    )
    saved = os.dup(0)
    read_end, write_end = os.pipe()
    os.write(write_end, b"typed by the user\n")
    os.close(write_end)
    os.dup2(read_end, 0)
    try:
        assert resolve_target("box", ssh_config=None).hostname == "h"
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read_end)


def test_the_config_named_by_the_environment_is_the_default_not_an_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$GPUDOCTOR_SSH_CONFIG`` stands for ``~/.ssh/config``; a config named explicitly
    (``ssh -F``) wins over it, and ``none`` means no file at all."""
    from_env = tmp_path / "env-config"
    from_env.write_text("Host box\n  Port 2201\n")
    given = tmp_path / "given-config"
    given.write_text("Host box\n  Port 2202\n")
    monkeypatch.setenv("GPUDOCTOR_SSH_CONFIG", str(from_env))
    assert resolve_target("box").port == 2201
    assert resolve_target("box", ssh_config=str(given)).port == 2202
    assert resolve_target("box", ssh_config=None).port == 22


@pytest.mark.parametrize("reader", ["ssh -G", "paramiko"])
def test_none_is_no_config_even_beside_a_file_called_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str
) -> None:
    """``ssh_config="none"`` (``ssh -F none``) reads no file, even when the current
    directory holds one named ``none``; a config file that does not exist is no file
    either (defaults, no error; never a file of another name)."""
    if reader == "paramiko":
        (tmp_path / "empty").mkdir()
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    for name in ("none", "NONE"):
        (tmp_path / name).write_text("Host box\n  Port 2201\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_target("box", ssh_config="none").port == 22
    assert resolve_target("box", ssh_config=str(tmp_path / "absent")).port == 22


def test_known_hosts_paths_follow_home_when_it_is_not_the_password_databases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ssh -G`` expands ``~`` from the password database; with ``$HOME`` elsewhere
    (``sudo -E``, tests, a service account whose home is ``/``) a ``~/.ssh`` path
    points into ``$HOME``, and other paths stay as they are."""
    home = tmp_path / "userX"
    (home / ".ssh").mkdir(parents=True)
    config = home / ".ssh" / "config"
    config.write_text("Host box\n  UserKnownHostsFile /site/kh ~/.ssh/mine\n")
    monkeypatch.setenv("HOME", str(home))
    target = resolve_target("box", ssh_config=str(config))
    assert target.user_known_hosts == ("/site/kh", f"{home}/.ssh/mine")
    defaults = resolve_target("other", ssh_config=str(config))  # ssh's own ~/.ssh paths
    assert defaults.user_known_hosts == (f"{home}/.ssh/known_hosts", f"{home}/.ssh/known_hosts2")
    monkeypatch.setenv("HOME", "/")  # a service account's home
    at_root = resolve_target("other", ssh_config=str(config))
    assert at_root.user_known_hosts == ("/.ssh/known_hosts", "/.ssh/known_hosts2")
