"""What both Proxmox-API stand-ins share: pveproxy's transport, envelope and logins.

A ThreadingHTTPServer on 127.0.0.1 behind TLS with a fresh self-signed certificate (as on
a fresh Proxmox node; it carries ``IP:127.0.0.1`` so a client can also trust it as its own
CA), replies in pveproxy's ``{"data": ...}`` envelope, and its two logins: an
``Authorization: PVEAPIToken=USER@REALM!ID=SECRET`` header, or ``POST
/api2/json/access/ticket`` with a password -> a ticket sent back as the ``PVEAuthCookie``
cookie, plus the ``CSRFPreventionToken`` header required on writes; 401 otherwise.
Subclasses answer the endpoints they stand for in :meth:`PveHttpsServer.handle`.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import secrets
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote

COMMON_HEADERS = {
    "Cache-Control": "max-age=0",
    "Pragma": "no-cache",
    "Server": "pve-api-daemon/3.0",
    "Content-Type": "application/json;charset=UTF-8",
}


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """Write a self-signed certificate for 127.0.0.1 and its key; return (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pve1.lab")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "pve-ssl.pem", directory / "pve-ssl.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class PveHttpsServer:
    """pveproxy's transport and logins; subclasses implement :meth:`handle`.

    Args:
        workdir: where the certificate goes.
        token: the accepted API token, ``USER@REALM!ID=SECRET``.
        users: ``{"root@pam": "password"}`` accepted by the password login.
    """

    def __init__(self, workdir: Path, token: str, users: dict[str, str]) -> None:
        self.cert, self.key = self_signed_cert(workdir)
        self.token = token
        self.users = dict(users)
        self.tickets: dict[str, str] = {}  # ticket -> CSRF token
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """Return ``https://127.0.0.1:PORT``."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        """Return ``127.0.0.1:PORT`` (a ``--cluster`` value)."""
        return f"127.0.0.1:{self.port}"

    def start(self):  # type: ignore[no-untyped-def]
        """Serve https on a free port of 127.0.0.1 in a daemon thread; return self."""
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                api.handle(self, "GET")

            def do_POST(self) -> None:
                api.handle(self, "POST")

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        """Answer one request (subclasses)."""
        raise NotImplementedError

    @staticmethod
    def body(req: BaseHTTPRequestHandler) -> str:
        """Return the request body as text."""
        length = int(req.headers.get("Content-Length") or 0)
        return req.rfile.read(length).decode() if length else ""

    def login(self, req: BaseHTTPRequestHandler, body: str) -> None:
        """``POST /access/ticket``: a ticket for a known user and password, else 401."""
        form = {k: v[0] for k, v in parse_qs(body).items()}
        user = form.get("username", "")
        if user not in self.users or self.users[user] != form.get("password"):
            return self.reply(req, 401, None, "authentication failure")
        ticket, csrf = f"PVE:{user}:{secrets.token_hex(8).upper()}", secrets.token_hex(8)
        self.tickets[ticket] = csrf
        data = {"ticket": ticket, "CSRFPreventionToken": csrf, "username": user, "cap": {}}
        return self.reply(req, 200, data)

    def authorized(self, req: BaseHTTPRequestHandler, method: str) -> bool:
        """Return True for the token header, or a ticket cookie (+ its CSRF token on writes)."""
        if req.headers.get("Authorization") == f"PVEAPIToken={self.token}":
            return True
        cookies = dict(
            c.strip().split("=", 1)
            for c in (req.headers.get("Cookie") or "").split(";")
            if "=" in c
        )
        ticket = unquote(cookies.get("PVEAuthCookie", ""))
        if ticket not in self.tickets:
            return False
        return method == "GET" or req.headers.get("CSRFPreventionToken") == self.tickets[ticket]

    def reply(
        self, req: BaseHTTPRequestHandler, status: int, data: object, message: str = ""
    ) -> None:
        """Send ``{"data": data}`` with ``status`` and pveproxy's reason phrase."""
        payload = json.dumps({"data": data, **({"message": message} if message else {})}).encode()
        self.send(req, status, payload, message)

    @staticmethod
    def send(req: BaseHTTPRequestHandler, status: int, payload: bytes, reason: str = "") -> None:
        """Send ``payload`` as pveproxy's JSON with ``status``."""
        req.send_response(status, reason or None)
        for key, value in COMMON_HEADERS.items():
            req.send_header(key, value)
        req.send_header("Content-Length", str(len(payload)))
        req.end_headers()
        req.wfile.write(payload)
