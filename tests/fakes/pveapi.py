"""A small stand-in for Proxmox VE's REST API (pveproxy), for lab tests only.

pveproxy cannot run here, so this HTTPS server on 127.0.0.1 answers the few endpoints
``gpudoctor fix --api`` uses, with Proxmox's JSON shapes (``{"data": ...}``) and API-token
auth (``Authorization: PVEAPIToken=USER@REALM!ID=SECRET``) or password login
(``POST /api2/json/access/ticket`` -> a ticket sent back as the ``PVEAuthCookie`` cookie,
plus the ``CSRFPreventionToken`` header on writes), 401 otherwise:

* ``GET  /api2/json/nodes/N/lxc/ID/status/current`` -> ``{"status": "running"|"stopped"}``
  (from ``pct status`` of the pct stand-in);
* ``GET  /api2/json/nodes/N/lxc/ID/config`` -> ``{"digest": SHA-1 of the config file}``
  (Proxmox's digest is the SHA-1 of the raw file);
* ``POST /api2/json/nodes/N/lxc/ID/status/{start,stop,reboot}`` -> a UPID; the action runs
  ``pct ACTION ID`` in the background, as a Proxmox worker task does;
* ``GET  /api2/json/nodes/N/tasks/UPID/status`` -> ``{"status": "running"|"stopped",
  "exitstatus": "OK" | "command '...' failed: exit code N"}``.

The certificate is self-signed (made with ``openssl``), as on a fresh Proxmox node.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import ssl
import subprocess
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote

from gpudoctor.hosts.base import CommandResult

Runner = Callable[[Sequence[str]], CommandResult]


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """Create a key and a self-signed certificate for 127.0.0.1; return (cert, key)."""
    cert, key = directory / "pve-ssl.pem", directory / "pve-ssl.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
         "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


class FakePveApi:
    """The stand-in API for one node.

    Args:
        node: the node name in the URLs.
        conf_dir: ``<pve-root>/nodes/<node>/lxc``.
        run: runs a command on the node (the lab namespace), for ``pct``.
        pct: the pct stand-in command.
        token: the only accepted API token (``USER@REALM!ID=SECRET``).
        workdir: where the certificate goes.
        users: ``{"root@pam": "password"}`` accepted by the password login.
    """

    def __init__(
        self,
        node: str,
        conf_dir: Path,
        run: Runner,
        pct: str,
        token: str,
        workdir: Path,
        users: dict[str, str] | None = None,
    ) -> None:
        self.node, self.conf_dir, self.run, self.pct, self.token = node, conf_dir, run, pct, token
        self.users = dict(users or {})
        self.tickets: dict[str, str] = {}  # ticket -> CSRF token
        self.cert, self.key = self_signed_cert(workdir)
        self.requests: list[tuple[str, str]] = []
        self.tasks: dict[str, CommandResult | None] = {}
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """Return ``https://127.0.0.1:PORT``."""
        assert self.server is not None
        return f"https://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakePveApi:
        """Listen on a free port of 127.0.0.1 (TLS) in a daemon thread; return self."""
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                api.handle(self, "GET")

            def do_POST(self) -> None:
                api.handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop the server and wait for running tasks."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        path = unquote(req.path.split("?", 1)[0])
        self.requests.append((method, path))
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length).decode() if length else ""
        if path == "/api2/json/access/ticket" and method == "POST":
            return self.login(req, body)
        if not self.authorized(req, method):
            return self.reply(req, 401, None, "authentication failure")
        parts = path.removeprefix("/api2/json/").split("/")
        if parts[:2] != ["nodes", self.node]:
            return self.reply(req, 404, None, "no such node")
        rest = parts[2:]
        if rest[:1] == ["lxc"] and len(rest) >= 3:
            return self.ct(req, method, rest[1], rest[2:])
        if rest[:1] == ["tasks"] and rest[2:] == ["status"] and method == "GET":
            return self.task(req, rest[1])
        return self.reply(req, 501, None, "not in the stand-in")

    def login(self, req: BaseHTTPRequestHandler, body: str) -> None:
        form = {k: v[0] for k, v in parse_qs(body).items()}
        user = form.get("username", "")
        if user not in self.users or self.users[user] != form.get("password"):
            return self.reply(req, 401, None, "authentication failure")
        ticket, csrf = f"PVE:{user}:{secrets.token_hex(8)}", secrets.token_hex(8)
        self.tickets[ticket] = csrf
        return self.reply(
            req, 200, {"ticket": ticket, "CSRFPreventionToken": csrf, "username": user}
        )

    def authorized(self, req: BaseHTTPRequestHandler, method: str) -> bool:
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

    def ct(self, req: BaseHTTPRequestHandler, method: str, vmid: str, rest: list[str]) -> None:
        conf = self.conf_dir / f"{vmid}.conf"
        if not conf.exists():
            return self.reply(req, 500, None, f"Configuration file '{vmid}.conf' does not exist")
        if method == "GET" and rest == ["config"]:
            return self.reply(req, 200, {"digest": hashlib.sha1(conf.read_bytes()).hexdigest()})
        if method == "GET" and rest == ["status", "current"]:
            out = self.run([self.pct, "status", vmid]).stdout
            return self.reply(req, 200, {"status": out.split(":")[-1].strip(), "vmid": vmid})
        if (
            method == "POST"
            and rest[:1] == ["status"]
            and rest[1:] in (["start"], ["stop"], ["reboot"])
        ):
            action = rest[1]
            upid = f"UPID:{self.node}:{len(self.tasks):08X}:00000000:00000000:vz{action}:{vmid}:root@pam!t:"
            self.tasks[upid] = None

            def work() -> None:
                self.tasks[upid] = self.run([self.pct, action, vmid])

            threading.Thread(target=work, daemon=True).start()
            return self.reply(req, 200, upid)
        return self.reply(req, 501, None, "not in the stand-in")

    def task(self, req: BaseHTTPRequestHandler, upid: str) -> None:
        if upid not in self.tasks:
            return self.reply(req, 500, None, "no such task")
        result = self.tasks[upid]
        if result is None:
            return self.reply(req, 200, {"status": "running", "upid": upid})
        exitstatus = "OK" if result.ok else (
            f"command 'pct' failed: exit code {result.returncode}: {result.stderr.strip()}"
        )  # fmt: skip
        return self.reply(req, 200, {"status": "stopped", "exitstatus": exitstatus, "upid": upid})

    def reply(
        self, req: BaseHTTPRequestHandler, code: int, data: object, message: str = ""
    ) -> None:
        body = json.dumps({"data": data, **({"message": message} if message else {})}).encode()
        req.send_response(code, message or "OK")
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
