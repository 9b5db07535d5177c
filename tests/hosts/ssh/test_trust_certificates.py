"""Host certificates and ``RevokedHostKeys`` judged by :func:`verify_host_key` without a
server: certificates signed by the real ``ssh-keygen -s``, loaded into the paramiko key
object the transport hands over (``Ed25519Key(msg=Message(blob))``, as paramiko's
``Transport._verify_key`` builds it), real known_hosts and revocation files. Each refusal's
text is pinned: fingerprints are compared with ``ssh-keygen -l`` on the same keys."""

from __future__ import annotations

import base64
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.known_hosts import lookup
from gpudoctor.hosts.ssh.target import SSHTarget
from gpudoctor.hosts.ssh.trust import TrustPolicy, verify_host_key

pytestmark = pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="needs ssh-keygen")

TARGET = SSHTarget(alias="pve1", hostname="10.0.0.5", port=2222, user="root")
WHERE = "pve1 (root@10.0.0.5:2222)"


def keygen(path: Path) -> Path:
    """Make an ed25519 key pair at ``path`` (public half at ``path.pub``)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, capture_output=True)  # fmt: skip
    return path


def pub_line(path: Path) -> str:
    """Return ``TYPE BASE64`` of the public key beside ``path``."""
    return " ".join(Path(f"{path}.pub").read_text().split()[:2])


def sha256_fp(path: Path) -> str:
    """Return ``SHA256:...`` of the public key beside ``path``, as ``ssh-keygen -l`` says."""
    done = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", f"{path}.pub"],
                          check=True, capture_output=True, text=True)  # fmt: skip
    return done.stdout.split()[1]


def fp(key: paramiko.PKey) -> str:
    return "FP:" + key.get_base64()[-6:]


@dataclass
class Material:
    """A CA, another CA, and host keys with certificates signed by the CA."""

    ca: Path
    other_ca: Path
    hosts: dict[str, Path]

    def cert_key(self, name: str) -> paramiko.PKey:
        """Return host ``name``'s certificate as the key paramiko's transport hands over."""
        b64 = Path(f"{self.hosts[name]}-cert.pub").read_text().split()[1]
        return paramiko.Ed25519Key(msg=paramiko.Message(base64.b64decode(b64)))


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Material:
    root = tmp_path_factory.mktemp("certs")
    ca, other_ca = keygen(root / "ca"), keygen(root / "other_ca")
    signed = {
        "ok": ("lab", "10.0.0.5"),
        "alias": ("lab", "pve-a"),
        "elsewhere": ("lab", "pve9"),
        "bad_id": ("\udcff", "10.0.0.5"),
    }
    hosts = {}
    for name, (key_id, principal) in signed.items():
        host = keygen(root / name)
        subprocess.run([b"ssh-keygen", b"-q", b"-s", bytes(ca), b"-h", b"-I",
                        key_id.encode("utf-8", "surrogateescape"), b"-n", principal.encode(),
                        f"{host}.pub".encode()], check=True, capture_output=True)  # fmt: skip
        hosts[name] = host
    return Material(ca, other_ca, hosts)


def verify(key: paramiko.PKey, known_text: str, tmp_path: Path, target: SSHTarget = TARGET) -> str:
    known = tmp_path / "known_hosts"
    known.write_text(known_text)
    pol = TrustPolicy("yes", (str(known),), None)
    return verify_host_key(key, target, pol, lookup(target.known_hosts_name, pol.files), fp)


def ca_line(ca: Path, pattern: str = "[10.0.0.5]:2222") -> str:
    return f"@cert-authority {pattern} {pub_line(ca)}\n"


def ca_key(ca: Path) -> paramiko.PKey:
    kind, b64 = pub_line(ca).split()
    return paramiko.PKey.from_type_string(kind, base64.b64decode(b64))


def test_a_certificate_signed_by_a_trusted_ca_is_accepted_naming_that_ca(
    material: Material, tmp_path: Path
) -> None:
    """Two CAs are trusted for the host: the answer names the one that signed."""
    text = ca_line(material.other_ca) + ca_line(material.ca)
    how = verify(material.cert_key("ok"), text, tmp_path)
    assert how == f"host certificate 'lab' signed by CA {fp(ca_key(material.ca))}"


def test_a_certificate_naming_the_host_key_alias_is_accepted(
    material: Material, tmp_path: Path
) -> None:
    """With HostKeyAlias, the certificate's principal is the alias, not the address."""
    target = SSHTarget(alias="pve1", hostname="10.0.0.5", port=2222, host_key_alias="pve-a")
    how = verify(material.cert_key("alias"), ca_line(material.ca, "pve-a"), tmp_path, target)
    assert how.startswith("host certificate 'lab' signed by CA ")


def test_a_certificate_for_another_name_is_refused_with_how_to_renew_it(
    material: Material, tmp_path: Path
) -> None:
    key = material.cert_key("elsewhere")
    with pytest.raises(HostError) as info:
        verify(key, ca_line(material.ca), tmp_path)
    assert str(info.value) == (
        f"{WHERE}: the SSH host certificate (ssh-ed25519 {fp(key)}, id 'lab') is refused: "
        "10.0.0.5 is not among its principals (pve9); renew it (ssh-keygen -s CA -h -n "
        "10.0.0.5) or fix the @cert-authority line in known_hosts"
    )


