"""``RevokedHostKeys`` files at their edges, judged by :func:`revoked_by_file` beside
``ssh-keygen -Q`` (OpenSSH's own check) on the same real keys and certificates: security-key
(``sk-``) host certificates, serials above 2^63, and the one-line reason a user reads when
the file cannot be read (ssh refuses the connection then, and so does gpudoctor)."""

from __future__ import annotations

import base64
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from gpudoctor.hosts.ssh.certificates import parse_certificate
from gpudoctor.hosts.ssh.revoked import RevocationError, revoked_by_file
from gpudoctor.hosts.ssh.wire import string

pytestmark = pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="needs ssh-keygen")

# The P-256 base point: a valid public point for an sk-ecdsa key nobody holds (two such
# keys differ in their application string).
P256_POINT = bytes.fromhex(
    "046b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c2"
    "964fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5"
)
HEADER = b"SSHKRL\n\0" + struct.pack(">IQQQ", 1, 1, 0, 0) + string(b"") + string(b"")


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, capture_output=True)  # fmt: skip
    return path


def sign(ca: Path, pub: Path, serial: int) -> Path:
    """Return the host certificate ``ssh-keygen -s CA -h -z SERIAL`` makes of ``pub``."""
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-h", "-I", pub.stem, "-n", "h",
                    "-z", str(serial), str(pub)], check=True, capture_output=True)  # fmt: skip
    return pub.with_name(f"{pub.stem}-cert.pub")


def blob(pub: Path) -> bytes:
    return base64.b64decode(pub.read_text().split()[1])


