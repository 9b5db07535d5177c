"""gpudoctor reaches what ``ssh -o BatchMode=yes ALIAS true`` reaches, with the same trust
decisions: real OpenSSH servers on 127.0.0.1 (bastions, targets, CA-certified host
keys), a real ssh-agent, an ssh_config and known_hosts files written by the test
(:mod:`tests.lab.ssh_site`). The real ~/.ssh is never used."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.host import SSHHost
from tests.lab.ssh_site import Site
from tests.lab.sshd import SSHD

pytestmark = pytest.mark.lab

# alias -> does `ssh -o BatchMode=yes ALIAS true` reach it?
REACHES = {
    "direct": True,
    "jump1": True,
    "jump2": True,
    "viacommand": True,
    "alias-ok": True,
    "alias-wrong": False,
    "agent": True,
    "agent-off": False,
    "agent-any": True,
    "changed-behind-jump": False,
    "jump-changed": False,
    "cert": True,
    "cert-alias": True,
    "cert-expired": False,
    "cert-wrong-principal": False,
    "unknown": False,
    "rsa-host": True,
    "ecdsa-host": True,
    "usercert": True,
    "usercert-missing": False,
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    from tests.conftest import lab_unavailable

    missing = [t for t in ("ssh", "ssh-keygen", "ssh-agent", "ssh-add") if not shutil.which(t)]
    if os.geteuid() != 0 or not os.path.exists(SSHD) or missing:
        lab_unavailable(f"the SSH site needs root, {SSHD} and {missing or 'the ssh client'}")
    the_site = Site(tmp_path_factory.mktemp("ssh-site"))
    try:
        the_site.start()
    except Exception as exc:
        the_site.stop()
        lab_unavailable(f"the SSH site cannot start: {exc}")
    yield the_site
    the_site.stop()


def gpudoctor_reaches(site: Site, alias: str) -> tuple[bool, str]:
    """Return (reached, error text) for gpudoctor's SSHHost on ``alias``."""
    host = SSHHost(alias, ssh_config=str(site.config))
    try:
        result = host.run(["id", "-u"])
        return result.ok and result.stdout.strip() == "0", result.stderr
    except HostError as exc:
        return False, str(exc)
    finally:
        host.close()


def error_for(site: Site, alias: str) -> str:
    reached, message = gpudoctor_reaches(site, alias)
    assert not reached, f"{alias} was reached"
    assert "\n" not in message
    return message


@pytest.mark.parametrize("alias", sorted(REACHES))
def test_verdict_matches_openssh(site: Site, alias: str) -> None:
    """Cross-check: for each alias gpudoctor's verdict equals ``ssh -o BatchMode=yes``'s,
    and both equal the expected one (so a broken site cannot make them agree by accident)."""
    ssh_reached = site.ssh(alias).returncode == 0
    reached, message = gpudoctor_reaches(site, alias)
    assert (ssh_reached, reached) == (REACHES[alias], REACHES[alias]), message


def test_two_hop_chain_goes_through_both_bastions(site: Site) -> None:
    """ProxyJump b1,b2: the target is reached through b2, itself reached through b1 (both
    sshd logs show the forwarded connection)."""
    assert gpudoctor_reaches(site, "jump2")[0]
    b1_log = site.servers["b1"].log.read_text()
    b2_log = site.servers["b2"].log.read_text()
    # sshd (LogLevel DEBUG1) logs each direct-tcpip request: b1 -> b2, b2 -> target.
    assert f"target 127.0.0.1 port {site.servers['b2'].port}" in b1_log
    assert f"target 127.0.0.1 port {site.servers['t'].port}" in b2_log


def test_changed_key_behind_a_jump_host_is_refused(site: Site) -> None:
    """The attack: a man in the middle BEHIND the bastion (the bastion's own key is fine)
    answers for the target with another key. The jump host verifies, the target does not:
    refused, and the message names the target's CHANGED key."""
    message = error_for(site, "changed-behind-jump")
    assert "host key has CHANGED" in message
    assert f"[127.0.0.1]:{site.servers['t'].port}" in message
    assert "jump host" not in message


def test_changed_key_of_the_jump_host_is_refused(site: Site) -> None:
    """The attack: the bastion itself is impersonated; the chain stops at the first hop."""
    message = error_for(site, "jump-changed")
    assert message.startswith("jump host b1bad: ")
    assert "host key has CHANGED" in message


def test_host_key_alias_is_the_lookup_name(site: Site) -> None:
    """With HostKeyAlias the key is looked up (and advised) under the alias, not the
    address: the same server is unknown under another alias."""
    message = error_for(site, "alias-wrong")
    assert "for 'other.internal'" in message
    assert str(site.known_hosts["kh_alias"]) in message


