"""known_hosts files as OpenSSH reads them: several files, hashed names (``|1|salt|hash``),
patterns (``*``, ``?``, ``!negated``, ``[host]:port``), and the ``@cert-authority`` and
``@revoked`` markers (``man 8 sshd``, section SSH_KNOWN_HOSTS FILE FORMAT)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.hosts.ssh.matching import glob_match, plain_key_blob

PLAIN, CA, REVOKED = "plain", "cert-authority", "revoked"


@dataclass(frozen=True)
class KnownKey:
    """One known_hosts line that matched a host.

    Attributes:
        marker: ``plain``, ``cert-authority`` or ``revoked``.
        key_type: the key's type as written (``ssh-ed25519``).
        blob: the public key's wire bytes (compare with ``PKey.asbytes()``).
        source: ``file:line`` for messages.
        host_matched: the line's host pattern matches the host looked up (False only for
            an ``@revoked`` line naming other hosts, which gpudoctor applies anyway).
    """

    marker: str
    key_type: str
    blob: bytes
    source: str
    host_matched: bool = True

    def pkey(self) -> Any:
        """Return the key as a paramiko PKey (None for a type paramiko cannot load)."""
        import paramiko

        try:
            return paramiko.PKey.from_type_string(self.key_type, self.blob)
        except Exception:  # unknown or malformed key type: not usable, not fatal
            return None


@dataclass(frozen=True)
class HostKeys:
    """Every known_hosts entry that applies to one host name.

    Attributes:
        name: the name looked up (``HostKeyAlias`` or ``[host]:port``).
        plain: keys of the host itself.
        authorities: ``@cert-authority`` keys allowed to sign the host's certificate.
        revoked: ``@revoked`` keys, whatever their host pattern (never accepted).
        files: the files read (for messages).
    """

    name: str
    plain: tuple[KnownKey, ...] = field(default_factory=tuple)
    authorities: tuple[KnownKey, ...] = field(default_factory=tuple)
    revoked: tuple[KnownKey, ...] = field(default_factory=tuple)
    files: tuple[str, ...] = field(default_factory=tuple)

    def plain_types(self) -> list[str]:
        """Return the key types known for the host, sorted (``["ssh-ed25519"]``)."""
        return sorted({key.key_type for key in self.plain})

    def is_revoked(self, blob: bytes) -> bool:
        """Return True when the key ``blob`` is listed ``@revoked``."""
        return self.revoked_entry(blob) is not None

    def revoked_entry(self, blob: bytes) -> KnownKey | None:
        """Return the ``@revoked`` line listing the key ``blob`` (its certified key for a
        certificate), or None."""
        plain = plain_key_blob(blob)
        return next((k for k in self.revoked if plain_key_blob(k.blob) == plain), None)


def match_host(patterns: str, name: str) -> bool:
    """Return True when the comma-separated ``patterns`` field matches ``name``: a hashed
    entry (``|1|salt|hash``) by HMAC-SHA1, else ``*``/``?`` wildcards, and any matching
    ``!pattern`` vetoes (OpenSSH's ``match_hostname``)."""
    name = name.lower()
    if patterns.startswith("|1|"):
        return _hashed_match(patterns, name)
    matched = False
    for pattern in patterns.lower().split(","):
        negated = pattern.startswith("!")
        if glob_match(name, pattern[1:] if negated else pattern):
            if negated:
                return False
            matched = True
    return matched


def _hashed_match(entry: str, name: str) -> bool:
    """OpenSSH's rule (hostfile.c): the entry's salt must be 20 bytes, and ``name`` hashed
    with it must give the entry exactly (no stray ``|``, junk or other salt length)."""
    salt_b64 = entry[len("|1|") :].partition("|")[0]
    try:
        salt = base64.b64decode(salt_b64)
    except (ValueError, binascii.Error):
        return False
    if len(salt) != hashlib.sha1().digest_size:
        return False
    return hmac.compare_digest(hashed_name(name, salt).encode(), entry.encode())


def parse_line(line: str) -> tuple[str, str, str, bytes] | None:
    """Return ``(marker, patterns, key_type, blob)`` for one known_hosts line, or None for
    a comment, a blank or a malformed line."""
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return None
    marker = PLAIN
    if fields[0].startswith("@"):
        marker = {"@cert-authority": CA, "@revoked": REVOKED}.get(fields[0], "")
        fields = fields[1:]
        if not marker:
            return None
    if len(fields) < 3:
        return None
    try:
        blob = base64.b64decode(fields[2], validate=True)
    except (ValueError, binascii.Error):
        return None
    return marker, fields[0], fields[1], blob


def lookup(name: str, files: Iterable[str]) -> HostKeys:
    """Return the :class:`HostKeys` for ``name`` from ``files`` (missing files are skipped,
    as ssh skips them)."""
    found: dict[str, list[KnownKey]] = {PLAIN: [], CA: [], REVOKED: []}
    read: list[str] = []
    for path in files:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        read.append(path)
        for number, line in enumerate(text.splitlines(), 1):
            parsed = parse_line(line)
            if parsed is None:
                continue
            marker, patterns, key_type, blob = parsed
            # Stricter than OpenSSH on purpose: its load_hostkeys (HKF_WANT_MATCH) applies
            # an @revoked line only to the hosts its pattern matches; a key revoked for
            # any host is refused here for every host (docs/architecture.md).
            matched = match_host(patterns, name)
            if marker == REVOKED or matched:
                entry = KnownKey(marker, key_type, blob, f"{path}:{number}", matched)
                found[marker].append(entry)
    return HostKeys(
        name=name,
        plain=tuple(found[PLAIN]),
        authorities=tuple(found[CA]),
        revoked=tuple(found[REVOKED]),
        files=tuple(read),
    )


def hashed_name(name: str, salt: bytes | None = None) -> str:
    """Return ``name`` hashed as ``HashKnownHosts yes`` stores it (``|1|salt|hmac``)."""
    salt = salt if salt is not None else os.urandom(20)
    digest = hmac.new(salt, name.lower().encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def append_key(path: str, name: str, key_type: str, key_b64: str, hashed: bool = False) -> None:
    """Append ``name key_type key_b64`` (the name hashed when ``hashed``) to the known_hosts
    file ``path`` (created 0600 in a 0700 directory when missing), as ``ssh`` does for an
    accepted new key. The line is UTF-8, as :func:`lookup` reads it (ssh writes a name's
    bytes as given)."""
    name = hashed_name(name) if hashed else name
    target = Path(path)
    if str(target) != os.devnull:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "ab") as fh:
        fh.write(f"{name} {key_type} {key_b64}\n".encode())
