"""A small HTTPS server on 127.0.0.1 that stands for a Proxmox VE node's API (pveproxy).

It serves the RECORDED responses in ``tests/data/pve_api`` (see its README for where
each comes from) under ``/api2/json/...``, with a fresh self-signed certificate, so that
proxmoxer's https backend (requests) really talks HTTP and TLS to it. Authentication is
checked the way pveproxy does: an ``Authorization: PVEAPIToken=USER@REALM!ID=SECRET``
header, or a ``PVEAuthCookie`` ticket from ``POST /access/ticket``; anything else is 401.
Every request is recorded (method, path, query, headers) for the tests to inspect.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from tests.fakes.pve_https import PveHttpsServer

DATA = Path(__file__).resolve().parents[1] / "data" / "pve_api"


@dataclass
class Seen:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: str = ""


@dataclass
class PveApiServer(PveHttpsServer):
    """The stand-in API. ``token_id``/``token_secret`` and ``user``/``password`` are the
    credentials it accepts; ``forbidden`` lists config paths that answer 403. Transport,
    certificate and logins: :mod:`tests.fakes.pve_https` (shared with the fixer's stand-in)."""

    workdir: Path
    token_id: str = "root@pam!gpudoctor"
    token_secret: str = field(default_factory=lambda: str(uuid.uuid4()))
    user: str = "root@pam"
    password: str = "correct horse battery staple"
    forbidden: tuple[str, ...] = ("/nodes/pve2/lxc/220/config",)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        PveHttpsServer.__init__(
            self, self.workdir, f"{self.token_id}={self.token_secret}", {self.user: self.password}
        )

    # -- request handling -----------------------------------------------------------------

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        """Answer one request (recorded in ``seen``)."""
        url = urlparse(req.path)
        body = self.body(req)
        self.seen.append(Seen(method, url.path, parse_qs(url.query), dict(req.headers), body))
        prefix = "/api2/json"
        if not url.path.startswith(prefix):
            return self.reply(req, 404, None, "Not Found")
        path = url.path[len(prefix) :]
        if method == "POST" and path == "/access/ticket":
            return self.login(req, body)
        if not self.authorized(req, method):
            return self.reply(req, 401, None, "No ticket")
        if path in self.forbidden:
            return self.reply(req, 403, None, "Permission check failed (/vms/220, VM.Audit)")
        if path == "/cluster/resources":
            kind = (parse_qs(url.query).get("type") or ["vm"])[0]
            return self.serve_file(req, DATA / "cluster" / f"resources-type-{kind}.json")
        if path.startswith("/nodes/") and path.endswith("/config"):
            return self.serve_file(req, DATA / (path.strip("/") + ".json"))
        return self.reply(req, 501, None, f"Method 'GET {path}' not implemented")

    def serve_file(self, req: BaseHTTPRequestHandler, path: Path) -> None:
        """Send a recorded response, or the API's 500 for a CT that does not exist."""
        if not path.is_file():
            return self.reply(req, 500, None, "Configuration file does not exist")
        self.send(req, 200, path.read_bytes())
