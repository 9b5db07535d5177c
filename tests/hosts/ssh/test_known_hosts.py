"""known_hosts parsing and host-certificate checks, on files and certificates made by the
real ``ssh-keygen`` (``-H`` hashes names, ``-s`` signs keys); no server needed."""

from __future__ import annotations

import locale
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from gpudoctor.hosts.ssh.certificates import check_host_certificate, parse_certificate
from gpudoctor.hosts.ssh.known_hosts import append_key, hashed_name, lookup, match_host
from gpudoctor.hosts.ssh.trust import host_key_order


def keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def pub(path: Path) -> str:
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


@pytest.mark.parametrize(
    ("patterns", "name", "expected"),
    [
        ("pve1,pve2", "pve2", True),
        ("PVE1", "pve1", True),
        ("*.site1,!bad.site1", "good.site1", True),
        ("*.site1,!bad.site1", "bad.site1", False),
        ("[127.0.0.1]:*", "[127.0.0.1]:2222", True),
        ("[127.0.0.1]:*", "127.0.0.1", False),
        ("pve?", "pve12", False),
        ("1.2.3.4", "1x2x3x4", False),
    ],
)
def test_match_host(patterns: str, name: str, expected: bool) -> None:
    assert match_host(patterns, name) is expected


def test_hashed_names_written_by_ssh_keygen_match(tmp_path: Path) -> None:
    key = keygen(tmp_path / "k")
    known = tmp_path / "known_hosts"
    known.write_text(f"[10.0.0.5]:2222 {pub(key)}\npve1 {pub(key)}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    assert "pve1" not in known.read_text()
    assert len(lookup("[10.0.0.5]:2222", [str(known)]).plain) == 1
    assert len(lookup("pve1", [str(known)]).plain) == 1
    assert lookup("pve2", [str(known)]).plain == ()
    assert match_host(hashed_name("PvE1"), "pve1")


SALT = bytes(range(20))
GOOD = hashed_name("pve1", SALT)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (GOOD, True),
        (GOOD + "|", False),  # a stray delimiter after the hash
        (GOOD[:-2] + "!" + GOOD[-2:], False),  # a character base64 does not use
        (GOOD.replace("=|", "=||"), False),  # an empty field between salt and hash
        (hashed_name("pve1", SALT[:16]), False),  # a salt that is not 20 bytes (SHA-1's)
        (hashed_name("pve1", SALT + SALT), False),
        (GOOD.rstrip("="), False),  # the hash without its padding
    ],
)
def test_hashed_entries_match_exactly_as_ssh_keygen_finds_them(
    tmp_path: Path, entry: str, expected: bool
) -> None:
    """A hashed known_hosts name matches only when OpenSSH's own lookup (``ssh-keygen -F``)
    matches it: gpudoctor must not trust a host key from a line ssh ignores."""
    key = keygen(tmp_path / "k")
    known = tmp_path / "known_hosts"
    known.write_text(f"{entry} {pub(key)}\n")
    found = subprocess.run(
        ["ssh-keygen", "-F", "pve1", "-f", str(known)], capture_output=True, check=False
    )
    assert (found.returncode == 0) is expected
    assert match_host(entry, "pve1") is expected
    assert len(lookup("pve1", [str(known)]).plain) == int(expected)


@pytest.fixture
def ascii_locale() -> Iterator[None]:
    """The C locale's ASCII codeset, as Python sees it under LANG=C without UTF-8 mode."""
    saved = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)


@pytest.mark.parametrize("hashed", [False, True])
def test_a_non_ascii_host_name_is_saved_and_found_as_utf8_in_any_locale(
    tmp_path: Path, ascii_locale: None, hashed: bool
) -> None:
    """`--accept-new-host-key` for a host known as `grüne` (a HostKeyAlias, say) writes
    its UTF-8 bytes, as ssh does; the next run finds the key again, and so does
    ``ssh-keygen -F``, even where the locale's codeset is ASCII."""
    key = keygen(tmp_path / "k")
    known = tmp_path / "known_hosts"
    append_key(str(known), "grüne", *pub(key).split(), hashed=hashed)
    assert ("grüne".encode() in known.read_bytes()) is not hashed
    found = lookup("grüne", [str(known)])
    assert [k.key_type for k in found.plain] == ["ssh-ed25519"]
    search = subprocess.run(
        ["ssh-keygen", "-F", "grüne", "-f", str(known)], capture_output=True, check=False
    )
    assert search.returncode == 0, search.stderr


