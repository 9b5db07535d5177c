"""Proxmox API credentials: one scheme for ``check`` and ``fix`` (single host and fleet).

A token (``USER@REALM!ID`` + its secret) or a password login (``USER@REALM`` + password),
plus TLS verification (system CAs, a CA file, or off). The secret and the password never
appear in a repr, and :func:`redact` removes them from any text that may be printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# A secret shorter than this cannot be redacted safely (it may be a common substring):
# text that could contain it is never echoed; a fixed message is shown instead.
MIN_REDACTABLE = 8
WITHHELD = (
    "the details are withheld because they could contain a secret shorter than "
    f"{MIN_REDACTABLE} characters; use a longer token secret or password"
)
_WORD = r"A-Za-z0-9_\-"


@dataclass(frozen=True)
class ApiAuth:
    """How to authenticate to, and trust, a Proxmox API.

    Attributes:
        token_id: ``USER@REALM!TOKENID`` (``root@pam!gpudoctor``), or None.
        token_secret: the token's secret (never in a repr).
        user: ``USER@REALM`` for a password login, or None.
        password: its password (never in a repr).
        ca_file: a CA bundle that signed the API's certificate, or None (system CAs).
        insecure: do not verify the certificate at all.
    """

    token_id: str | None = None
    token_secret: str | None = field(default=None, repr=False)
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    insecure: bool = False

    @property
    def verify(self) -> bool | str:
        """Return what to verify the API's certificate with: False, a CA path, or True."""
        return False if self.insecure else (self.ca_file or True)

    @property
    def token(self) -> str:
        """Return ``USER@REALM!ID=SECRET`` (the fixer's form), or "" without a token."""
        if not self.token_id:
            return ""
        return f"{self.token_id}={self.token_secret or ''}"

    def present(self) -> bool:
        """Return True when a token or a user + password was given."""
        return bool(self.token_id or (self.user and self.password))

    def secrets(self) -> tuple[str, ...]:
        """Return the secret strings that must never appear in output."""
        return tuple(s for s in (self.token_secret, self.password) if s)


MISSING = (
    "no Proxmox API credentials; pass --api-token-id USER@REALM!ID with the secret in env "
    "PVE_TOKEN_SECRET (or --api-token-secret-file FILE), or --api-user USER@REALM with env "
    "PVE_PASSWORD (or --api-password-file FILE)"
)


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """Return ``text`` with every whole occurrence of a secret replaced by ``***``.

    A secret is replaced only where it stands as a whole value (not inside a longer word:
    a password ``x`` leaves ``Proxmox`` alone). When the text holds a secret shorter than
    :data:`MIN_REDACTABLE` characters, or a secret inside a longer word, it is not echoed
    at all: the fixed :data:`WITHHELD` is returned instead."""
    present = [s for s in secrets if s]
    if any(len(s) < MIN_REDACTABLE and s in text for s in present):
        return WITHHELD
    for secret in sorted(present, key=len, reverse=True):
        pattern = rf"(?<![{_WORD}]){re.escape(secret)}(?![{_WORD}])"
        text = re.sub(pattern, "***", text)
    if any(s in text for s in present):
        return WITHHELD
    return text
