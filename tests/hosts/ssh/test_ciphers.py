"""paramiko offers AEAD ciphers first (less client CPU per packet, issue 14.5); only the
order changes, never the set offered."""

from __future__ import annotations

import paramiko
import pytest

from gpudoctor.hosts.ssh import connect as ssh_connect
from gpudoctor.hosts.ssh.connect import aead_first
from tests.lab.sshd import LabSSHD


def test_aead_first_only_reorders() -> None:
    offered = tuple(paramiko.Transport._preferred_ciphers)
    ordered = aead_first(offered)
    assert sorted(ordered) == sorted(offered)
    assert ordered[:2] == ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
    rest = [c for c in offered if "gcm" not in c]
    assert list(ordered[2:]) == rest
    assert aead_first(("aes128-ctr", "chacha20-poly1305@openssh.com")) == (
        "chacha20-poly1305@openssh.com",
        "aes128-ctr",
    )


@pytest.mark.lab
@pytest.mark.parametrize("prefer", [True, False])
def test_the_real_sshd_agrees_on_aes_gcm(
    lab_sshd: LabSSHD, monkeypatch: pytest.MonkeyPatch, prefer: bool
) -> None:
    """Against the real OpenSSH server: AES-GCM is negotiated in both directions (and
    paramiko's own first choice, aes128-ctr, without the preference)."""
    monkeypatch.setattr(ssh_connect, "PREFER_AEAD", prefer)
    host = lab_sshd.host().connect()
    try:
        transport = host._conn.transport  # type: ignore[union-attr]
        want = "aes128-gcm@openssh.com" if prefer else "aes128-ctr"
        assert (transport.local_cipher, transport.remote_cipher) == (want, want)
        assert host.run(["echo", "ok"]).stdout == "ok\n"
    finally:
        host.close()
