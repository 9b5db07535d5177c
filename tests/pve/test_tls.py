"""Why a connection to the Proxmox API failed at TLS: told from the error ``requests``
really raises against real servers on 127.0.0.1 (a plain HTTP server where HTTPS was
expected; a self-signed certificate, as on a fresh Proxmox node; a server that only
speaks an older TLS), and from the texts other OpenSSL versions put in the same errors.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import requests

from gpudoctor.pve.tls import tls_failure
from tests.fakes.pve_https import self_signed_cert

NOT_TLS = (
    "this port does not speak TLS/HTTPS (plain HTTP? wrong port?): the answer to the TLS "
    "handshake was not TLS; pveproxy serves https on port 8006"
)
UNTRUSTED = (
    "its TLS certificate is not trusted: pass --api-ca-file with the cluster's CA "
    "(/etc/pve/pve-root-ca.pem), or --api-insecure"
)


class _Hello(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@contextlib.contextmanager
def server(context: ssl.SSLContext | None) -> Iterator[int]:
    """A real HTTP server on 127.0.0.1 (behind TLS when ``context`` is given); its port."""
    httpd = HTTPServer(("127.0.0.1", 0), _Hello)
    if context is not None:
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def tls_context(tmp_path: Path, max_version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    cert, key = self_signed_cert(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if max_version is not None:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.maximum_version = max_version
    return context


def error_of(url: str, **kwargs: object) -> BaseException:
    with pytest.raises(requests.RequestException) as info:
        requests.get(url, timeout=10, **kwargs)
    return info.value


def test_a_plain_http_port_is_said_not_to_speak_tls() -> None:
    with server(None) as port:
        exc = error_of(f"https://127.0.0.1:{port}/api2/json/version", verify=False)
    assert tls_failure(exc, insecure=True) == NOT_TLS
    assert tls_failure(exc, insecure=False) == NOT_TLS


def test_a_self_signed_certificate_asks_for_the_ca_file_unless_insecure(tmp_path) -> None:
    with server(tls_context(tmp_path)) as port:
        exc = error_of(f"https://127.0.0.1:{port}/")
        # the node's own certificate trusted, but reached by another name than it carries
        mismatch = error_of(f"https://localhost:{port}/", verify=str(tmp_path / "pve-ssl.pem"))
    assert tls_failure(exc, insecure=False) == UNTRUSTED
    assert tls_failure(mismatch, insecure=False) == UNTRUSTED
    # --api-insecure: certificates were not checked, so no advice about them
    said = tls_failure(exc, insecure=True)
    assert said is not None and said.startswith("the TLS handshake failed: ")
    assert "certificate verify failed" in said


def test_another_handshake_failure_gives_openssls_reason(tmp_path) -> None:
    context = tls_context(tmp_path, ssl.TLSVersion.TLSv1_2)
    with server(context) as port:
        client = requests.Session()
        adapter = _Tls13Only()
        client.mount("https://", adapter)
        with pytest.raises(requests.RequestException) as info:
            client.get(f"https://127.0.0.1:{port}/", timeout=10, verify=False)
    said = tls_failure(info.value, insecure=True)
    assert said is not None and said.startswith("the TLS handshake failed: ")
    reason = said.removeprefix("the TLS handshake failed: ")
    assert "version" in reason.lower()  # OpenSSL's own words, e.g. tlsv1 alert protocol version
    assert reason[0] not in " :()'\"" and reason[-1] not in " :()'\""
    assert "SSLError" not in reason  # the text after the last SSLError only


class _Tls13Only(requests.adapters.HTTPAdapter):
    """A client that insists on TLS 1.3 (against a server that stops at 1.2)."""

    def init_poolmanager(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        kwargs["ssl_context"] = context
        return super().init_poolmanager(*args, **kwargs)


def test_a_refused_connection_is_no_tls_failure() -> None:
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        exc = error_of(f"https://127.0.0.1:{port}/")
    assert tls_failure(exc, insecure=False) is None
    assert tls_failure(ValueError("bad JSON"), insecure=True) is None


@pytest.mark.parametrize(
    "text",
    [
        "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1000)",  # OpenSSL 1.1/3.0
        "[SSL] record layer failure (_ssl.c:1000)",  # OpenSSL 3.2+
        "[SSL: PACKET_LENGTH_TOO_LONG] packet length too long (_ssl.c:1000)",
        "[SSL: HTTP_REQUEST] http request (_ssl.c:1000)",
        "[SSL: UNKNOWN_PROTOCOL] unknown protocol (_ssl.c:1000)",
        "wrong version number",
        "packet length too long",
    ],
)
def test_every_openssl_wording_of_an_answer_that_is_not_tls(text: str) -> None:
    assert tls_failure(ssl.SSLError(1, text), insecure=False) == NOT_TLS


@pytest.mark.parametrize(
    "text",
    [
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate",
        "certificate verify failed: unable to get local issuer certificate",
        "hostname mismatch, certificate is not valid for 'pve1'",
    ],
)
def test_every_wording_of_an_untrusted_certificate(text: str) -> None:
    assert tls_failure(ssl.SSLError(1, text), insecure=False) == UNTRUSTED
    assert tls_failure(ssl.SSLError(1, text), insecure=True).startswith("the TLS handshake")


@pytest.mark.timeout(20)  # a guard: a chain walk that does not stop at a loop must not hang
def test_the_cause_is_found_down_the_chain_and_a_loop_in_it_ends() -> None:
    inner = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    try:
        try:
            raise inner
        except ssl.SSLError as exc:
            raise ConnectionError("connection aborted") from exc
    except ConnectionError as outer:
        wrapped = outer
    assert tls_failure(wrapped, insecure=False) == NOT_TLS
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__context__, second.__context__ = second, first  # a cycle, as re-raising makes
    assert tls_failure(first, insecure=False) is None
    ssl_only = ConnectionError("ssl: handshake aborted by peer")
    assert tls_failure(ssl_only, insecure=False) == (
        "the TLS handshake failed: ConnectionError: ssl: handshake aborted by peer"
    )


def test_a_long_reason_is_cut_to_one_line_of_160_characters() -> None:
    said = tls_failure(ssl.SSLError(1, "sslv3 alert handshake failure " + "x" * 300), True)
    assert said is not None
    reason = said.removeprefix("the TLS handshake failed: ")
    assert len(reason) == 160 and reason.startswith("sslv3 alert handshake failure xx")


def test_a_cause_given_with_raise_from_is_followed_and_told_after_the_ssl_reason() -> None:
    inner = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    outer = ConnectionError("aborted")
    outer.__cause__ = inner  # no __context__: raised outside an except block
    assert tls_failure(outer, insecure=False) == NOT_TLS
    handshake = ssl.SSLError(1, "sslv3 alert handshake failure")
    handshake.__cause__ = OSError("connection reset by peer")
    assert tls_failure(handshake, insecure=True) == (
        "the TLS handshake failed: sslv3 alert handshake failure | OSError: "
        "connection reset by peer"
    )
