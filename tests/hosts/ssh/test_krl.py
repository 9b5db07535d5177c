"""KRLs made by the real ``ssh-keygen -k`` (random serial sets, key ids, keys and
fingerprints) read by :mod:`gpudoctor.hosts.ssh.krl`, each verdict compared with
``ssh-keygen -Q`` (OpenSSH's own KRL check) on the same certificates and keys."""

from __future__ import annotations

import base64
import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from gpudoctor.hosts.ssh.certificates import parse_certificate
from gpudoctor.hosts.ssh.krl import KrlError, parse_krl
from gpudoctor.hosts.ssh.matching import plain_key_blob
from gpudoctor.hosts.ssh.revoked import RevocationError, revoked_by_file
from gpudoctor.hosts.ssh.wire import Reader, string

pytestmark = pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="needs ssh-keygen")

SERIALS = (1, 2, 5, 7, 8, 9, 40, 41, 42, 100, 1000, 70000, 2**40)


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True, capture_output=True)  # fmt: skip
    return path


def blob(pub: Path) -> bytes:
    return base64.b64decode(pub.read_text().split()[1])


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("krl")
    ca = keygen(root / "ca")
    certs = []
    for serial in SERIALS:
        key = keygen(root / f"host{serial}")
        subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-h", "-I", f"id-{serial}",
                        "-n", "h", "-z", str(serial), f"{key}.pub"],
                       check=True, capture_output=True)  # fmt: skip
        certs.append((serial, Path(f"{key}-cert.pub"), Path(f"{key}.pub")))
    return {"root": root, "ca": ca, "certs": certs}