def test_lookup_reads_every_file_and_marker(tmp_path: Path) -> None:
    host, ca, old = keygen(tmp_path / "host"), keygen(tmp_path / "ca"), keygen(tmp_path / "old")
    first, second = tmp_path / "kh1", tmp_path / "kh2"
    first.write_text(f"# comment\n\ngarbage line\npve1 {pub(host)}\n")
    second.write_text(f"@cert-authority *.site1,pve1 {pub(ca)}\n@revoked * {pub(old)}\n")
    found = lookup("pve1", [str(first), str(tmp_path / "missing"), str(second)])
    assert [k.source for k in found.plain] == [f"{first}:4"]
    assert len(found.authorities) == 1 and len(found.revoked) == 1
    assert found.files == (str(first), str(second))
    old_key = paramiko.PKey.from_path(str(old))
    assert found.is_revoked(old_key.asbytes())
    assert found.plain[0].pkey().asbytes() == paramiko.PKey.from_path(str(host)).asbytes()


def test_host_key_order_prefers_what_is_known(tmp_path: Path) -> None:
    """As OpenSSH: CA known -> certificate algorithms first; else the known key's type."""
    known = tmp_path / "kh"
    ecdsa = tmp_path / "e"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(ecdsa)],
        check=True,
        capture_output=True,
    )
    known.write_text(f"pve1 {pub(ecdsa)}\n")
    offered = (
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
        "rsa-sha2-512",
        "ssh-ed25519-cert-v01@openssh.com",
    )
    order = host_key_order(lookup("pve1", [str(known)]), offered)
    assert order == ("ecdsa-sha2-nistp256", "ssh-ed25519", "rsa-sha2-512")
    ca = keygen(tmp_path / "ca")
    known.write_text(f"@cert-authority pve1 {pub(ca)}\n")
    order = host_key_order(lookup("pve1", [str(known)]), offered)
    assert order[0].endswith("-cert-v01@openssh.com") and "ssh-ed25519" in order


def make_cert(tmp_path: Path, *args: str) -> tuple[bytes, paramiko.PKey]:
    """Return (certificate blob, CA key) for a fresh host key signed with ``args``."""
    host, ca = keygen(tmp_path / "host"), keygen(tmp_path / "ca")
    subprocess.run(
        ["ssh-keygen", "-q", "-s", str(ca), "-I", "lab", *args, str(host) + ".pub"],
        check=True,
        capture_output=True,
    )
    blob = paramiko.PublicBlob.from_file(str(host) + "-cert.pub").key_blob
    return blob, public(ca)


def public(path: Path) -> paramiko.PKey:
    """Return the public key beside ``path`` (as known_hosts gives a CA: public only)."""
    blob = paramiko.PublicBlob.from_file(str(path) + ".pub")
    return paramiko.PKey.from_type_string(blob.key_type, blob.key_blob)


def test_valid_host_certificate(tmp_path: Path) -> None:
    blob, ca = make_cert(tmp_path, "-h", "-n", "pve1,*.site1", "-V", "-5m:+1h")
    cert = parse_certificate(blob)
    assert (cert.cert_type, cert.key_id, cert.principals) == (2, "lab", ("pve1", "*.site1"))
    assert check_host_certificate(cert, "pve1", [ca]) is None
    assert check_host_certificate(cert, "node7.site1", [ca]) is None
    assert "not among its principals" in check_host_certificate(cert, "pve2", [ca])
    assert "expired" in check_host_certificate(cert, "pve1", [ca], now=time.time() + 7200)
    assert "not valid yet" in check_host_certificate(cert, "pve1", [ca], now=time.time() - 3600)


def test_certificate_refusals(tmp_path: Path) -> None:
    """The attacks: a cert signed by another CA, a tampered cert, a USER cert shown as a
    host cert, a cert with no principal (valid for any host in OpenSSH) - all refused."""
    blob, ca = make_cert(tmp_path, "-h", "-n", "pve1")
    other = public(keygen(tmp_path / "other_ca"))
    assert "not a @cert-authority" in check_host_certificate(
        parse_certificate(blob), "pve1", [other]
    )
    tampered = blob.replace(b"pve1", b"pve2")
    reason = check_host_certificate(parse_certificate(tampered), "pve2", [ca])
    assert reason == "its CA signature does not verify"
    for sub in ("u", "n"):
        (tmp_path / sub).mkdir()
    user_blob, user_ca = make_cert(tmp_path / "u", "-n", "pve1")
    assert "user certificate" in check_host_certificate(
        parse_certificate(user_blob), "pve1", [user_ca]
    )
    any_blob, any_ca = make_cert(tmp_path / "n", "-h")
    assert "names no principal" in check_host_certificate(
        parse_certificate(any_blob), "pve1", [any_ca]
    )
