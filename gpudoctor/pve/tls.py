"""Why a TLS connection to the Proxmox API failed, told apart from the text of the
``ssl``/``requests`` error (``curl -v https://HOST:8006/`` shows the same cases):

* the port does not speak TLS at all (a plain HTTP server, another service, a wrong
  port): OpenSSL reads the peer's first bytes as a TLS record and fails with
  ``WRONG_VERSION_NUMBER`` (``record layer failure`` in OpenSSL 3.2+,
  ``PACKET_LENGTH_TOO_LONG``, ``HTTP_REQUEST``, ``unknown protocol``);
* the certificate is not trusted (``CERTIFICATE_VERIFY_FAILED``, a host name mismatch);
* any other handshake failure (its reason, verbatim).
"""

from __future__ import annotations

NOT_TLS_MARKERS = (
    "wrong_version_number",
    "wrong version number",
    "record layer failure",
    "packet_length_too_long",
    "packet length too long",
    "http_request",
    "unknown protocol",
)
UNTRUSTED_MARKERS = ("certificate_verify_failed", "certificate verify failed", "hostname mismatch")


def _chain_text(exc: BaseException) -> str:
    parts, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return " | ".join(parts)


def tls_failure(exc: BaseException, insecure: bool) -> str | None:
    """Return the one-phrase reason ``exc`` (from requests/proxmoxer/ssl) is a TLS
    failure, or None when it is not one. ``insecure`` is ``--api-insecure`` (then no
    certificate advice is given: certificates were not checked)."""
    text = _chain_text(exc)
    lower = text.lower()
    if any(marker in lower for marker in NOT_TLS_MARKERS):
        return (
            "this port does not speak TLS/HTTPS (plain HTTP? wrong port?): the answer to "
            "the TLS handshake was not TLS; pveproxy serves https on port 8006"
        )
    if any(marker in lower for marker in UNTRUSTED_MARKERS) and not insecure:
        return (
            "its TLS certificate is not trusted: pass --api-ca-file with the cluster's CA "
            "(/etc/pve/pve-root-ca.pem), or --api-insecure"
        )
    if "sslerror" in lower or "ssl:" in lower:
        reason = text.rpartition("SSLError")[2].strip(" :()'\"")[:160]
        return f"the TLS handshake failed: {reason}"
    return None
