"""Revoked host keys, decided as ``ssh -o BatchMode=yes`` decides them, against a real
OpenSSH server on 127.0.0.1 whose host key carries a CA's certificate (serial 42, key id
``lab-host-42``, made by ``ssh-keygen -s``). Every case writes its own ssh_config and
known_hosts; revocation lists are made by the real ``ssh-keygen -k``. The verdict of the
real ``ssh`` client is asserted beside gpudoctor's, so a case can only pass when both
agree. The real ~/.ssh is never used."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.host import SSHHost
from tests.lab.ssh_site import pub
from tests.lab.sshd import SSHD, LabSSHD, keygen

pytestmark = pytest.mark.lab

SERIAL, KEY_ID = 42, "lab-host-42"


class Server:
    """The certified server, its CA, a stranger key and a per-case file writer."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.ca = keygen(root / "ca", "lab-ca")
        self.other_ca = keygen(root / "other_ca", "other-ca")
        self.stranger = keygen(root / "stranger", "stranger")
        self.sshd = LabSSHD(root / "sshd", None, host_ca=self.ca, principals="127.0.0.1",
                            cert_serial=SERIAL, cert_key_id=KEY_ID)  # fmt: skip
        self.cases = 0

    @property
    def host_pub(self) -> Path:
        return self.sshd.host_key.with_suffix(".pub")

    def host_line(self, pattern: str | None = None) -> str:
        kind, b64 = pub(self.sshd.host_key)
        return f"{pattern or f'[127.0.0.1]:{self.sshd.port}'} {kind} {b64}\n"

    def ca_line(self, marker: str = "@cert-authority", pattern: str = "[127.0.0.1]:*") -> str:
        kind, b64 = pub(self.ca)
        return f"{marker} {pattern} {kind} {b64}\n"

    def case(self, known_hosts: str, revoked: Path | str | None = None, alias: str = "t") -> Path:
        """Write a known_hosts file and an ssh_config for alias ``alias`` (``*``: any name
        reaches the server's port); return the config's path."""
        self.cases += 1
        folder = self.root / f"case{self.cases}"
        folder.mkdir()
        (folder / "known_hosts").write_text(known_hosts)
        lines = [
            f"Host {alias}",
            *(["  HostName 127.0.0.1"] if alias != "*" else []),
            f"  Port {self.sshd.port}",
            "Host *",
            "  User root",
            f"  IdentityFile {self.sshd.client_key}",
            "  IdentitiesOnly yes",
            "  IdentityAgent none",
            "  BatchMode yes",
            "  StrictHostKeyChecking yes",
            f"  UserKnownHostsFile {folder / 'known_hosts'}",
            "  GlobalKnownHostsFile /dev/null",
            *([f"  RevokedHostKeys {revoked}"] if revoked is not None else []),
            "",
        ]
        config = folder / "ssh_config"
        config.write_text("\n".join(lines))
        return config

    def krl(self, *spec_lines: str, ca: bool = True) -> Path:
        """Return a KRL made by ``ssh-keygen -k [-s CA.pub]`` from a spec file."""
        self.cases += 1
        spec, out = self.root / f"spec{self.cases}", self.root / f"krl{self.cases}"
        spec.write_text("".join(line + "\n" for line in spec_lines))
        subprocess.run(
            ["ssh-keygen", "-q", "-k", "-f", str(out),
             *(["-s", f"{self.ca}.pub"] if ca else []), str(spec)],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from tests.conftest import lab_unavailable

    missing = [t for t in ("ssh", "ssh-keygen") if not shutil.which(t)]
    if os.geteuid() != 0 or not os.path.exists(SSHD) or missing:
        lab_unavailable(f"revocation tests need root, {SSHD} and {missing or 'the ssh client'}")
    made = Server(tmp_path_factory.mktemp("ssh-revocation"))
    try:
        made.sshd.start()
        made.sshd.authorize(made.sshd.client_key.with_suffix(".pub"))
    except Exception as exc:
        made.sshd.stop()
        lab_unavailable(f"the lab sshd cannot start: {exc}")
    yield made
    made.sshd.stop()


def verdicts(config: Path, alias: str = "t") -> tuple[bool, bool, str]:
    """Return (ssh reached, gpudoctor reached, gpudoctor's error) for ``alias``."""
    ssh = subprocess.run(
        ["ssh", "-F", str(config), alias, "true"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    host = SSHHost(alias, ssh_config=str(config))
    try:
        result = host.run(["id", "-u"])
        ours, error = result.ok and result.stdout.strip() == "0", result.stderr
    except HostError as exc:
        ours, error = False, str(exc)
    finally:
        host.close()
    return ssh.returncode == 0, ours, error


def test_certificate_of_a_ca_marked_revoked_is_refused(server: Server) -> None:
    """Attack: a host CA whose key leaked is marked `@revoked` in known_hosts, but its
    `@cert-authority` line is still there (another file, or not yet cleaned up); the
    holder of the stolen CA key signs a certificate for the host and impersonates it.
    OpenSSH refuses ("host key ... was revoked"); gpudoctor must too."""
    config = server.case(server.ca_line() + server.ca_line("@revoked", "*"))
    ssh_ok, ours, error = verdicts(config)
    assert not ssh_ok
    assert not ours
    assert "@revoked" in error and "CA" in error and KEY_ID in error, error


def test_certificate_with_its_ca_trusted_is_accepted(server: Server) -> None:
    """The control: the same certificate with its CA trusted works when only an unrelated
    key is revoked."""
    kind, b64 = pub(server.stranger)
    config = server.case(server.ca_line() + f"@revoked * {kind} {b64}\n")
    ssh_ok, ours, error = verdicts(config)
    assert ssh_ok and ours, error


def test_plain_host_key_marked_revoked_is_refused(server: Server) -> None:
    """Attack: the host key was stolen, the admin marked it `@revoked`, but the old plain
    line is still in known_hosts; whoever holds the stolen key answers for the host."""
    config = server.case(server.host_line() + server.host_line("@revoked *"))
    ssh_ok, ours, error = verdicts(config)
    assert not ssh_ok
    assert not ours
    assert "@revoked" in error, error


def test_revoked_line_for_another_host_pattern_is_applied_anyway(server: Server) -> None:
    """Pinned divergence. OpenSSH (hostfile.c, load_hostkeys with HKF_WANT_MATCH) loads an
    @revoked line like every line, only when its pattern matches the host, so ssh
    reaches a host whose key is `@revoked other.example`. gpudoctor refuses it (stricter
    on purpose, docs/architecture.md: a revoked key shown by any host is refused) and says
    that ssh would not."""
    config = server.case(server.host_line() + server.host_line("@revoked other.example"))
    ssh_ok, ours, error = verdicts(config)
    assert ssh_ok, "OpenSSH ignores an @revoked line whose pattern does not match"
    assert not ours
    assert "for other hosts" in error and "ssh would not" in error, error


def test_upper_case_host_name_matches_a_hashed_entry(server: Server, tmp_path: Path) -> None:
    """OpenSSH lowercases the host name before hashing it (sshconnect.c: "Convert the
    user-supplied hostname into all lowercase"); an entry hashed by `ssh-keygen -H`
    matches `LOCALHOST` as it matches `localhost`."""
    known = tmp_path / "known_hosts"
    known.write_text(server.host_line(f"[localhost]:{server.sshd.port}"))
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True,
                   capture_output=True, timeout=30)  # fmt: skip
    assert known.read_text().startswith("|1|")
    config = server.case(known.read_text(), alias="*")
    ssh_ok, ours, error = verdicts(config, "LOCALHOST")
    assert ssh_ok, "ssh matches the hashed entry"
    assert ours, error


# -- RevokedHostKeys ---------------------------------------------------------------------


def test_revoked_host_keys_plain_list_revokes_the_host_key(server: Server) -> None:
    """Attack: the host key was revoked site-wide through `RevokedHostKeys` in ssh_config
    (a list of public keys); gpudoctor never read that file and trusted the stolen key."""
    listed = server.root / "revoked-list"
    listed.write_text("# revoked keys\n\n" + server.host_pub.read_text())
    config = server.case(server.host_line(), listed)
    ssh_ok, ours, error = verdicts(config)
    assert not ssh_ok
    assert not ours
    assert "RevokedHostKeys" in error and "revoked" in error, error


def test_revoked_host_keys_plain_list_revokes_the_ca(server: Server) -> None:
    """Attack: a leaked host CA is listed in RevokedHostKeys; a certificate it signs must
    not be accepted through a still-present @cert-authority line."""
    listed = server.root / "revoked-ca-list"
    listed.write_text(server.stranger.with_suffix(".pub").read_text()
                      + Path(f"{server.ca}.pub").read_text())  # fmt: skip
    config = server.case(server.ca_line(), listed)
    ssh_ok, ours, error = verdicts(config)
    assert not ssh_ok
    assert not ours and "CA key is listed" in error, error


@pytest.mark.parametrize(
    ("shape", "mode", "revoked"),
    [
        ("key", "plain", True),
        ("sha1", "plain", True),
        ("sha256", "plain", True),
        ("hash", "plain", True),
        ("serial", "cert", True),
        ("serial-range", "cert", True),
        ("serial-bitmap", "cert", True),
        ("id", "cert", True),
        ("ca-key", "cert", True),
        ("other-serials", "cert", False),
        ("other-key", "plain", False),
    ],
)
def test_revoked_host_keys_krl(server: Server, shape: str, mode: str, revoked: bool) -> None:
    """Attack: the host key (or its certificate, or its CA) is revoked by a binary KRL
    (`ssh-keygen -k`) named in RevokedHostKeys; gpudoctor ignored it. Each section type
    ssh-keygen writes is exercised, and a KRL that revokes something else lets the host
    through, as in ssh."""
    host_pub = server.host_pub.read_text().strip()
    fingerprint = subprocess.run(["ssh-keygen", "-l", "-f", str(server.host_pub)],
                                 capture_output=True, text=True, check=True).stdout.split()[1]  # fmt: skip
    specs = {
        "key": ([f"key: {host_pub}"], False),
        "sha1": ([f"sha1: {host_pub}"], False),
        "sha256": ([f"sha256: {host_pub}"], False),
        "hash": ([f"hash: {fingerprint}"], False),
        "serial": ([f"serial: {SERIAL}"], True),
        "serial-range": (["serial: 40-50"], True),
        "serial-bitmap": ([f"serial: {n}" for n in (3, 9, 17, 30, SERIAL, 60)], True),
        "id": ([f"id: {KEY_ID}"], True),
        "ca-key": ([f"key: {Path(f'{server.ca}.pub').read_text().strip()}"], False),
        "other-serials": (["serial: 1-41", "serial: 43"], True),
        "other-key": ([f"key: {server.stranger.with_suffix('.pub').read_text().strip()}"], False),
    }
    lines, with_ca = specs[shape]
    krl = server.krl(*lines, ca=with_ca)
    assert krl.read_bytes().startswith(b"SSHKRL\n\0")
    trust = server.host_line() if mode == "plain" else server.ca_line()
    config = server.case(trust, krl)
    ssh_ok, ours, error = verdicts(config)
    assert ssh_ok is not revoked, f"ssh's verdict for {shape}"
    assert ours is not revoked, error
    if revoked:
        assert f"RevokedHostKeys {krl}" in error, error


@pytest.mark.parametrize("problem", ["missing", "garbage", "truncated-krl"])
def test_unreadable_revoked_host_keys_refuses(server: Server, problem: str) -> None:
    """Attack: a revocation list that cannot be read (deleted, corrupted, cut short by a
    failed copy) silently revoked nothing. OpenSSH refuses to connect then; so does
    gpudoctor, with one line naming the file."""
    path = server.root / f"unreadable-{problem}"
    if problem == "garbage":
        path.write_text("this is not a key\n")
    elif problem == "truncated-krl":
        path.write_bytes(server.krl(f"id: {KEY_ID}").read_bytes()[:-3])
    config = server.case(server.host_line(), path)
    ssh_ok, ours, error = verdicts(config)
    assert not ssh_ok
    assert not ours
    assert f"cannot check the host key against RevokedHostKeys {path}" in error, error
    assert "\n" not in error
