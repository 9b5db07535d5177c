"""``RevokedHostKeys`` files (ssh_config), read as OpenSSH's ``sshkey_check_revoked``
reads them: a binary KRL (``ssh-keygen -k``; :mod:`gpudoctor.hosts.ssh.krl`) or, when the
file does not start with the KRL magic, a list of public keys, one per line (``#``
comments and blank lines skipped). A listed key revokes that key, a certificate of it,
and every certificate signed by it (a CA key). A file that cannot be read, or a line
that is not a public key, refuses the connection as OpenSSH does ("Error checking host
key ... in revoked keys file"): revocation that cannot be read must not pass as none."""

from __future__ import annotations

import base64
import binascii

from gpudoctor.hosts.ssh.certificates import Certificate, blob_type
from gpudoctor.hosts.ssh.krl import KrlError, is_krl, parse_krl
from gpudoctor.hosts.ssh.matching import plain_key_blob

# A revocation list larger than this is refused rather than read into memory.
MAX_BYTES = 64 << 20


class RevocationError(ValueError):
    """A RevokedHostKeys file cannot be read (the reason, one phrase)."""


def read_list(path: str) -> bytes:
    """Return the bytes of the revocation file ``path`` (``cat FILE``); raise
    RevocationError when it cannot be read or is over :data:`MAX_BYTES`."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise RevocationError(f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise RevocationError(f"it is larger than {MAX_BYTES >> 20} MiB")
    return data


def revoked_by_file(path: str, blob: bytes, cert: Certificate | None = None) -> str | None:
    """Return why the host key ``blob`` (a certificate blob when ``cert`` is its parsed
    form) is revoked by the RevokedHostKeys file ``path``, or None when it is not;
    raise RevocationError when the file cannot be read (``ssh-keygen -Q -f FILE KEY``
    decides the same)."""
    data = read_list(path)
    if is_krl(data):
        try:
            return parse_krl(data).revokes(blob, cert)
        except KrlError as exc:
            raise RevocationError(str(exc)) from None
    return _in_key_list(data, blob, cert)


def _in_key_list(data: bytes, blob: bytes, cert: Certificate | None) -> str | None:
    wanted = {plain_key_blob(blob): "the key is listed"}
    if cert is not None:
        wanted.setdefault(plain_key_blob(cert.signature_key), "its CA key is listed")
    for number, raw in enumerate(data.split(b"\n"), 1):
        line = raw.strip(b" \t\r")
        if not line or line.startswith(b"#"):
            continue
        listed = _line_key(line, number)
        if listed in wanted:
            return f"{wanted[listed]} (line {number})"
    return None


def _line_key(line: bytes, number: int) -> bytes:
    """Return the plain key blob of one ``TYPE BASE64 [COMMENT]`` line."""
    fields = line.split()
    try:
        if len(fields) < 2:
            raise ValueError("expected TYPE BASE64")
        kind = fields[0].decode("ascii")
        key = base64.b64decode(fields[1], validate=True)
        if blob_type(key) != kind:
            raise ValueError(f"the key is a {blob_type(key)}, the line says {kind}")
        return plain_key_blob(key)
    except (UnicodeDecodeError, binascii.Error, ValueError) as exc:
        raise RevocationError(f"line {number} is not a public key ({exc})") from None
