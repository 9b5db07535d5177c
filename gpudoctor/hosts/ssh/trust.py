"""Host-key trust, decided as ``ssh -o BatchMode=yes`` decides it, and never weaker.

* Keys are looked up under ``HostKeyAlias`` or ``[host]:port`` in every
  ``UserKnownHostsFile`` and ``GlobalKnownHostsFile`` (plus ``--known-hosts``).
* A host certificate is accepted when a ``@cert-authority`` line for the host signed it
  (signature, validity, principals checked: :mod:`gpudoctor.hosts.ssh.certificates`).
* ``StrictHostKeyChecking``: ``yes`` and ``ask`` (ssh in batch mode cannot ask) refuse an
  unknown key; ``accept-new`` (or ``--accept-new-host-key``) saves the key of a host with
  no key at all in the first known_hosts file. ``no`` is honoured like ``accept-new`` for
  a never-seen host, but a CHANGED key is refused anyway (``ssh`` would go on with a
  warning; gpudoctor runs as root on the host it reaches and does not).
* A key listed ``@revoked`` is refused, and so is a certificate whose key or whose
  signing CA is listed ``@revoked`` (OpenSSH's ``check_key_not_revoked``). OpenSSH applies
  an ``@revoked`` line only to the hosts its pattern matches; gpudoctor applies it to
  every host (stricter on purpose: a revoked key shown by any host is refused).
* ``RevokedHostKeys`` files (plain key lists or KRLs) are read as OpenSSH reads them
  (:mod:`gpudoctor.hosts.ssh.revoked`); one that cannot be read refuses the connection.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.certificates import (
    Certificate,
    check_host_certificate,
    parse_certificate,
)
from gpudoctor.hosts.ssh.known_hosts import HostKeys, append_key, lookup
from gpudoctor.hosts.ssh.matching import plain_key_blob
from gpudoctor.hosts.ssh.revoked import RevocationError, revoked_by_file
from gpudoctor.hosts.ssh.target import SSHTarget

CERT_SUFFIX = "-cert-v01@openssh.com"
# Host key algorithms per known_hosts key type, in OpenSSH's order of preference.
ALGORITHMS = {
    "ssh-ed25519": ("ssh-ed25519",),
    "ecdsa-sha2-nistp256": ("ecdsa-sha2-nistp256",),
    "ecdsa-sha2-nistp384": ("ecdsa-sha2-nistp384",),
    "ecdsa-sha2-nistp521": ("ecdsa-sha2-nistp521",),
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256"),
}


@dataclass(frozen=True)
class TrustPolicy:
    """How one hop's host key is judged.

    Attributes:
        mode: ``yes`` (refuse unknown keys) or ``accept-new`` (save a never-seen host's key).
        files: the known_hosts files read, in order.
        save_to: where an accepted key is written (None: nowhere to write).
        mode_source: what chose the mode, for messages (``StrictHostKeyChecking=no``).
    """

    mode: str
    files: tuple[str, ...]
    save_to: str | None
    mode_source: str = ""


def policy_for(
    target: SSHTarget, extra: str | None, accept_new: bool, use_config_files: bool = True
) -> TrustPolicy:
    """Return the :class:`TrustPolicy` for ``target``: ``extra`` (``--known-hosts``) is read
    first and receives accepted keys; ``accept_new`` is ``--accept-new-host-key``;
    ``use_config_files=False`` ignores the configured known_hosts files (tests)."""
    files: list[str] = [os.path.expanduser(extra)] if extra else []
    if use_config_files:
        files += [
            f for f in (*target.user_known_hosts, *target.global_known_hosts) if f not in files
        ]
    save_to = (
        files[0]
        if extra
        else (target.user_known_hosts[0] if use_config_files and target.user_known_hosts else None)
    )
    configured = target.strict_host_key_checking
    if accept_new:
        return TrustPolicy("accept-new", tuple(files), save_to, "--accept-new-host-key")
    if configured in ("accept-new", "no"):
        return TrustPolicy(
            "accept-new", tuple(files), save_to, f"StrictHostKeyChecking={configured}"
        )
    return TrustPolicy("yes", tuple(files), save_to)


def known_keys(target: SSHTarget, policy: TrustPolicy) -> HostKeys:
    """Return what ``policy.files`` know about ``target`` (under its known_hosts name)."""
    return lookup(target.known_hosts_name, policy.files)


def host_key_order(known: HostKeys, offered: tuple[str, ...]) -> tuple[str, ...]:
    """Return the host key algorithms to offer, best first: certificate algorithms when a
    CA is trusted for the host, then those of the host's known keys, then the rest (as
    OpenSSH orders them, so a host with several keys shows the one known_hosts holds)."""
    plain = [alg for alg in offered if CERT_SUFFIX not in alg]
    known_algs = [alg for t in known.plain_types() for alg in ALGORITHMS.get(t, (t,))]
    first = [alg for alg in known_algs if alg in plain]
    ordered = first + [alg for alg in plain if alg not in first]
    if known.authorities:
        ordered = [alg + CERT_SUFFIX for alg in plain] + ordered
    return tuple(ordered)


def verify_host_key(
    key: Any, target: SSHTarget, policy: TrustPolicy, known: HostKeys, fingerprint: Any
) -> str:
    """Return how the server's ``key`` (a paramiko PKey, a certificate's key when
    ``key.public_blob`` is set) was trusted; raise HostError when it is not."""
    where = target.where
    plain_blob = key.asbytes()
    blob = getattr(key, "public_blob", None)
    key_name = blob.key_type if blob is not None else key.get_name()
    cert = None
    if blob is not None and CERT_SUFFIX in blob.key_type:
        try:
            cert = parse_certificate(blob.key_blob)
        except (ValueError, IndexError, TypeError) as exc:
            raise HostError(f"{where}: the SSH host certificate is malformed: {exc}") from None
    refuse_revoked(target, known, plain_blob, blob.key_blob if cert else None, cert)
    entry = known.revoked_entry(plain_blob)
    if entry is not None:
        other = (
            ""
            if entry.host_matched
            else " for other hosts (gpudoctor applies @revoked to every host; ssh would not)"
        )
        raise HostError(
            f"{where}: the SSH host key {key_name} {fingerprint(key)} is marked @revoked in "
            f"known_hosts ({entry.source}){other}; refusing it. Ask the host's admin for its "
            f"new key"
        )
    if cert is not None:
        return _verify_certificate(cert, key, target, known, fingerprint)
    if any(entry.blob == plain_blob for entry in known.plain):
        return "known host key"
    name = target.known_hosts_name
    if known.plain:
        same_type = [k for k in known.plain if k.key_type == key.get_name()]
        held = ", ".join(known.plain_types())
        detail = (
            f"known_hosts ({same_type[0].source}) holds another {key.get_name()} key"
            if same_type
            else f"known_hosts holds only {held} for it"
        )
        raise HostError(
            f"{where}: the SSH host key has CHANGED: the host now shows {key.get_name()} "
            f"{fingerprint(key)} but {detail}: a reinstalled host or a man in the middle. "
            f"If the change is expected, remove the old key: ssh-keygen -R '{name}'"
            + (f" -f {same_type[0].source.rsplit(':', 1)[0]}" if same_type else "")
            + ", then add the new one"
        )
    if policy.mode == "accept-new" and policy.save_to:
        append_key(policy.save_to, name, key.get_name(), key.get_base64(), target.hash_known_hosts)
        return f"new host key saved to {policy.save_to} ({policy.mode_source})"
    raise HostError(
        f"{where}: unknown SSH host key {key.get_name()} {fingerprint(key)} for '{name}' "
        f"(not in {_files(policy)}); {how_to_accept(target, policy)}"
    )


def refuse_revoked(
    target: SSHTarget,
    known: HostKeys,
    plain_blob: bytes,
    cert_blob: bytes | None,
    cert: Certificate | None,
) -> None:
    """Raise HostError when the host key (``plain_blob``; its certificate ``cert_blob``
    parsed as ``cert``) is revoked: its CA listed ``@revoked`` for the host in
    known_hosts, or the key, the certificate or its CA revoked by a ``RevokedHostKeys``
    file; also when such a file cannot be read (OpenSSH refuses then too). Returns
    nothing otherwise."""
    where = target.where
    if cert is not None:
        entry = known.revoked_entry(cert.signature_key)
        if entry is not None:
            raise HostError(
                f"{where}: the SSH host certificate (id {cert.key_id!r}) is signed by the CA "
                f"{_fp(cert.signature_key)}, which is marked @revoked in known_hosts "
                f"({entry.source}): the host key was revoked; refusing it"
            )
    for path in target.revoked_host_keys:
        try:
            why = revoked_by_file(path, cert_blob or plain_blob, cert)
        except RevocationError as exc:
            raise HostError(
                f"{where}: cannot check the host key against RevokedHostKeys {path}: {exc}; "
                f"refusing to connect (ssh refuses too): fix or remove that file"
            ) from None
        if why is not None:
            raise HostError(
                f"{where}: the SSH host key {_fp(plain_blob)} was revoked by RevokedHostKeys "
                f"{path}: {why}; refusing it"
            )


def _fp(blob: bytes) -> str:
    import base64
    import hashlib

    digest = hashlib.sha256(plain_key_blob(blob)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _verify_certificate(
    cert: Certificate, key: Any, target: SSHTarget, known: HostKeys, fingerprint: Any
) -> str:
    authorities = [ca for ca in (entry.pkey() for entry in known.authorities) if ca is not None]
    name = target.host_key_alias or target.hostname
    reason = check_host_certificate(cert, name, authorities)
    if reason is not None:
        raise HostError(
            f"{target.where}: the SSH host certificate ({key.get_name()} {fingerprint(key)}, "
            f"id {cert.key_id!r}) is refused: {reason}; renew it (ssh-keygen -s CA -h -n {name}) "
            f"or fix the @cert-authority line in known_hosts"
        )
    ca = next(a for a in authorities if a.asbytes() == cert.signature_key)
    return f"host certificate {cert.key_id!r} signed by CA {fingerprint(ca)}"


def _files(policy: TrustPolicy) -> str:
    home = os.path.expanduser("~")
    shown = [f.replace(home, "~", 1) if f.startswith(home + "/") else f for f in policy.files]
    return ", ".join(shown) or "no known_hosts file"


def how_to_accept(target: SSHTarget, policy: TrustPolicy) -> str:
    """Return the advice printed with an unknown-key error (verify, then add the key to
    the known_hosts file gpudoctor and ssh read)."""
    port = f"-p {target.port} " if target.port != 22 else ""
    save = policy.save_to or (
        target.user_known_hosts[0] if target.user_known_hosts else "~/.ssh/known_hosts"
    )
    home = os.path.expanduser("~")
    save = save.replace(home, "~", 1) if save.startswith(home + "/") else save
    rename = f" | sed 's/^[^ ]*/{target.host_key_alias}/'" if target.host_key_alias else ""
    return (
        f"verify the fingerprint, then add it: ssh-keyscan {port}{target.hostname}{rename} "
        f">> {save} (or pass --accept-new-host-key)"
    )