def test_agent_only_key(site: Site) -> None:
    """The private key exists only in ssh-agent (its file was deleted after ssh-add);
    IdentityFile names the .pub, IdentitiesOnly picks it from the agent."""
    assert not (site.root / "agent_key").exists()
    assert gpudoctor_reaches(site, "agent")[0]
    message = error_for(site, "agent-off")
    assert "SSH authentication failed" in message


def test_user_certificate_from_certificate_file(site: Site) -> None:
    """The server trusts only a user CA (no authorized key): the CertificateFile (kept
    apart from the key) is what logs in; without it the login is refused."""
    assert not (site.root / "cert_key-cert.pub").exists()
    assert gpudoctor_reaches(site, "usercert")[0]
    assert "SSH authentication failed" in error_for(site, "usercert-missing")


def test_certificate_problems_are_named(site: Site) -> None:
    assert "expired" in error_for(site, "cert-expired")
    message = error_for(site, "cert-wrong-principal")
    assert "elsewhere.internal is not among its principals (127.0.0.1, t.internal)" in message


def test_changed_key_with_strict_checking_off_is_still_refused(site: Site) -> None:
    """Documented divergence: ``StrictHostKeyChecking no`` makes ssh go on past a CHANGED
    key (with a warning); gpudoctor, root on the host it reaches, refuses."""
    assert site.ssh("changed-no").returncode == 0
    message = error_for(site, "changed-no")
    assert "host key has CHANGED" in message


@pytest.mark.parametrize("hashed", [False, True])
def test_accept_new_saves_a_key_ssh_then_trusts(site: Site, tmp_path: Path, hashed: bool) -> None:
    """accept-new: gpudoctor saves the never-seen key in the first UserKnownHostsFile
    (hashed under HashKnownHosts yes); ssh in strict mode then accepts that very file
    (same format, same lookup name)."""
    known = tmp_path / "kh_new"
    config = tmp_path / "config"
    config.write_text(
        f"Host newbox\n  HostName 127.0.0.1\n  Port {site.servers['t'].port}\n"
        f"  UserKnownHostsFile {known} {site.known_hosts['kh_empty']}\n"
        f"  StrictHostKeyChecking accept-new\n  HashKnownHosts {'yes' if hashed else 'no'}\n"
        f"Include {site.config}\n"
    )
    host = SSHHost("newbox", ssh_config=str(config))
    with host:
        assert host.run(["true"]).ok
    saved = known.read_text()
    if hashed:
        assert saved.startswith("|1|") and f"{site.servers['t'].port}" not in saved
        assert saved.split(" ", 1)[1] == site.line("t").split(" ", 1)[1]
    else:
        assert saved == site.line("t")
    done = subprocess.run(
        [
            "ssh",
            "-F",
            str(config),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "newbox",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_cli_reaches_a_host_behind_two_bastions(site: Site, tmp_path: Path) -> None:
    """The whole path as a user runs it: ``gpudoctor check --host jump2`` with the site's
    config named by $GPUDOCTOR_SSH_CONFIG (``ssh -F``): the check runs on the target."""
    argv = [
        sys.executable,
        "-m",
        "gpudoctor",
        "check",
        "--host",
        "jump2",
        "--only",
        "shm.capacity",
        "--json",
    ]
    env = {**os.environ, "GPUDOCTOR_SSH_CONFIG": str(site.config)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode in (0, 3), done.stderr[-800:]
    report = json.loads(done.stdout)
    assert report["target"] == "jump2"
    (ran,) = report["checks"]
    assert ran["check"] == "shm.capacity"
    assert ran["status"] not in ("ERROR", "SKIP"), report
    refused = subprocess.run(
        [*argv[:5], "changed-behind-jump", *argv[6:]],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    assert "host key has CHANGED" in refused.stderr.strip().splitlines()[-1]


def proxies_running(config: Path) -> list[int]:
    """Return the pids of ``ssh -F CONFIG -W ...`` processes (ProxyCommand children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"-W" in argv and str(config).encode() in argv:
                found.append(int(entry.name))
    return found


def test_proxy_command_process_ends_with_the_connection(site: Site) -> None:
    """ProxyCommand (``ssh -W %h:%p b1``) carries the session while it is open and is
    stopped when the host is closed: no stray proxy per connection."""
    host = SSHHost("viacommand", ssh_config=str(site.config))
    try:
        assert host.run(["true"]).ok
        assert len(proxies_running(site.config)) == 1
    finally:
        host.close()
    assert proxies_running(site.config) == []
