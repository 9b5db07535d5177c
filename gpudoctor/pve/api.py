"""The Proxmox API side of ``gpudoctor fix --api``: CT status, config digest, restarts as
tasks whose UPIDs are polled until they stop with exit status ``OK`` (proxmoxer, https).

Raw ``lxc.*`` keys cannot be written through the API (Proxmox refuses them), so the
config write always goes over SSH; the API drives the CT's lifecycle and cross-checks
that SSH and the API see the same config (the API's ``digest`` is the SHA-1 of the file).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gpudoctor.hosts.base import Host
from gpudoctor.pve.apply import ApplyError, Layout, Target
from gpudoctor.pve.restart import START_TIMEOUT_S, STOP_TIMEOUT_S, Controller

DEFAULT_PORT = 8006


@dataclass(frozen=True)
class ApiSettings:
    """How to reach the Proxmox API.

    Attributes:
        url: ``https://pve1:8006`` (port 8006 when omitted).
        token: ``USER@REALM!TOKENID=SECRET`` (never logged); or else
        user, password: ``root@pam`` and its password (a ticket is fetched; never logged).
        verify: True (system CAs), False (no verification), or a CA bundle path.
        timeout: seconds per HTTP request.
    """

    url: str
    token: str = ""
    verify: bool | str = True
    timeout: float = 15.0
    user: str = ""
    password: str = ""

    def __repr__(self) -> str:  # no secrets in reprs
        return f"ApiSettings(url={self.url!r}, user={self.user!r}, verify={self.verify!r})"


def split_token(token: str) -> tuple[str, str, str]:
    """Return ``(user@realm, token id, secret)`` from ``USER@REALM!ID=SECRET``;
    raise ApplyError("usage") when malformed."""
    head, eq, secret = token.partition("=")
    user, bang, token_id = head.partition("!")
    if not (eq and bang and "@" in user and token_id and secret):
        raise ApplyError("usage", "--api-token must look like USER@REALM!TOKENID=SECRET")
    return user, token_id, secret


def connect(settings: ApiSettings) -> Any:
    """Return a ``proxmoxer.ProxmoxAPI`` for the settings (https, API token auth)."""
    from proxmoxer import ProxmoxAPI

    parts = urlsplit(settings.url if "://" in settings.url else f"https://{settings.url}")
    if parts.scheme != "https" or not parts.hostname:
        raise ApplyError("usage", f"--api {settings.url!r}: expected https://HOST[:PORT]")
    common = {
        "port": parts.port or DEFAULT_PORT,
        "verify_ssl": settings.verify,
        "timeout": settings.timeout,
    }
    if settings.token:
        user, token_id, secret = split_token(settings.token)
        auth = {"user": user, "token_name": token_id, "token_value": secret}
    elif settings.user and settings.password:
        auth = {"user": settings.user, "password": settings.password}
    else:
        raise ApplyError("usage", "--api needs --api-token, or --api-user and --api-password")
    host = parts.hostname
    return call(
        "logging in",
        lambda: ProxmoxAPI(host, **common, **auth),
        insecure=settings.verify is False,
        where=f"https://{host}:{common['port']}",
    )


def call(what: str, request: Callable[[], Any], insecure: bool = False, where: str = "") -> Any:
    """Run one API request; turn any proxmoxer/HTTP failure into ApplyError("api") (a
    TLS failure named: a port that does not speak TLS, an untrusted certificate)."""
    from gpudoctor.pve.tls import tls_failure

    try:
        return request()
    except ApplyError:
        raise
    except Exception as exc:  # proxmoxer raises ResourceException, requests its own
        at = f" at {where}" if where else ""
        tls = tls_failure(exc, insecure)
        if tls is not None:
            raise ApplyError("api", f"Proxmox API{at}: {what} failed: {tls}") from None
        raise ApplyError("api", f"Proxmox API{at}: {what} failed: {exc}") from None


class ApiController(Controller):
    """A Proxmox CT driven through the API (``POST .../status/reboot`` + task polling);
    the init PID still comes from ``lxc-info`` over SSH (the API does not promise it)."""

    def __init__(
        self,
        host: Host,
        target: Target,
        layout: Layout,
        api: Any,
        poll_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(host, target, layout)
        self.api = api
        self.poll_s = poll_s
        self.sleep = sleep

    def _ct(self) -> Any:
        return self.api.nodes(self.target.node).lxc(self.target.ct)

    def digest(self) -> str:
        """Return the config digest the API reports (``GET .../lxc/ID/config``)."""
        return str(call("reading the CT config", lambda: self._ct().config.get())["digest"])

    def state(self) -> str:
        """Return ``RUNNING`` / ``STOPPED`` from ``GET .../lxc/ID/status/current``."""
        data = call("reading the CT status", lambda: self._ct().status.current.get())
        return str(data["status"]).upper()

    def _task(self, action: str, timeout: float) -> None:
        upid = call(f"{action} of CT {self.target.ct}", lambda: self._ct().status(action).post())
        self.wait_task(str(upid), timeout, action)

    def wait_task(self, upid: str, timeout: float, action: str) -> None:
        """Poll ``GET /nodes/NODE/tasks/UPID/status`` until it stops; raise ApplyError
        unless its exit status is ``OK`` (or at ``timeout`` seconds)."""
        tasks = self.api.nodes(self.target.node).tasks
        deadline = time.monotonic() + timeout
        while True:
            status = call(f"polling task {upid}", lambda: tasks(upid).status.get())
            if status.get("status") == "stopped":
                if status.get("exitstatus") != "OK":
                    raise ApplyError(
                        "start_failed" if action != "stop" else "stop_failed",
                        f"{action} task {upid} ended with: {status.get('exitstatus')}",
                    )
                return
            if time.monotonic() >= deadline:
                raise ApplyError(
                    "start_failed", f"{action} task {upid} still running after {timeout:g} s"
                )
            self.sleep(self.poll_s)

    def start(self) -> None:
        """Start the CT through the API and wait for the task."""
        self._task("start", START_TIMEOUT_S)

    def stop(self) -> None:
        """Stop the CT through the API and wait for the task."""
        self._task("stop", STOP_TIMEOUT_S)

    def restart(self) -> None:
        """Reboot the CT through the API (the caller checked the lock) and wait for it."""
        self._task("reboot", START_TIMEOUT_S + STOP_TIMEOUT_S)
