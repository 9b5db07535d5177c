"""Each KRL section and each ``RevokedHostKeys`` key-list line at its edges, read by
:func:`revoked_by_file` beside ``ssh-keygen -Q`` (OpenSSH 9.2 here): the exact reason a
user reads for a revoked key or certificate, and for a file that cannot be read. KRLs
``ssh-keygen -k`` writes are made by it; the sections it never writes (ranges that start at
0, bitmaps at their limits, extensions, a signature) are built from PROTOCOL.krl."""

from __future__ import annotations

import base64
import shutil
import struct
import subprocess
from pathlib import Path

import paramiko
import pytest

from gpudoctor.hosts.ssh.certificates import parse_certificate
from gpudoctor.hosts.ssh.revoked import MAX_BYTES, RevocationError, revoked_by_file
from gpudoctor.hosts.ssh.wire import string

pytestmark = pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="needs ssh-keygen")

HEADER = b"SSHKRL\n\0" + struct.pack(">IQQQ", 1, 1, 0, 0) + string(b"") + string(b"")


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True, capture_output=True)  # fmt: skip
    return path


def blob(path: Path) -> bytes:
    """Return the key blob of the public key or certificate file ``path``."""
    return base64.b64decode(path.read_text().split()[1])


def sign(ca: Path, name: str, serial: int, root: Path) -> Path:
    host = keygen(root / name)
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-h", "-I", f"id-{name}", "-n", "h",
                    "-z", str(serial), f"{host}.pub"], check=True, capture_output=True)  # fmt: skip
    return Path(f"{host}-cert.pub")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two CAs; certificates ``{ca}-{serial}`` of serials 1, 5, 6 and 2^64-1; a plain key."""
    root = tmp_path_factory.mktemp("pki")
    found = {"root": root, "ca1": keygen(root / "ca1"), "ca2": keygen(root / "ca2")}
    for ca in ("ca1", "ca2"):
        for serial in (1, 5, 6, 2**64 - 1):
            found[f"{ca}-{serial}"] = sign(found[ca], f"{ca}-{serial}", serial, root)
    found["plain"] = Path(f"{keygen(root / 'plain')}.pub")
    return found


def judge(path: Path, cert: Path) -> str | None:
    data = blob(cert)
    return revoked_by_file(
        str(path), data, parse_certificate(data) if "-cert" in cert.name else None
    )


def ssh_says(krl: Path, files: list[Path]) -> list[bool]:
    """``ssh-keygen -Q``'s verdict per file (True: REVOKED); fails when it cannot read."""
    done = subprocess.run(["ssh-keygen", "-Q", "-f", str(krl), *map(str, files)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return [line.endswith(": REVOKED") for line in done.stdout.splitlines()]


def keygen_krl(path: Path, spec: str, ca: Path | None = None, update: bool = False) -> Path:
    (spec_file := path.with_suffix(".spec")).write_text(spec)
    argv = ["ssh-keygen", "-q", "-k", *(["-u"] if update else []), "-f", str(path)]
    argv += ["-s", f"{ca}.pub"] if ca else []
    subprocess.run([*argv, str(spec_file)], check=True, capture_output=True)
    return path


@pytest.mark.parametrize(
    ("form", "reason"),
    [("key", "the key itself"), ("sha1", "its SHA1 fingerprint"),
     ("sha256", "its SHA256 fingerprint"), ("hash", "its SHA256 fingerprint")],
)  # fmt: skip
def test_a_revoked_key_names_how_the_krl_lists_it(
    pki: dict[str, Path], tmp_path: Path, form: str, reason: str
) -> None:
    plain, ca_pub = pki["plain"], Path(f"{pki['ca1']}.pub")
    if form == "hash":
        lines = [subprocess.run(["ssh-keygen", "-lf", str(p)], capture_output=True, text=True,
                                check=True).stdout.split()[1] for p in (plain, ca_pub)]  # fmt: skip
        spec = "".join(f"hash: {fp}\n" for fp in lines)
    else:
        spec = f"{form}: {plain.read_text()}{form}: {ca_pub.read_text()}"
    krl = keygen_krl(tmp_path / "krl", spec)
    cert, other = pki["ca1-5"], pki["ca2-5"]
    assert ssh_says(krl, [plain, cert, other]) == [True, True, False]
    assert judge(krl, plain) == f"the key is revoked ({reason})"
    assert judge(krl, cert) == f"the certificate's CA key is revoked ({reason})"
    assert judge(krl, other) is None


def test_each_ca_section_revokes_only_that_cas_certificates(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    krl = keygen_krl(tmp_path / "krl", "serial: 5\n", pki["ca1"])
    keygen_krl(krl, "serial: 6\nid: id-ca2-1\n", pki["ca2"], update=True)
    names = ["ca1-1", "ca1-5", "ca1-6", "ca2-1", "ca2-5", "ca2-6"]
    assert ssh_says(krl, [pki[n] for n in names]) == [False, True, False, True, False, True]
    assert [judge(krl, pki[n]) for n in names] == [
        None,
        "the certificate is revoked (serial 5, for its CA)",
        None,
        "the certificate is revoked (key id 'id-ca2-1', for its CA)",
        None,
        "the certificate is revoked (serial 6, for its CA)",
    ]


def test_a_key_id_revoked_for_any_ca_says_so(pki: dict[str, Path], tmp_path: Path) -> None:
    """A certificate section with an empty CA key (ssh-keygen cannot write one)."""
    section = string(b"") + string(b"") + bytes([0x23]) + string(string(b"id-ca2-6"))
    krl = tmp_path / "krl"
    krl.write_bytes(HEADER + b"\1" + string(section))
    assert ssh_says(krl, [pki["ca2-6"], pki["ca2-5"]]) == [True, False]
    assert judge(krl, pki["ca2-6"]) == "the certificate is revoked (key id 'id-ca2-6', for any CA)"
    assert judge(krl, pki["ca2-5"]) is None


def cert_section(ca_pub: Path, kind: int, body: bytes) -> bytes:
    return (
        HEADER + b"\1" + string(string(blob(ca_pub)) + string(b"") + bytes([kind]) + string(body))
    )


def bitmap(offset: int, raw: bytes) -> tuple[int, bytes]:
    return 0x22, struct.pack(">Q", offset) + string(raw)


TOP = 2**64 - 1
# (certificate subsection, serial probed, reason; None: not revoked; "!...": unreadable)
CERT_CASES = {
    "range-1-1": ((0x21, struct.pack(">QQ", 1, 1)), 1, "serial 1"),
    "range-backwards": ((0x21, struct.pack(">QQ", 9, 5)), 1, "!invalid revoked serial range 9-5"),
    "range-from-0": ((0x21, struct.pack(">QQ", 0, 5)), 1, "!invalid revoked serial range 0-5"),
    "bitmap-serial-1": (bitmap(0, b"\x02"), 1, "serial 1"),
    "bitmap-serial-0": (bitmap(0, b"\x03"), 1, "!invalid revoked serial 0 in a bitmap"),
    "bitmap-to-2^64-1": (bitmap(TOP - 7, b"\x00\x80"), TOP, f"serial {TOP}"),
    "bitmap-past-2^64": (bitmap(TOP - 7, b"\x01\x00"), TOP, "!a serial bitmap runs past 2^64"),
    "bitmap-negative": (bitmap(1, b"\x80"), 1, "!a negative mpint where a bitmap was expected"),
    "bitmap-2050-bytes": (bitmap(1, b"\0\0" + b"\1" * 2048), 1,
                          "!a serial bitmap of 2050 bytes (OpenSSH reads at most 2048:"
                          " SSHBUF_MAX_BIGNUM)"),
    "unknown-subsection": ((0x30, b""), 1, "!unsupported KRL certificate section type 0x30"),
}  # fmt: skip


@pytest.mark.parametrize("case", CERT_CASES)
def test_certificate_subsections_at_their_edges_read_as_ssh_reads_them(
    pki: dict[str, Path], tmp_path: Path, case: str
) -> None:
    (kind, body), serial, reason = CERT_CASES[case]
    krl = tmp_path / "krl"
    krl.write_bytes(cert_section(Path(f"{pki['ca1']}.pub"), kind, body))
    cert = pki[f"ca1-{serial}"]
    done = subprocess.run(["ssh-keygen", "-Q", "-f", str(krl), str(cert)],
                          capture_output=True, text=True)  # fmt: skip
    if reason.startswith("!"):
        assert done.returncode not in (0, 1), done
        with pytest.raises(RevocationError) as caught:
            judge(krl, cert)
        assert str(caught.value) == reason[1:]
    else:
        assert done.returncode == 1, done  # REVOKED
        assert judge(krl, cert) == f"the certificate is revoked ({reason}, for its CA)"
        assert judge(krl, pki["ca2-1" if serial == 1 else "ca2-5"]) is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (HEADER + b"\3" + string(string(b"x" * 19)), "a fingerprint of 19 bytes where 20 belong"),
        (HEADER + b"\5" + string(string(b"x" * 31)), "a fingerprint of 31 bytes where 32 belong"),
        (HEADER + b"\x09" + string(b""), "unsupported KRL section type 9"),
        (HEADER + b"\xff" + string(string(b"x@y") + b"\1" + string(b"")),
         "KRL has an unsupported critical extension 'x@y'"),
        (HEADER + b"\xff" + string(string(b"x@y") + b"\0" + string(b"") + b"zz"),
         "malformed KRL: 2 bytes of unparsed data after KRL section 255"),
    ],
)  # fmt: skip
def test_an_unreadable_section_names_itself(
    pki: dict[str, Path], tmp_path: Path, body: bytes, reason: str
) -> None:
    krl = tmp_path / "krl"
    krl.write_bytes(body)
    done = subprocess.run(["ssh-keygen", "-Q", "-f", str(krl), str(pki["plain"])],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode not in (0, 1), done
    with pytest.raises(RevocationError) as caught:
        judge(krl, pki["plain"])
    assert str(caught.value) == reason


def test_extensions_openssh_may_skip_are_skipped(pki: dict[str, Path], tmp_path: Path) -> None:
    """PROTOCOL.krl: a non-critical extension (KRL-wide or in a certificate section) is
    skipped; a critical one makes the KRL unreadable (OpenSSH 9.2 knows no extension at
    all and refuses both, so ssh-keygen is not the reference here)."""
    ca_pub = Path(f"{pki['ca1']}.pub")
    skipped = cert_section(ca_pub, 0x39, string(b"x@y") + b"\0" + string(b"v"))
    krl = tmp_path / "krl"
    krl.write_bytes(skipped)
    assert judge(krl, pki["ca1-1"]) is None
    krl.write_bytes(cert_section(ca_pub, 0x39, string(b"x@y") + b"\1" + string(b"")))
    with pytest.raises(RevocationError) as caught:
        judge(krl, pki["ca1-1"])
    assert (
        str(caught.value) == "a KRL certificate section has an unsupported critical extension 'x@y'"
    )


def test_a_signed_krl_is_read_past_its_signature(pki: dict[str, Path], tmp_path: Path) -> None:
    """A KRL signed as PROTOCOL.krl says (``ssh-keygen -Q`` checks the signature)."""
    signer = paramiko.Ed25519Key.from_private_key_file(str(pki["ca1"]))
    signed = HEADER + b"\2" + string(string(blob(pki["plain"]))) + b"\4" + string(signer.asbytes())
    krl = tmp_path / "krl"
    krl.write_bytes(signed + string(signer.sign_ssh_data(signed).asbytes()))
    assert ssh_says(krl, [pki["plain"], pki["ca1-1"]]) == [True, False]
    assert judge(krl, pki["plain"]) == "the key is revoked (the key itself)"
    assert judge(krl, pki["ca1-1"]) is None


# -- RevokedHostKeys as a list of keys ---------------------------------------------------


def test_a_key_list_reads_lines_as_ssh_does(pki: dict[str, Path], tmp_path: Path) -> None:
    """CRLF line ends, indentation, comments and blank lines; the line that lists it."""
    plain = pki["plain"].read_text().strip()
    ca = Path(f"{pki['ca2']}.pub").read_text().strip()
    path = tmp_path / "revoked_keys"
    path.write_bytes(f"# retired\r\n\r\n \t{plain}\r\n\t{ca} old CA\r\n".encode())
    assert judge(path, pki["plain"]) == "the key is listed (line 3)"
    assert judge(path, pki["ca2-5"]) == "its CA key is listed (line 4)"
    assert judge(path, pki["ca1-5"]) is None


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"\x0c", "expected TYPE BASE64"),
        (b"X", "expected TYPE BASE64"),
        (b"ssh-ed25519", "expected TYPE BASE64"),
        (b"ssh-ed25519 AAAA!AAA", "Only base64 data is allowed"),
        (b"ssh-rsa {ed25519}", "the key is a ssh-ed25519, the line says ssh-rsa"),
        (b"ssh-\xe9d25519 {ed25519}",
         "'ascii' codec can't decode byte 0xe9 in position 4: ordinal not in range(128)"),
    ],
)  # fmt: skip
def test_a_line_that_is_not_a_key_refuses_with_its_number(
    pki: dict[str, Path], tmp_path: Path, line: bytes, reason: str
) -> None:
    """ssh refuses the connection ("Error checking host key ... in revoked keys file")."""
    b64 = pki["plain"].read_text().split()[1].encode()
    path = tmp_path / "revoked_keys"
    path.write_bytes(b"# retired\n" + line.replace(b"{ed25519}", b64) + b"\n")
    with pytest.raises(RevocationError) as caught:
        judge(path, pki["plain"])
    assert str(caught.value) == f"line 2 is not a public key ({reason})"


def test_a_key_list_is_read_up_to_its_size_limit(pki: dict[str, Path], tmp_path: Path) -> None:
    """64 MiB is read whole (its last line counts); one byte more is refused unread."""
    last = pki["plain"].read_text().split()[:2]
    tail = f"\n{last[0]} {last[1]}".encode()  # no newline: the file's very last byte matters
    path = tmp_path / "revoked_keys"
    path.write_bytes(b"#" + b"x" * (MAX_BYTES - 1 - len(tail)) + tail)
    assert path.stat().st_size == MAX_BYTES
    assert judge(path, pki["plain"]) == "the key is listed (line 2)"
    with path.open("ab") as fh:
        fh.write(b"\n")
    with pytest.raises(RevocationError) as caught:
        judge(path, pki["plain"])
    assert str(caught.value) == "it is larger than 64 MiB"
    with pytest.raises(RevocationError) as caught:
        judge(tmp_path / "missing", pki["plain"])
    assert str(caught.value) == "cannot read it: No such file or directory"
