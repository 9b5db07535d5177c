"""OpenSSH host certificates (``ssh-keygen -s CA -h``): parse one and check it against the
``@cert-authority`` keys of known_hosts: a HOST certificate, signed by a trusted CA key
(the signature verified), valid now, with the host's name among its principals, and
without critical options (the format: OpenSSH's PROTOCOL.certkeys)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gpudoctor.hosts.ssh.matching import glob_match

HOST_CERT = 2
# Key-type-specific public fields that follow the nonce, per certificate type.
_FIELDS = {
    "ssh-ed25519-cert-v01@openssh.com": ("string",),
    "ssh-rsa-cert-v01@openssh.com": ("mpint", "mpint"),
    "ecdsa-sha2-nistp256-cert-v01@openssh.com": ("string", "string"),
    "ecdsa-sha2-nistp384-cert-v01@openssh.com": ("string", "string"),
    "ecdsa-sha2-nistp521-cert-v01@openssh.com": ("string", "string"),
}
# Signature algorithms OpenSSH accepts from a CA by default (CASignatureAlgorithms).
CA_SIGNATURE_ALGORITHMS = {
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "rsa-sha2-512",
    "rsa-sha2-256",
}


@dataclass(frozen=True)
class Certificate:
    """The parts of an OpenSSH certificate that decide trust.

    Attributes:
        cert_type: 1 user, 2 host.
        key_id: the signer's label (``ssh-keygen -I``).
        serial: the serial number.
        principals: names it is valid for (``ssh-keygen -n``).
        valid_after, valid_before: validity, seconds since the epoch.
        critical_options: names of its critical options.
        signature_key: the CA's public key blob.
        signature_algorithm: the CA signature's algorithm (``ssh-ed25519``).
        signed: the bytes the CA signed.
        signature: the signature blob.
    """

    cert_type: int
    key_id: str
    serial: int
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    critical_options: tuple[str, ...]
    signature_key: bytes
    signature_algorithm: str
    signed: bytes
    signature: bytes


def blob_type(blob: bytes) -> str:
    """Return the key type a public key or certificate blob starts with (``ssh-ed25519``,
    ``ssh-ed25519-cert-v01@openssh.com``); raises ValueError for a malformed blob."""
    from gpudoctor.hosts.ssh.wire import Reader

    return Reader(blob).text()


def parse_certificate(blob: bytes) -> Certificate:
    """Return the :class:`Certificate` encoded in ``blob`` (raises ValueError when it is
    not an OpenSSH certificate gpudoctor knows)."""
    from paramiko import Message

    msg = Message(blob)
    cert_kind = msg.get_text()
    fields = _FIELDS.get(cert_kind)
    if fields is None:
        raise ValueError(f"unsupported certificate type {cert_kind}")
    msg.get_string()  # nonce
    for kind in fields:
        msg.get_mpint() if kind == "mpint" else msg.get_string()
    serial = msg.get_int64()
    cert_type = msg.get_int()
    key_id = msg.get_text()
    principals = _strings(msg.get_string())
    valid_after, valid_before = msg.get_int64(), msg.get_int64()
    critical = _strings(msg.get_string())[::2]
    msg.get_string()  # extensions
    msg.get_string()  # reserved
    signature_key = msg.get_string()
    signed = msg.get_so_far()
    signature = msg.get_string()
    algorithm = Message(signature).get_text()
    return Certificate(
        cert_type=cert_type,
        key_id=key_id,
        serial=serial,
        principals=tuple(principals),
        valid_after=valid_after,
        valid_before=valid_before,
        critical_options=tuple(critical),
        signature_key=signature_key,
        signature_algorithm=algorithm,
        signed=signed,
        signature=signature,
    )


def _strings(packed: bytes) -> list[str]:
    from paramiko import Message

    msg, out = Message(packed), []
    while msg.get_remainder():
        out.append(msg.get_text())
    return out


def check_host_certificate(
    cert: Certificate, name: str, authorities: list[Any], now: float | None = None
) -> str | None:
    """Return None when ``cert`` proves the host ``name`` (a host certificate signed by
    one of ``authorities`` (paramiko PKeys), valid at ``now``, ``name`` among its
    principals, no critical option), else the reason it does not (one phrase)."""
    from paramiko import Message

    if cert.cert_type != HOST_CERT:
        return "it is a user certificate, not a host certificate"
    signer = next((ca for ca in authorities if ca.asbytes() == cert.signature_key), None)
    if signer is None:
        return "its signing CA is not a @cert-authority for this host in known_hosts"
    if cert.signature_algorithm not in CA_SIGNATURE_ALGORITHMS:
        return f"its CA signature algorithm {cert.signature_algorithm} is not accepted"
    if not signer.verify_ssh_sig(cert.signed, Message(cert.signature)):
        return "its CA signature does not verify"
    moment = time.time() if now is None else now
    if moment < cert.valid_after:
        return f"it is not valid yet (valid from {_when(cert.valid_after)})"
    if moment >= cert.valid_before:
        return f"it expired at {_when(cert.valid_before)}"
    if not cert.principals:
        return "it names no principal (gpudoctor requires the host's name among them)"
    if not any(glob_match(name.lower(), p.lower()) for p in cert.principals):
        return f"{name} is not among its principals ({', '.join(cert.principals)})"
    if cert.critical_options:
        return f"it carries critical options ({', '.join(cert.critical_options)})"
    return None


def _when(stamp: int) -> str:
    """Return ``stamp`` (seconds since 1970) as a UTC date, ``forever`` from 2^63 on, or
    the raw seconds where the C library cannot represent the date (a typo in ``-V``)."""
    if stamp >= 2**63:
        return "forever"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))
    except (OverflowError, OSError, ValueError):
        return f"{stamp} seconds after 1970"
