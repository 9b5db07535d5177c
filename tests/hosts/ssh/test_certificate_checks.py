"""Host certificates made by the real ``ssh-keygen -s`` judged by
:func:`check_host_certificate`: the exact reason a user reads for each refusal, and the
validity window at its edges as OpenSSH draws it (valid from ``valid_after`` included,
expired at ``valid_before``)."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path

import paramiko
import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.certificates import check_host_certificate, parse_certificate
from gpudoctor.hosts.ssh.known_hosts import lookup
from gpudoctor.hosts.ssh.target import SSHTarget
from gpudoctor.hosts.ssh.trust import TrustPolicy, verify_host_key

pytestmark = pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="needs ssh-keygen")

JAN_2030, JAN_2031 = 1893456000, 1924992000  # 2030-01-01 and 2031-01-01 00:00:00 UTC


def keygen(path: Path, kind: str = "ed25519") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)],
                   check=True, capture_output=True)  # fmt: skip
    return path


def public(path: Path) -> paramiko.PKey:
    kind, b64 = Path(f"{path}.pub").read_text().split()[:2]
    return paramiko.PKey.from_type_string(kind, base64.b64decode(b64))


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return keygen(tmp_path_factory.mktemp("ca") / "ca")


def certify(ca: Path, tmp_path: Path, *args: str, kind: str = "ed25519") -> bytes:
    """Return the certificate blob ``ssh-keygen -s CA -I lab ARGS`` makes of a new key."""
    host = keygen(tmp_path / f"host-{kind}", kind)
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "lab", *args, f"{host}.pub"],
                   check=True, capture_output=True)  # fmt: skip
    return base64.b64decode(Path(f"{host}-cert.pub").read_text().split()[1])


def test_each_refusal_says_why_in_words(ca: Path, tmp_path: Path) -> None:
    def reason(blob: bytes, name: str = "pve1", cas: tuple[Path, ...] = (ca,)) -> str | None:
        return check_host_certificate(parse_certificate(blob), name, [public(c) for c in cas])

    (tmp_path / "user").mkdir()
    assert reason(certify(ca, tmp_path / "user", "-n", "pve1")) == (
        "it is a user certificate, not a host certificate"
    )
    host_cert = certify(ca, tmp_path, "-h", "-n", "pve1,pve2")
    other = keygen(tmp_path / "other_ca")
    assert reason(host_cert, cas=(other,)) == (
        "its signing CA is not a @cert-authority for this host in known_hosts"
    )
    assert reason(host_cert, "pve3") == "pve3 is not among its principals (pve1, pve2)"
    assert reason(host_cert, "PVE2", (other, ca)) is None
    (tmp_path / "any").mkdir()
    assert reason(certify(ca, tmp_path / "any", "-h")) == (
        "it names no principal (gpudoctor requires the host's name among them)"
    )


def test_critical_options_are_named_and_refused(ca: Path, tmp_path: Path) -> None:
    """OpenSSH refuses a host certificate with a critical option it does not know: every
    option's name is listed (not its value)."""
    blob = certify(ca, tmp_path, "-h", "-n", "pve1", "-O", "critical:zz@example.org=1",
                   "-O", "critical:yy@example.org", "-O", "critical:xx@example.org=2")  # fmt: skip
    cert = parse_certificate(blob)
    assert cert.critical_options == ("xx@example.org", "yy@example.org", "zz@example.org")
    assert check_host_certificate(cert, "pve1", [public(ca)]) == (
        "it carries critical options (xx@example.org, yy@example.org, zz@example.org)"
    )


@pytest.mark.parametrize(
    ("now", "reason"),
    [
        (JAN_2030 - 1, "it is not valid yet (valid from 2030-01-01 00:00:00 UTC)"),
        (JAN_2030, None),
        (JAN_2031 - 1, None),
        (JAN_2031, "it expired at 2031-01-01 00:00:00 UTC"),
    ],
)
def test_the_validity_window_includes_its_start_and_excludes_its_end(
    ca: Path, tmp_path: Path, now: int, reason: str | None
) -> None:
    blob = certify(ca, tmp_path, "-h", "-n", "pve1", "-V", "20300101Z:20310101Z")
    cert = parse_certificate(blob)
    assert (cert.valid_after, cert.valid_before) == (JAN_2030, JAN_2031)
    assert check_host_certificate(cert, "pve1", [public(ca)], now=now) == reason


@pytest.mark.parametrize(
    ("validity", "reason"),
    [
        ("0x8000000000000000:forever", "it is not valid yet (valid from forever)"),
        ("0x7fffffffffffffff:forever",
         "it is not valid yet (valid from 9223372036854775807 seconds after 1970)"),
        ("0x4000000000000000:forever",
         "it is not valid yet (valid from 4611686018427387904 seconds after 1970)"),
        ("0x3afff4417f:forever", "it is not valid yet (valid from 9999-12-31 23:59:59 UTC)"),
    ],
)  # fmt: skip
def test_a_start_far_in_the_future_is_named_not_a_crash(
    ca: Path, tmp_path: Path, validity: str, reason: str
) -> None:
    """A CA's typo in ``-V`` (a start past the year 9999) is a refusal with its reason,
    never a traceback from the date formatting."""
    blob = certify(ca, tmp_path, "-h", "-n", "10.0.0.5", "-V", validity)
    cert = parse_certificate(blob)
    assert cert.valid_before == 2**64 - 1
    assert check_host_certificate(cert, "10.0.0.5", [public(ca)]) == reason
    target = SSHTarget(alias="pve1", hostname="10.0.0.5", port=22, user="root")
    known = tmp_path / "known_hosts"
    known.write_text(
        f"@cert-authority 10.0.0.5 {' '.join(Path(f'{ca}.pub').read_text().split()[:2])}\n"
    )
    policy = TrustPolicy("yes", (str(known),), None)
    key = paramiko.Ed25519Key(msg=paramiko.Message(blob))
    with pytest.raises(HostError, match=re.escape(f"is refused: {reason};")):
        verify_host_key(key, target, policy, lookup("10.0.0.5", policy.files), lambda k: "FP")


@pytest.mark.parametrize("kind", ["rsa", "ecdsa"])
def test_certificates_of_every_key_type_are_read(ca: Path, tmp_path: Path, kind: str) -> None:
    blob = certify(ca, tmp_path, "-h", "-n", "pve1", "-z", "42", kind=kind)
    cert = parse_certificate(blob)
    assert (cert.cert_type, cert.key_id, cert.serial, cert.principals) == (2, "lab", 42, ("pve1",))
    assert check_host_certificate(cert, "pve1", [public(ca)]) is None


def test_a_certificate_type_gpudoctor_cannot_read_is_named() -> None:
    blob = b"\0\0\0\x23sk-ssh-ed25519-cert-v01@openssh.com" + b"\0" * 8
    with pytest.raises(ValueError) as caught:
        parse_certificate(blob)
    assert str(caught.value) == "unsupported certificate type sk-ssh-ed25519-cert-v01@openssh.com"
