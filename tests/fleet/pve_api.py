"""A small HTTPS server on 127.0.0.1 that stands for a Proxmox VE node's API (pveproxy).

It serves the RECORDED responses in ``tests/fleet/data/pve_api`` (see its README for where
each comes from) under ``/api2/json/...``, with a fresh self-signed certificate, so that
proxmoxer's https backend (requests) really talks HTTP and TLS to it. Authentication is
checked the way pveproxy does: an ``Authorization: PVEAPIToken=USER@REALM!ID=SECRET``
header, or a ``PVEAuthCookie`` ticket from ``POST /access/ticket``; anything else is 401.
Every request is recorded (method, path, query, headers) for the tests to inspect.
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

DATA = Path(__file__).parent / "data" / "pve_api"
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
    import ipaddress

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


@dataclass
class Seen:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: str = ""


@dataclass
class PveApiServer:
    """The stand-in API. ``token_id``/``token_secret`` and ``user``/``password`` are the
    credentials it accepts; ``forbidden`` lists config paths that answer 403."""

    workdir: Path
    token_id: str = "root@pam!gpudoctor"
    token_secret: str = field(default_factory=lambda: str(uuid.uuid4()))
    user: str = "root@pam"
    password: str = "correct horse battery staple"
    forbidden: tuple[str, ...] = ("/nodes/pve2/lxc/220/config",)
    seen: list[Seen] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._ticket = "PVE:root@pam:" + uuid.uuid4().hex.upper()
        self._server: ThreadingHTTPServer | None = None

    @property
    def host(self) -> str:
        """Return the ``--cluster`` value reaching it (``127.0.0.1:PORT``)."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> PveApiServer:
        """Start serving https on a free port of 127.0.0.1 in a thread; return self."""
        cert, key = self_signed_cert(self.workdir)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                api.handle(self, "GET")

            def do_POST(self) -> None:
                api.handle(self, "POST")

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

    # -- request handling -----------------------------------------------------------------

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        """Answer one request (recorded in ``seen``)."""
        url = urlparse(req.path)
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length).decode() if length else ""
        self.seen.append(Seen(method, url.path, parse_qs(url.query), dict(req.headers), body))
        prefix = "/api2/json"
        if not url.path.startswith(prefix):
            return self.reply(req, 404, None, "Not Found")
        path = url.path[len(prefix) :]
        if method == "POST" and path == "/access/ticket":
            return self.login(req, body)
        if not self.authorized(req):
            return self.reply(req, 401, None, "No ticket")
        if path in self.forbidden:
            return self.reply(req, 403, None, "Permission check failed (/vms/220, VM.Audit)")
        if path == "/cluster/resources":
            kind = (parse_qs(url.query).get("type") or ["vm"])[0]
            return self.serve_file(req, DATA / "cluster" / f"resources-type-{kind}.json")
        if path.startswith("/nodes/") and path.endswith("/config"):
            return self.serve_file(req, DATA / (path.strip("/") + ".json"))
        return self.reply(req, 501, None, f"Method 'GET {path}' not implemented")

    def authorized(self, req: BaseHTTPRequestHandler) -> bool:
        """Return True for the right token header or ticket cookie."""
        header = req.headers.get("Authorization", "")
        if header == f"PVEAPIToken={self.token_id}={self.token_secret}":
            return True
        return f"PVEAuthCookie={self._ticket}" in (req.headers.get("Cookie") or "")

    def login(self, req: BaseHTTPRequestHandler, body: str) -> None:
        """``POST /access/ticket``: a ticket for the right user and password, else 401."""
        form = {k: v[0] for k, v in parse_qs(body).items()}
        if form.get("username") != self.user or form.get("password") != self.password:
            return self.reply(req, 401, None, "authentication failure")
        data = {"ticket": self._ticket, "CSRFPreventionToken": uuid.uuid4().hex,
                "username": self.user, "cap": {}}  # fmt: skip
        return self.reply(req, 200, data)

    def serve_file(self, req: BaseHTTPRequestHandler, path: Path) -> None:
        """Send a recorded response, or the API's 500 for a CT that does not exist."""
        if not path.is_file():
            return self.reply(req, 500, None, "Configuration file does not exist")
        payload = path.read_bytes()
        req.send_response(200)
        for key, value in COMMON_HEADERS.items():
            req.send_header(key, value)
        req.send_header("Content-Length", str(len(payload)))
        req.end_headers()
        req.wfile.write(payload)

    def reply(
        self, req: BaseHTTPRequestHandler, status: int, data: object, reason: str = ""
    ) -> None:
        """Send ``{"data": data}`` with ``status`` and pveproxy's reason phrase."""
        payload = json.dumps({"data": data}).encode()
        req.send_response(status, reason or None)
        for key, value in COMMON_HEADERS.items():
            req.send_header(key, value)
        req.send_header("Content-Length", str(len(payload)))
        req.end_headers()
        req.wfile.write(payload)