def reference(krl: Path, files: list[Path]) -> dict[Path, bool]:
    """Return ssh-keygen -Q's verdict (True: REVOKED) for each file."""
    done = subprocess.run(["ssh-keygen", "-Q", "-f", str(krl), *map(str, files)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    verdict = {}
    for line in done.stdout.splitlines():
        name, _, state = line.rpartition(": ")
        verdict[Path(name.split(" (")[0])] = state == "REVOKED"
    assert len(verdict) == len(files), done.stdout
    return verdict


def ours(krl_bytes: bytes, path: Path) -> bool:
    key = blob(path)
    cert = parse_certificate(key) if path.name.endswith("-cert.pub") else None
    return parse_krl(krl_bytes).revokes(key, cert) is not None


def section_types(data: bytes) -> set[int]:
    reader = Reader(data)
    reader.take(8 + 4 + 8 + 8 + 8)
    reader.string(), reader.string()
    kinds = set()
    while reader.remaining():
        kind = reader.byte()
        body = Reader(reader.string())
        kinds.add(kind)
        if kind == 1:
            body.string(), body.string()
            while body.remaining():
                kinds.add(body.byte())
                body.string()
    return kinds


def test_random_krls_agree_with_ssh_keygen(material: dict) -> None:
    rng = random.Random(22)
    root, certs = material["root"], material["certs"]
    seen: set[int] = set()
    for round_no in range(14):
        lines = []
        for serial in rng.sample(SERIALS, rng.randint(1, 5)):
            if rng.random() < 0.3:
                lines.append(f"serial: {serial}-{serial + rng.randint(1, 3)}")
            else:
                lines.append(f"serial: {serial}")
        if rng.random() < 0.4:
            lines.append(f"serial: {rng.randint(3, 60)}")  # dense serials: a bitmap
            lines.extend(f"serial: {n}" for n in range(3, 60, rng.randint(2, 5)))
        if round_no % 3 == 0:
            lines.append("serial: 5000-90000")  # a long run: a range section
        for serial, _cert, pub in rng.sample(certs, 3):
            form = rng.choice(["id", "key", "sha1", "sha256", "hash", "none"])
            if form == "id":
                lines.append(f"id: id-{serial}")
            elif form == "hash":
                fp = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True,
                                    text=True, check=True).stdout.split()[1]  # fmt: skip
                lines.append(f"hash: {fp}")
            elif form != "none":
                lines.append(f"{form}: {pub.read_text().strip()}")
        spec, krl = root / f"spec{round_no}", root / f"krl{round_no}"
        spec.write_text("\n".join(lines) + "\n")
        subprocess.run(["ssh-keygen", "-q", "-k", "-f", str(krl), "-s", f"{material['ca']}.pub",
                        str(spec)], check=True, capture_output=True)  # fmt: skip
        data = krl.read_bytes()
        seen |= section_types(data)
        files = [p for _s, cert, pub in certs for p in (cert, pub)]
        expected = reference(krl, files)
        got = {path: ours(data, path) for path in files}
        assert got == expected, (lines, [p.name for p in files if got[p] != expected[p]])
        assert any(expected.values()), "each KRL revokes something"
    # every section ssh-keygen writes was read at least once
    assert {1, 2, 3, 5, 0x20, 0x21, 0x22, 0x23} <= seen, sorted(seen)


def test_ca_key_in_krl_revokes_all_its_certificates(material: dict) -> None:
    root, certs = material["root"], material["certs"]
    spec, krl = root / "spec-ca", root / "krl-ca"
    spec.write_text(f"key: {Path(str(material['ca']) + '.pub').read_text()}")
    subprocess.run(["ssh-keygen", "-q", "-k", "-f", str(krl), str(spec)], check=True,
                   capture_output=True)  # fmt: skip
    files = [cert for _s, cert, _p in certs] + [certs[0][2]]
    expected = reference(krl, files)
    assert {p: ours(krl.read_bytes(), p) for p in files} == expected
    assert expected[certs[0][1]] and not expected[certs[0][2]]


def test_any_ca_key_id_section(material: dict) -> None:
    """A certificate section with an empty CA key applies to every CA (PROTOCOL.krl
    2.); ssh-keygen cannot write one, so it is built here and ssh-keygen -Q judges it."""
    root, certs = material["root"], material["certs"]
    ids = string(b"id-42") + string(b"id-7")
    section = string(b"") + string(b"") + bytes([0x23]) + string(ids)
    header = b"SSHKRL\n\0" + struct.pack(">IQQQ", 1, 1, 0, 0) + string(b"") + string(b"")
    krl = root / "krl-any"
    krl.write_bytes(header + bytes([1]) + string(section))
    files = [cert for _s, cert, _p in certs]
    expected = reference(krl, files)
    assert {p: ours(krl.read_bytes(), p) for p in files} == expected
    assert sum(expected.values()) == 2


@pytest.mark.parametrize(
    "damage",
    ["truncated", "trailing-in-section", "unknown-section", "critical-extension", "version"],
)
def test_malformed_krl_is_refused_like_ssh_keygen(material: dict, damage: str) -> None:
    """Whatever ssh-keygen cannot read, gpudoctor does not read as "nothing revoked"."""
    header = b"SSHKRL\n\0" + struct.pack(">IQQQ", 1, 1, 0, 0) + string(b"") + string(b"")
    key = string(plain_key_blob(blob(material["certs"][0][2])))
    bodies = {
        "truncated": header + bytes([2]) + string(key)[:-4],
        "trailing-in-section": header + bytes([3]) + string(string(b"x" * 20) + b"zz"),
        "unknown-section": header + bytes([9]) + string(b""),
        "critical-extension": header + bytes([255]) + string(string(b"x@y") + b"\1" + string(b"")),
        "version": header.replace(struct.pack(">I", 1), struct.pack(">I", 2), 1),
    }
    path = material["root"] / f"bad-{damage}"
    path.write_bytes(bodies[damage])
    done = subprocess.run(["ssh-keygen", "-Q", "-f", str(path), str(material["certs"][0][2])],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode not in (0, 1), (done.returncode, done.stdout, done.stderr)
    with pytest.raises(KrlError):
        parse_krl(bodies[damage])
    with pytest.raises(RevocationError):
        revoked_by_file(str(path), blob(material["certs"][0][2]))


def test_non_critical_extension_is_skipped(material: dict) -> None:
    header = b"SSHKRL\n\0" + struct.pack(">IQQQ", 1, 1, 0, 0) + string(b"") + string(b"")
    pub = material["certs"][0][2]
    body = header + bytes([255]) + string(string(b"x@y") + b"\0" + string(b"v"))
    body += bytes([2]) + string(string(plain_key_blob(blob(pub))))
    assert parse_krl(body).revokes(blob(pub)) == "the key is revoked (the key itself)"
