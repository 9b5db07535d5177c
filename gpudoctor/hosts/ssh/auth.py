"""Client authentication as ``ssh -o BatchMode=yes`` does it: ssh-agent keys
(``$SSH_AUTH_SOCK`` or ``IdentityAgent``), every ``IdentityFile`` (with its
``-cert.pub`` and any matching ``CertificateFile``), ``IdentitiesOnly``, then a password
only when one was given. Nothing prompts; passphrases and passwords are never logged."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import socket
from dataclasses import dataclass
from typing import Any

import paramiko

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.target import SSHTarget


@dataclass(frozen=True)
class Credentials:
    """What the user gave besides the ssh config.

    Attributes:
        key_filename: ``--identity``: a private key tried first.
        password: a password (never logged).
        passphrase: unlocks encrypted key files (never logged).
    """

    key_filename: str | None = None
    password: str | None = None
    passphrase: str | None = None

    def __repr__(self) -> str:  # no secrets in reprs
        return f"Credentials(key_filename={self.key_filename!r})"


class _Agent(paramiko.agent.AgentSSH):
    """An ssh-agent reached at a given socket path (``IdentityAgent`` / ``$SSH_AUTH_SOCK``)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        try:
            sock.connect(path)
            self._connect(sock)
        except (OSError, paramiko.SSHException):
            sock.close()
            self._keys = ()

    def close(self) -> None:
        """Close the agent connection."""
        self._close()


def open_agent(target: SSHTarget) -> _Agent | None:
    """Return the ssh-agent for ``target`` (``IdentityAgent``, else ``$SSH_AUTH_SOCK``),
    or None when none is configured or reachable."""
    path = target.identity_agent
    if path == "none":
        return None
    path = path or os.environ.get("SSH_AUTH_SOCK")
    if not path or not os.path.exists(path):
        return None
    agent = _Agent(path)
    return agent if agent.get_keys() else None


def _public_blob(path: str) -> bytes | None:
    """Return the public key blob of identity ``path`` (from ``path.pub`` or ``path``)."""
    for candidate in (path + ".pub", path):
        try:
            with open(candidate, encoding="ascii", errors="replace") as fh:
                fields = fh.read(65536).split()
        except OSError:
            continue
        for index, value in enumerate(fields[:-1]):
            if value.startswith(("ssh-", "ecdsa-")) and "cert" not in value:
                with contextlib.suppress(ValueError, binascii.Error):
                    return base64.b64decode(fields[index + 1], validate=True)
    return None


def _load_key(path: str, passphrase: str | None) -> Any:
    """Return the private key in ``path``, decrypted with ``passphrase`` only when it is
    encrypted; raise PasswordRequiredException when it is and none was given. The
    certificate paramiko loads from ``path-cert.pub`` is dropped: candidate_keys pairs
    certificates itself and offers the plain key after, as ssh does."""
    try:
        key = paramiko.PKey.from_path(path)
    except TypeError:  # cryptography: "password-protected, but password was not provided"
        if passphrase is None:
            raise paramiko.PasswordRequiredException(path) from None
        key = paramiko.PKey.from_path(path, password=passphrase.encode())
    key.public_blob = None
    return key


def _load_certificates(target: SSHTarget) -> list[paramiko.PublicBlob]:
    """Return the user certificates configured for ``target`` (``CertificateFile`` and
    ``IDENTITY-cert.pub`` beside each identity file) that exist."""
    paths = list(target.certificate_files) + [f + "-cert.pub" for f in target.identity_files]
    certs: list[paramiko.PublicBlob] = []
    for path in paths:
        if os.path.isfile(path):
            with contextlib.suppress(ValueError, OSError):
                certs.append(paramiko.PublicBlob.from_file(path))
    return certs


def _cert_for(key: Any, certs: list[paramiko.PublicBlob]) -> paramiko.PublicBlob | None:
    """Return the certificate in ``certs`` whose public key is ``key``'s, or None (a
    certificate repeats the key's public fields right after its nonce)."""
    plain = paramiko.Message(key.asbytes())
    plain.get_text()
    fields = plain.get_remainder()
    for cert in certs:
        msg = paramiko.Message(cert.key_blob)
        msg.get_text()
        msg.get_string()  # nonce
        if msg.get_remainder().startswith(fields):
            return cert
    return None