def revoked_says(krl: Path, files: list[Path]) -> dict[str, bool]:
    """Return ``ssh-keygen -Q``'s verdict per file name (True: REVOKED)."""
    done = subprocess.run(["ssh-keygen", "-Q", "-f", str(krl), *map(str, files)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return {
        Path(line.rpartition(": ")[0].split(" (")[0]).name: line.endswith(": REVOKED")
        for line in done.stdout.splitlines()
    }


def security_key(path: Path, kind: str) -> Path:
    """Write the public half of a FIDO (``sk-``) key of ``kind``: the key material is real
    (a valid curve point), the token that would hold the private half does not exist here,
    and none is needed to certify or revoke the public key."""
    if kind == "sk-ssh-ed25519@openssh.com":
        fields = string(os.urandom(32))
    else:
        fields = string(b"nistp256") + string(P256_POINT)
    key = string(kind.encode()) + fields + string(f"ssh:{path.stem}".encode())  # application
    path.write_text(f"{kind} {base64.b64encode(key).decode()} {path.stem}\n")
    return path


@pytest.mark.parametrize(
    "kind", ["sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"]
)
def test_a_revoked_security_key_revokes_its_host_certificate(tmp_path: Path, kind: str) -> None:
    """A host whose FIDO key is revoked must not get in with a certificate of that key:
    the key list and a KRL of the key both revoke the certificate, as ``ssh-keygen -Q``."""
    ca = keygen(tmp_path / "ca")
    pub = security_key(tmp_path / "hostsk.pub", kind)
    other = security_key(tmp_path / "othersk.pub", kind)
    cert = sign(ca, pub, 7)
    other_cert = sign(ca, other, 8)
    listed = tmp_path / "revoked_keys"
    listed.write_text(f"# retired token\n{pub.read_text()}")
    assert revoked_by_file(str(listed), blob(cert)) == "the key is listed (line 2)"
    assert revoked_by_file(str(listed), blob(other_cert)) is None
    krl = tmp_path / "krl"
    subprocess.run(["ssh-keygen", "-q", "-k", "-f", str(krl), str(pub)], check=True,
                   capture_output=True)  # fmt: skip
    expected = revoked_says(krl, [cert, other_cert])
    assert expected == {cert.name: True, other_cert.name: False}
    assert revoked_by_file(str(krl), blob(cert)) == "the key is revoked (the key itself)"
    assert revoked_by_file(str(krl), blob(other_cert)) is None


def test_serials_above_two_to_the_63_are_revoked_as_ssh_revokes_them(tmp_path: Path) -> None:
    """Serials are unsigned 64-bit numbers: a CA that numbers from the top is revoked by
    them (read as signed, 2^64-1 would be -1 and nothing would be revoked)."""
    ca = keygen(tmp_path / "ca")
    top, high, low = 2**64 - 1, 2**63 + 5, 2**63 - 1
    certs = {n: sign(ca, Path(f"{keygen(tmp_path / f'h{i}')}.pub"), n)
             for i, n in enumerate((top, high, low))}  # fmt: skip
    spec, krl = tmp_path / "spec", tmp_path / "krl"
    spec.write_text(f"serial: {top}\nserial: {high}-{high + 2}\n")
    subprocess.run(["ssh-keygen", "-q", "-k", "-f", str(krl), "-s", f"{ca}.pub", str(spec)],
                   check=True, capture_output=True)  # fmt: skip
    expected = revoked_says(krl, list(certs.values()))
    assert expected == {certs[top].name: True, certs[high].name: True, certs[low].name: False}
    got = {
        n: revoked_by_file(str(krl), blob(c), parse_certificate(blob(c))) for n, c in certs.items()
    }
    assert got == {
        top: f"the certificate is revoked (serial {top}, for its CA)",
        high: f"the certificate is revoked (serial {high}, for its CA)",
        low: None,
    }


KEY = string(b"ssh-ed25519") + string(b"k" * 32)


def krl_of(ca_pub: Path, sub_kind: int, sub_body: bytes, comment: bytes = b"") -> bytes:
    """A KRL of one certificate section for the CA ``ca_pub`` holding one subsection."""
    section = string(blob(ca_pub)) + string(b"") + bytes([sub_kind]) + string(sub_body)
    return HEADER[:-4] + string(comment) + b"\1" + string(section)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("truncated", "malformed KRL: truncated: 55 bytes wanted, 51 left"),
        ("length-past-2^31", "malformed KRL: truncated: 4294967295 bytes wanted, 0 left"),
        ("version-past-2^31", "unsupported KRL format version 2147483649"),
        ("trailing", "malformed KRL: 2 bytes of unparsed data after KRL certificate section 0x21"),
        ("nul-in-comment", "malformed KRL: a NUL byte inside a text field"),
        ("nul-in-key-id", "malformed KRL: a NUL byte inside a text field"),
    ],
)
def test_an_unreadable_krl_refuses_with_the_reason(
    tmp_path: Path, damage: str, reason: str
) -> None:
    """A KRL ``ssh-keygen -Q`` cannot read either: the reason the user reads says what is
    wrong in it (the connection is refused, as ssh refuses it)."""
    ca_pub = Path(f"{keygen(tmp_path / 'ca')}.pub")
    bodies = {
        "truncated": HEADER + b"\2" + string(string(KEY))[:-4],
        "length-past-2^31": HEADER + b"\2" + b"\xff\xff\xff\xff",
        "version-past-2^31": HEADER.replace(struct.pack(">I", 1), struct.pack(">I", 2**31 + 1), 1),
        "trailing": krl_of(ca_pub, 0x21, struct.pack(">QQ", 5, 9) + b"zz"),
        "nul-in-comment": krl_of(ca_pub, 0x23, string(b"id"), comment=b"a\0b"),
        "nul-in-key-id": krl_of(ca_pub, 0x23, string(b"big\0id")),
    }
    path = tmp_path / "revoked"
    path.write_bytes(bodies[damage])
    pub = Path(f"{keygen(tmp_path / 'host')}.pub")
    done = subprocess.run(["ssh-keygen", "-Q", "-f", str(path), str(pub)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode not in (0, 1), done  # ssh-keygen cannot read it either
    with pytest.raises(RevocationError) as caught:
        revoked_by_file(str(path), blob(pub))
    assert str(caught.value) == reason


def test_a_krl_with_text_that_is_not_utf8_is_read_as_ssh_reads_it(tmp_path: Path) -> None:
    """OpenSSH reads a KRL's comment and key ids as bytes (``sshbuf_get_cstring``): a
    Latin-1 comment or key id must not make gpudoctor refuse every host ssh lets in."""
    ca = keygen(tmp_path / "ca")
    cert = sign(ca, Path(f"{keygen(tmp_path / 'big')}.pub"), 3)
    other = sign(ca, Path(f"{keygen(tmp_path / 'small')}.pub"), 4)
    ids = string(b"caf\xe9") + string(b"big")
    path = tmp_path / "krl"
    path.write_bytes(krl_of(Path(f"{ca}.pub"), 0x23, ids, comment=b"r\xe9voqu\xe9"))
    assert revoked_says(path, [cert, other]) == {cert.name: True, other.name: False}
    got = [revoked_by_file(str(path), blob(c), parse_certificate(blob(c))) for c in (cert, other)]
    assert got == ["the certificate is revoked (key id 'big', for its CA)", None]


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        (string(b"ssh-xmss-cert-v01@openssh.com") + string(b"n"),
         "unsupported certificate type ssh-xmss-cert-v01@openssh.com"),
        (string(b"\xffssh-ed25519") + string(b"k" * 32),
         "a text field is not UTF-8: 'utf-8' codec can't decode byte 0xff in position 0:"
         " invalid start byte"),
    ],
)  # fmt: skip
def test_a_key_list_line_that_is_not_a_key_refuses_with_the_reason(
    tmp_path: Path, key: bytes, reason: str
) -> None:
    """A list of revoked keys with a line ssh cannot read refuses the connection (ssh:
    "Error checking host key ... in revoked keys file"); the reason names the line."""
    path = tmp_path / "revoked_keys"
    path.write_bytes(b"# retired\nssh-xmss-cert-v01@openssh.com " + base64.b64encode(key) + b"\n")
    with pytest.raises(RevocationError) as caught:
        revoked_by_file(str(path), KEY)
    assert str(caught.value) == f"line 2 is not a public key ({reason})"
