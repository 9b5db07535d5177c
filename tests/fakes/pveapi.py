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

Transport, certificate and logins: :mod:`tests.fakes.pve_https` (shared with the fleet's
stand-in).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote

from gpudoctor.hosts.base import CommandResult
from tests.fakes.pve_https import PveHttpsServer

Runner = Callable[[Sequence[str]], CommandResult]


class FakePveApi(PveHttpsServer):
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
        super().__init__(workdir, token, users or {})
        self.node, self.conf_dir, self.run, self.pct = node, conf_dir, run, pct
        self.requests: list[tuple[str, str]] = []
        self.tasks: dict[str, CommandResult | None] = {}

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        path = unquote(req.path.split("?", 1)[0])
        self.requests.append((method, path))
        body = self.body(req)
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