def test_a_certificate_from_an_untrusted_ca_is_refused(material: Material, tmp_path: Path) -> None:
    with pytest.raises(HostError, match="its signing CA is not a @cert-authority for this host"):
        verify(material.cert_key("ok"), ca_line(material.other_ca), tmp_path)


def test_a_malformed_certificate_is_refused(material: Material, tmp_path: Path) -> None:
    """A certificate whose key id is not UTF-8 cannot be read: refused, not trusted."""
    with pytest.raises(HostError) as info:
        verify(material.cert_key("bad_id"), ca_line(material.ca), tmp_path)
    assert str(info.value) == (
        f"{WHERE}: the SSH host certificate is malformed: 'utf-8' codec can't decode byte "
        "0xff in position 0: invalid start byte"
    )


def test_a_certificate_signed_by_a_ca_marked_revoked_is_refused(
    material: Material, tmp_path: Path
) -> None:
    """Attack: a leaked CA is @revoked but its @cert-authority line is still there."""
    text = ca_line(material.ca) + f"@revoked * {pub_line(material.ca)}\n"
    with pytest.raises(HostError) as info:
        verify(material.cert_key("ok"), text, tmp_path)
    assert str(info.value) == (
        f"{WHERE}: the SSH host certificate (id 'lab') is signed by the CA "
        f"{sha256_fp(material.ca)}, which is marked @revoked in known_hosts "
        f"({tmp_path / 'known_hosts'}:2): the host key was revoked; refusing it"
    )


def test_a_certificate_of_a_revoked_host_key_is_refused_naming_the_certificate_type(
    material: Material, tmp_path: Path
) -> None:
    key = material.cert_key("ok")
    text = ca_line(material.ca) + f"@revoked * {pub_line(material.hosts['ok'])}\n"
    with pytest.raises(HostError) as info:
        verify(key, text, tmp_path)
    assert str(info.value).startswith(
        f"{WHERE}: the SSH host key ssh-ed25519-cert-v01@openssh.com {fp(key)} is marked "
        f"@revoked in known_hosts ({tmp_path / 'known_hosts'}:2); refusing it."
    )


def revoking(tmp_path: Path, *listed: Path) -> SSHTarget:
    """Return TARGET with a RevokedHostKeys key list naming ``listed`` (after a comment)."""
    path = tmp_path / "revoked_keys"
    path.write_text("# revoked host keys\n" + "".join(f"{pub_line(p)}\n" for p in listed))
    return SSHTarget(alias="pve1", hostname="10.0.0.5", port=2222, user="root",
                     revoked_host_keys=(str(path),))  # fmt: skip


def test_revoked_host_keys_listing_the_host_key_refuses_it(
    material: Material, tmp_path: Path
) -> None:
    host = material.hosts["ok"]
    kind, b64 = pub_line(host).split()
    key = paramiko.PKey.from_type_string(kind, base64.b64decode(b64))
    target = revoking(tmp_path, material.other_ca, host)
    with pytest.raises(HostError) as info:
        verify(key, f"[10.0.0.5]:2222 {pub_line(host)}\n", tmp_path, target)
    assert str(info.value) == (
        f"{WHERE}: the SSH host key {sha256_fp(host)} was revoked by RevokedHostKeys "
        f"{tmp_path / 'revoked_keys'}: the key is listed (line 3); refusing it"
    )


def test_revoked_host_keys_listing_the_ca_refuses_its_certificates(
    material: Material, tmp_path: Path
) -> None:
    target = revoking(tmp_path, material.ca)
    with pytest.raises(HostError) as info:
        verify(material.cert_key("ok"), ca_line(material.ca), tmp_path, target)
    assert str(info.value) == (
        f"{WHERE}: the SSH host key {sha256_fp(material.hosts['ok'])} was revoked by "
        f"RevokedHostKeys {tmp_path / 'revoked_keys'}: its CA key is listed (line 2); "
        "refusing it"
    )


def test_revoked_host_keys_naming_other_keys_lets_the_host_through(
    material: Material, tmp_path: Path
) -> None:
    target = revoking(tmp_path, material.other_ca, material.hosts["elsewhere"])
    how = verify(material.cert_key("ok"), ca_line(material.ca), tmp_path, target)
    assert how.startswith("host certificate 'lab' signed by CA ")


def test_an_unreadable_revoked_host_keys_file_refuses_the_connection(
    material: Material, tmp_path: Path
) -> None:
    missing = tmp_path / "no_such_krl"
    target = SSHTarget(alias="pve1", hostname="10.0.0.5", port=2222, user="root",
                       revoked_host_keys=(str(missing),))  # fmt: skip
    with pytest.raises(HostError) as info:
        verify(material.cert_key("ok"), ca_line(material.ca), tmp_path, target)
    assert str(info.value) == (
        f"{WHERE}: cannot check the host key against RevokedHostKeys {missing}: cannot read "
        "it: No such file or directory; refusing to connect (ssh refuses too): fix or remove "
        "that file"
    )
