"""known_hosts lines as OpenSSH reads them (gpudoctor/hosts/ssh/known_hosts.py): markers,
comments, base64, hashed entries that are malformed, wildcards, and the file an accepted
key is appended to."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from gpudoctor.hosts.ssh.known_hosts import (
    CA,
    PLAIN,
    REVOKED,
    append_key,
    hashed_name,
    lookup,
    match_host,
    parse_line,
)
from gpudoctor.hosts.ssh.matching import glob_match

BLOB = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519key").decode()


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        (f"pve1 ssh-ed25519 {BLOB}", (PLAIN, "pve1", "ssh-ed25519", base64.b64decode(BLOB))),
        (f"@cert-authority *.lab ssh-ed25519 {BLOB} ca", (CA, "*.lab", "ssh-ed25519", base64.b64decode(BLOB))),
        (f"@revoked * ssh-ed25519 {BLOB}", (REVOKED, "*", "ssh-ed25519", base64.b64decode(BLOB))),
        (f"@bogus pve1 ssh-ed25519 {BLOB}", None),  # an unknown marker: the line is skipped
        (f"# pve1 ssh-ed25519 {BLOB}", None),
        (f"#pve1 ssh-ed25519 {BLOB}", None),
        (f"pve1 #x {BLOB}", (PLAIN, "pve1", "#x", base64.b64decode(BLOB))),  # only field 1
        ("   ", None),
        ("", None),
        ("pve1 ssh-ed25519", None),
        (f"@revoked ssh-ed25519 {BLOB}", None),  # marker but too few fields
        ("pve1 ssh-ed25519 not*base64", None),
        ("pve1 ssh-ed25519 QUJD\x00", None),
    ],
)  # fmt: skip
def test_parse_line(line: str, parsed: tuple | None) -> None:
    assert parse_line(line) == parsed


def test_glob_match_is_openssh_wildcards_only() -> None:
    assert glob_match("pve1", "pve?")
    assert not glob_match("pve12", "pve?")
    assert not glob_match("pveX", "pve.") and glob_match("pve.", "pve.")
    assert glob_match("a\nb", "a?b") and glob_match("a\nb", "a*")  # any character
    assert glob_match("[h]:22", "[h]:*") and not glob_match("h", "[h]")
    assert not glob_match("XX", "?") and glob_match("", "*")


@pytest.mark.parametrize("entry", ["|1|", "|1|!!|!!", "|1|abc", f"|1|{BLOB}|{BLOB}|extra"])
def test_malformed_hashed_entries_match_nothing(entry: str) -> None:
    assert match_host(entry, "pve1") is False


def test_hashed_names_match_case_insensitively_and_only_their_name() -> None:
    salt = b"s" * 20
    entry = hashed_name("PVE1", salt)
    assert entry == hashed_name("pve1", salt) and entry.startswith("|1|")
    assert base64.b64decode(entry.split("|")[2]) == salt
    assert match_host(entry, "Pve1") and not match_host(entry, "pve2")
    fresh = hashed_name("pve1")
    assert len(base64.b64decode(fresh.split("|")[2])) == 20 and fresh != hashed_name("pve1")


def test_lookup_reads_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "kh"
    path.write_bytes(b"\xff\xfe junk\n" + f"pve1 ssh-ed25519 {BLOB}\n".encode())
    found = lookup("pve1", [str(path)])
    assert found.name == "pve1" and found.files == (str(path),)
    assert [(k.marker, k.source) for k in found.plain] == [(PLAIN, f"{path}:2")]


def test_append_key_makes_a_private_file_and_directory(tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "known_hosts"
    append_key(str(path), "pve1", "ssh-ed25519", BLOB)
    append_key(str(path), "pve2", "ssh-ed25519", BLOB, hashed=True)
    lines = path.read_text().splitlines()
    assert lines[0] == f"pve1 ssh-ed25519 {BLOB}"
    name, kind, b64 = lines[1].split()
    assert (
        name.startswith("|1|") and match_host(name, "pve2") and (kind, b64) == ("ssh-ed25519", BLOB)
    )
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    append_key(os.devnull, "pve1", "ssh-ed25519", BLOB)  # UserKnownHostsFile /dev/null
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
