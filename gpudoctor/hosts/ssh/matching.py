"""What OpenSSH compares when it matches a host: a name against a known_hosts or
certificate-principal pattern (:func:`glob_match`), and a key against a listed key by its
plain public key (:func:`plain_key_blob`, the certified key of a certificate). One module
that known_hosts.py, certificates.py, revoked.py and krl.py all use (none of them imports
another for these)."""

from __future__ import annotations

import re

from gpudoctor.hosts.ssh.wire import Reader, string

# Number of key fields after the nonce, per certificate type (every type OpenSSH writes;
# each field is a ``string`` or ``mpint``, both length-prefixed): enough to take the plain
# key out of any certificate (:func:`plain_key_blob`).
_KEY_FIELD_COUNT = {
    "ssh-ed25519-cert-v01@openssh.com": 1,
    "sk-ssh-ed25519-cert-v01@openssh.com": 2,
    "ssh-rsa-cert-v01@openssh.com": 2,
    "ssh-dss-cert-v01@openssh.com": 4,
    "ecdsa-sha2-nistp256-cert-v01@openssh.com": 2,
    "ecdsa-sha2-nistp384-cert-v01@openssh.com": 2,
    "ecdsa-sha2-nistp521-cert-v01@openssh.com": 2,
    "sk-ecdsa-sha2-nistp256-cert-v01@openssh.com": 3,
}
CERT_SUFFIX = "-cert-v01@openssh.com"  # a certificate key type ends so


def glob_match(name: str, pattern: str) -> bool:
    """Return True when ``pattern`` (OpenSSH's ``*`` and ``?`` only; ``[`` is literal, as
    in ``[host]:port``) matches all of ``name``."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name, re.DOTALL) is not None


def plain_key_blob(blob: bytes) -> bytes:
    """Return the plain public key blob of ``blob``: the certified key for a certificate
    (OpenSSH's ``plain_key_blob``: what ``@revoked``, ``RevokedHostKeys`` and KRL
    fingerprints compare), ``blob`` itself for a plain key; ValueError when malformed."""
    reader = Reader(blob)
    kind = reader.text()
    if not kind.endswith(CERT_SUFFIX):
        return blob
    count = _KEY_FIELD_COUNT.get(kind)
    if count is None:
        raise ValueError(f"unsupported certificate type {kind}")
    reader.string()  # nonce
    start = reader.pos
    for _ in range(count):
        reader.string()
    plain_type = kind.removesuffix(CERT_SUFFIX) + ("@openssh.com" if kind.startswith("sk-") else "")
    return string(plain_type.encode()) + blob[start : reader.pos]
