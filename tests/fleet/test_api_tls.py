"""A Proxmox API port that does not speak TLS, told apart from an untrusted certificate:
a real plain-HTTP server (``http.server``) and a real TLS server with a self-signed
certificate (:mod:`tests.fakes.pve_https`), both on 127.0.0.1, reached by the real
proxmoxer/requests stack, through the library and through ``gpudoctor check --cluster``
as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpudoctor.fleet.inventory import InventoryError
from gpudoctor.fleet.proxmox import ApiCredentials, cluster_inventory
from gpudoctor.pve.api import ApiSettings, call
from gpudoctor.pve.api import connect as api_connect
from gpudoctor.pve.apply import ApplyError
from tests.fakes.pve_recorded_api import PveApiServer

NOT_TLS = "this port does not speak TLS/HTTPS (plain HTTP? wrong port?)"
UNTRUSTED = "TLS certificate is not trusted"


@pytest.fixture
def plain_http() -> Iterator[str]:
    """A plain HTTP server on 127.0.0.1 (what a wrong port or `http://` proxy answers
    with); yields ``127.0.0.1:PORT``."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"data": {}}')

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def tls_api(tmp_path: Path) -> Iterator[PveApiServer]:
    server = PveApiServer(tmp_path).start()
    yield server
    server.stop()


def creds(api: PveApiServer, host: str, verify: bool | str) -> ApiCredentials:
    return ApiCredentials(host, token_id=api.token_id, token_secret=api.token_secret,
                          verify=verify)  # fmt: skip


@pytest.mark.parametrize("insecure", [False, True])
def test_plain_http_port_is_named_as_such(
    plain_http: str, tls_api: PveApiServer, insecure: bool
) -> None:
    """The mistake: --cluster names a port where plain HTTP answers (the wrong port, a
    reverse proxy's http side). Reported as "certificate not trusted ... or
    --api-insecure", also when --api-insecure was given, it sent the user to disable
    certificate checks for nothing."""
    with pytest.raises(InventoryError) as caught:
        cluster_inventory(creds(tls_api, plain_http, verify=not insecure))
    message = str(caught.value)
    assert NOT_TLS in message, message
    assert UNTRUSTED not in message and "--api-insecure" not in message
    assert "\n" not in message


def test_self_signed_certificate_is_untrusted_and_accepted_insecure(
    tls_api: PveApiServer,
) -> None:
    with pytest.raises(InventoryError, match=UNTRUSTED) as caught:
        cluster_inventory(creds(tls_api, tls_api.host, verify=True))
    assert NOT_TLS not in str(caught.value)
    inventory, _ = cluster_inventory(creds(tls_api, tls_api.host, verify=False))
    assert inventory.cts, "the TLS server answers once certificates are not checked"


@pytest.mark.parametrize("insecure", [False, True])
def test_fix_api_names_a_plain_http_port(
    plain_http: str, tls_api: PveApiServer, insecure: bool
) -> None:
    """`fix --api https://HOST:PORT` meets the same plain-HTTP port (proxmoxer logs in
    with a token lazily: the first request, as ApiController makes it, meets it)."""
    token = f"{tls_api.token_id}={tls_api.token_secret}"

    def status(url: str, verify: bool) -> None:
        api = api_connect(ApiSettings(url, token=token, verify=verify))
        call("reading the CT status", lambda: api.nodes("pve1").lxc("200").status.current.get())

    with pytest.raises(ApplyError) as caught:
        status(f"https://{plain_http}", verify=not insecure)
    assert NOT_TLS in str(caught.value), str(caught.value)
    assert tls_api.token_secret not in str(caught.value)
    with pytest.raises(ApplyError, match=UNTRUSTED):
        status(tls_api.url, verify=True)


def test_cli_says_plain_http_with_api_insecure(plain_http: str, tls_api: PveApiServer) -> None:
    """As a user runs it: `gpudoctor check --cluster HOST:PORT --api-insecure`."""
    env = {**os.environ, "PVE_TOKEN_ID": tls_api.token_id, "PVE_TOKEN_SECRET": tls_api.token_secret}
    done = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "check", "--cluster", plain_http, "--api-insecure"],
        capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if "warning" not in line]
    assert len(errors) == 1 and NOT_TLS in errors[0], done.stderr
    assert "Traceback" not in done.stderr