def candidate_keys(
    target: SSHTarget, creds: Credentials, agent: _Agent | None
) -> tuple[list[tuple[str, Any]], list[str]]:
    """Return ``([(label, key), ...], notes)``: the keys to offer in order (certificates
    before their plain keys) and why some configured identities were skipped."""
    notes: list[str] = []
    agent_keys = list(agent.get_keys()) if agent else []
    by_blob = {k.asbytes(): k for k in agent_keys}
    certs = _load_certificates(target)
    out: list[tuple[str, Any]] = []
    used: set[bytes] = set()
    files = ([os.path.expanduser(creds.key_filename)] if creds.key_filename else []) + [
        f for f in target.identity_files if f != creds.key_filename
    ]
    for path in files:
        blob = _public_blob(path)
        if blob is not None and blob in by_blob:
            key: Any = by_blob[blob]
            label = f"agent key for {path}"
        elif path.endswith(".pub") and blob is not None:
            where = "the ssh-agent does not hold it" if agent else "no ssh-agent is reachable"
            notes.append(f"{path} is a public key and {where}")
            continue
        elif os.path.isfile(path):
            try:
                key = _load_key(path, creds.passphrase)
            except paramiko.PasswordRequiredException:
                notes.append(f"{path} is encrypted (load it into ssh-agent: ssh-add {path})")
                continue
            except (paramiko.SSHException, ValueError, OSError) as exc:
                notes.append(f"{path} cannot be loaded ({type(exc).__name__})")
                continue
            label = path
        else:
            continue
        if key.asbytes() in used:
            continue
        used.add(key.asbytes())
        out.append((label, key))
    if not target.identities_only:
        out += [
            (f"agent key {k.comment or k.get_name()}", k)
            for k in agent_keys
            if k.asbytes() not in used
        ]
    with_certs: list[tuple[str, Any]] = []
    for label, key in out:
        cert = _cert_for(key, certs) if certs and "cert" not in key.get_name() else None
        if cert is not None:
            certified = _with_certificate(key, cert)
            if certified is not None:
                with_certs.append((f"{label} + certificate", certified))
        with_certs.append((label, key))
    return with_certs, notes


def _with_certificate(key: Any, cert: paramiko.PublicBlob) -> Any:
    """Return a copy of ``key`` that presents ``cert`` (None when it cannot)."""
    if isinstance(key, paramiko.AgentKey):
        return None  # an agent holding the certificate lists it as a key of its own
    import copy

    if not cert.key_type.startswith(key.get_name()):
        return None
    clone = copy.copy(key)
    clone.public_blob = cert
    return clone


def authenticate(
    transport: paramiko.Transport, target: SSHTarget, creds: Credentials, timeout: float
) -> None:
    """Authenticate ``target.user`` on ``transport``; raise HostError naming what was
    tried (key files, agent key comments; never a secret) when nothing worked."""
    transport.auth_timeout = timeout
    agent = open_agent(target)
    tried: list[str] = []
    try:
        keys, notes = candidate_keys(target, creds, agent)
        for label, key in keys:
            try:
                remaining = transport.auth_publickey(target.user, key)
            except paramiko.BadAuthenticationType as exc:
                notes.append(f"the server allows only {', '.join(exc.allowed_types)}")
                break
            except paramiko.AuthenticationException:
                tried.append(label)
                continue
            except paramiko.SSHException as exc:
                raise HostError(f"{target.where}: SSH authentication broke off: {exc}") from None
            if transport.is_authenticated():
                return
            tried.append(f"{label} (server wants also {', '.join(remaining)})")
        if creds.password is not None:
            try:
                transport.auth_password(target.user, creds.password)
                if transport.is_authenticated():
                    return
            except paramiko.AuthenticationException:
                tried.append("password")
    finally:
        if agent is not None:
            agent.close()
    offered = "; ".join(tried) if tried else "no usable key"
    extra = f"; {'; '.join(notes)}" if notes else ""
    raise HostError(
        f"{target.where}: SSH authentication failed (tried: {offered}{extra}); load a key "
        f"into ssh-agent (ssh-add), set IdentityFile for this host in ~/.ssh/config, or "
        f"pass --identity"
    )
