"""OpenSSH key revocation lists (KRL: ``ssh-keygen -k -f FILE``), read as OpenSSH's
``krl.c`` reads them (format: openssh-portable ``PROTOCOL.krl``).

Every section OpenSSH writes is understood: certificates revoked by serial (list,
range, bitmap) or key id, per CA or for any CA; explicit keys; SHA1 and SHA256
fingerprints of keys. Non-critical extensions and signature sections are skipped as
OpenSSH skips them. Anything else (an unknown section, a critical extension, trailing
bytes, a zero serial) makes :func:`parse_krl` raise :class:`KrlError`: a list that
cannot be read revokes nothing it could name, so the caller refuses the connection.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from gpudoctor.hosts.ssh.certificates import Certificate
from gpudoctor.hosts.ssh.matching import plain_key_blob
from gpudoctor.hosts.ssh.wire import Reader, WireError

MAGIC = b"SSHKRL\n\0"
FORMAT_VERSION = 1
SECTION_CERTIFICATES, SECTION_EXPLICIT_KEY, SECTION_SHA1 = 1, 2, 3
SECTION_SIGNATURE, SECTION_SHA256, SECTION_EXTENSION = 4, 5, 255
CERT_SERIAL_LIST, CERT_SERIAL_RANGE, CERT_SERIAL_BITMAP = 0x20, 0x21, 0x22
CERT_KEY_ID, CERT_EXTENSION = 0x23, 0x39


class KrlError(ValueError):
    """The file starts like a KRL but cannot be read (the reason, one phrase)."""


@dataclass
class RevokedCerts:
    """Certificates revoked for one CA (``ca_key`` empty: for every CA).

    Attributes:
        ca_key: the CA's public key blob, ``b""`` for the wildcard section.
        ranges: revoked serials as inclusive ``(low, high)`` ranges.
        key_ids: revoked certificate key ids (``ssh-keygen -I``).
        bitmaps: bitmap sections as ``(offset, bits)``: bit N revokes serial offset + N
            (kept as one integer, never expanded: at most 2 KiB each, as in OpenSSH).
    """

    ca_key: bytes
    ranges: list[tuple[int, int]] = field(default_factory=list)
    key_ids: set[str] = field(default_factory=set)
    bitmaps: list[tuple[int, int]] = field(default_factory=list)  # (offset, bits): kept packed

    def revokes(self, cert: Certificate) -> str | None:
        """Return why ``cert`` is revoked here (``key id 'x'``, ``serial 7``), else None.
        Serial 0 (a CA that set none) is never revoked by serial, as in OpenSSH."""
        if cert.key_id in self.key_ids:
            return f"key id {cert.key_id!r}"
        if cert.serial and any(lo <= cert.serial <= hi for lo, hi in self.ranges):
            return f"serial {cert.serial}"
        if cert.serial and any(cert.serial >= off and (bits >> (cert.serial - off)) & 1
                               for off, bits in self.bitmaps):  # fmt: skip
            return f"serial {cert.serial}"
        return None


@dataclass
class Krl:
    """What one KRL revokes.

    Attributes:
        version: the KRL's own version number; comment: its comment.
        keys: explicitly revoked plain key blobs.
        sha1s, sha256s: revoked key fingerprints (raw digests of plain key blobs).
        certs: per-CA certificate revocations.
    """

    version: int = 0
    comment: str = ""
    keys: set[bytes] = field(default_factory=set)
    sha1s: set[bytes] = field(default_factory=set)
    sha256s: set[bytes] = field(default_factory=set)
    certs: list[RevokedCerts] = field(default_factory=list)

    def _certs_for(self, ca_key: bytes) -> RevokedCerts:
        for entry in self.certs:
            if entry.ca_key == ca_key:
                return entry
        entry = RevokedCerts(ca_key)
        self.certs.append(entry)
        return entry

    def _key_revoked(self, blob: bytes) -> str | None:
        plain = plain_key_blob(blob)
        if hashlib.sha1(plain).digest() in self.sha1s:
            return "its SHA1 fingerprint"
        if hashlib.sha256(plain).digest() in self.sha256s:
            return "its SHA256 fingerprint"
        if plain in self.keys:
            return "the key itself"
        return None

    def revokes(self, blob: bytes, cert: Certificate | None = None) -> str | None:
        """Return why the host key ``blob`` (a certificate blob when ``cert`` is its
        parsed form) is revoked, else None: the key by fingerprint or explicitly, the
        certificate by serial or key id (its CA's section, then the any-CA section),
        then the certificate's CA key itself (OpenSSH's ``ssh_krl_check_key``)."""
        why = self._key_revoked(blob)
        if why is not None:
            return f"the key is revoked ({why})"
        if cert is None:
            return None
        for ca_key in (cert.signature_key, b""):
            for entry in self.certs:
                if entry.ca_key == ca_key and (why := entry.revokes(cert)):
                    scope = "its CA" if ca_key else "any CA"
                    return f"the certificate is revoked ({why}, for {scope})"
        why = self._key_revoked(cert.signature_key)
        if why is not None:
            return f"the certificate's CA key is revoked ({why})"
        return None


def is_krl(data: bytes) -> bool:
    """Return True when ``data`` starts with the KRL magic (``SSHKRL\\n\\0``)."""
    return data.startswith(MAGIC)


def parse_krl(data: bytes) -> Krl:
    """Return the :class:`Krl` in ``data`` (a file that :func:`is_krl`); raise KrlError
    naming what cannot be read."""
    try:
        return _parse(data)
    except WireError as exc:
        raise KrlError(f"malformed KRL: {exc}") from None


def _parse(data: bytes) -> Krl:
    reader = Reader(data)
    reader.take(len(MAGIC))
    version = reader.uint32()
    if version != FORMAT_VERSION:
        raise KrlError(f"unsupported KRL format version {version}")
    krl = Krl(version=reader.uint64())
    reader.uint64()  # generated_date
    reader.uint64()  # flags (none defined)
    reader.string()  # reserved
    krl.comment = reader.cstring()
    while reader.remaining():
        kind = reader.byte()
        section = Reader(reader.string())
        if kind == SECTION_CERTIFICATES:
            _certificates(section, krl)
        elif kind == SECTION_EXPLICIT_KEY:
            krl.keys.update(_blobs(section, 0))
        elif kind == SECTION_SHA1:
            krl.sha1s.update(_blobs(section, 20))
        elif kind == SECTION_SHA256:
            krl.sha256s.update(_blobs(section, 32))
        elif kind == SECTION_EXTENSION:
            _extension(section, "KRL")
        elif kind == SECTION_SIGNATURE:
            reader.string()  # the signature; OpenSSH does not verify KRL signatures
            section = Reader(b"")
        else:
            raise KrlError(f"unsupported KRL section type {kind}")
        section.end(f"KRL section {kind}")
    return krl


def _blobs(section: Reader, length: int) -> list[bytes]:
    found = []
    while section.remaining():
        blob = section.string()
        if length and len(blob) != length:
            raise KrlError(f"a fingerprint of {len(blob)} bytes where {length} belong")
        found.append(blob)
    return found


def _extension(section: Reader, where: str) -> None:
    name = section.text()
    critical = section.byte()
    section.string()
    if critical:
        raise KrlError(f"{where} has an unsupported critical extension {name!r}")


def _certificates(section: Reader, krl: Krl) -> None:
    ca_key = section.string()
    section.string()  # reserved
    entry = krl._certs_for(ca_key)
    while section.remaining():
        kind = section.byte()
        sub = Reader(section.string())
        if kind == CERT_SERIAL_LIST:
            while sub.remaining():
                _add_range(entry, serial := sub.uint64(), serial)
        elif kind == CERT_SERIAL_RANGE:
            _add_range(entry, sub.uint64(), sub.uint64())
        elif kind == CERT_SERIAL_BITMAP:
            _bitmap(entry, sub.uint64(), sub.string())
        elif kind == CERT_KEY_ID:
            while sub.remaining():
                entry.key_ids.add(sub.cstring())
        elif kind == CERT_EXTENSION:
            _extension(sub, "a KRL certificate section")
        else:
            raise KrlError(f"unsupported KRL certificate section type {kind:#x}")
        sub.end(f"KRL certificate section {kind:#x}")


# OpenSSH reads a bitmap with sshbuf_get_bignum2_bytes_direct: SSHBUF_MAX_BIGNUM
# (16384 / 8 = 2048) bytes at most, 2049 with a leading zero byte; a longer one makes the
# whole KRL unreadable (SSH_ERR_BIGNUM_TOO_LARGE) and ssh refuses to connect.
MAX_BITMAP_BYTES = 16384 // 8


def _bitmap(entry: RevokedCerts, offset: int, raw: bytes) -> None:
    """Add a bitmap section (``raw``: the mpint as stored): bit N (least significant first)
    revokes serial ``offset + N``. Refused as OpenSSH refuses it: over 2048 bytes, a
    negative mpint, a serial past 2^64, or serial 0."""
    if len(raw) > MAX_BITMAP_BYTES + 1 or (len(raw) == MAX_BITMAP_BYTES + 1 and raw[0]):
        raise KrlError(
            f"a serial bitmap of {len(raw)} bytes (OpenSSH reads at most {MAX_BITMAP_BYTES}:"
            " SSHBUF_MAX_BIGNUM)"
        )
    if raw and raw[0] & 0x80:
        raise KrlError("a negative mpint where a bitmap was expected")
    bits = int.from_bytes(raw, "big")
    if not bits:
        return
    if offset + bits.bit_length() - 1 >= 1 << 64:
        raise KrlError("a serial bitmap runs past 2^64")
    if offset == 0 and bits & 1:
        raise KrlError("invalid revoked serial 0 in a bitmap")
    entry.bitmaps.append((offset, bits))


def _add_range(entry: RevokedCerts, low: int, high: int) -> None:
    if low == 0 or low > high:
        raise KrlError(f"invalid revoked serial range {low}-{high}")
    entry.ranges.append((low, high))
