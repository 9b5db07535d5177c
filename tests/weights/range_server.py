"""Small HTTP(S) servers on loopback that serve byte ranges, standing in for the Hugging
Face Hub's ``/resolve/`` route and the CDN it redirects big files to (another host:
another port here), for the ranged downloader (gpudoctor.weights.fetch).

Each is a real ``http.server`` (HTTP/1.1 keep-alive, optionally behind TLS with a
self-signed certificate for 127.0.0.1) serving ``DATA``. Knobs make it misbehave the
ways real servers and networks do; ``script`` gives the next requests' answers one by
one (then ``"ok"``): ``"half"`` sends half the body and closes, ``"hangup"`` closes
without a word, ``"whole"`` ignores ``Range`` (200 and the whole body), ``"stall"``
answers nothing until :attr:`Server.release` is set (or 6 s) and then closes,
``"endless"`` starts a 500 error page of 10 MiB, sends ``body`` and then waits as
``"stall"`` does.
"""

from __future__ import annotations

import os
import random
import re
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpudoctor.weights import fetch

DATA = random.Random(5).randbytes(50_000)
STALL_CAP_S = 6.0


@dataclass
class Server:
    """One loopback server serving ``DATA`` with ranges, and what it was asked."""

    httpd: ThreadingHTTPServer
    scheme: str = "http"
    requests: list[dict[str, str]] = field(default_factory=list)
    redirect_to: str | None = None  # answer a redirect to this URL + the request's path
    redirect_status: int = 302
    redirect_query: str = ""  # appended to the redirect's Location (a signed CDN URL)
    redirect_location: bool = True  # False: a redirect without a Location header
    status: int | None = None  # answer this status with a body, instead of the bytes
    refuse: dict[str, int] = field(default_factory=dict)  # {file name: status}: as ``status``
    body: bytes = b"no such file\nsecond line\n"
    drops: int = 0  # this many answers stop halfway (the connection is closed)
    whole: bool = False  # ignore Range: 200 and the whole body
    overshoot: bool = False  # answer 206 with every byte from the range's start to the end
    close_after: bool = False  # close each connection after its answer, without saying so
    script: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    ended: list[int] = field(default_factory=list)  # client ports whose connection ended
    changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}"

    def wait_ended(self, port: int, timeout: float = 10.0) -> bool:
        """Return True once the connection from ``port`` has ended (False after ``timeout``)."""
        with self.changed:
            return self.changed.wait_for(lambda: port in self.ended, timeout)


class _Handler(BaseHTTPRequestHandler):
    server_state: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            state = self.server_state
            with state.changed:
                state.ended.append(self.client_address[1])
                state.changed.notify_all()

    def do_GET(self) -> None:
        state = self.server_state
        state.requests.append(
            {"path": self.path, "port": str(self.client_address[1]), **dict(self.headers.items())}
        )
        action = state.script.pop(0) if state.script else "ok"
        if state.close_after:
            self.close_connection = True
        if action == "hangup":
            self.close_connection = True
            return
        if action == "stall":
            state.release.wait(STALL_CAP_S)
            self.close_connection = True
            return
        if state.redirect_to is not None:
            self.send_response(state.redirect_status)
            if state.redirect_location:
                self.send_header("Location", state.redirect_to + self.path + state.redirect_query)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status = state.refuse.get(self.path.rsplit("/", 1)[-1], state.status)
        if action == "endless":  # an error page that never ends: its start, then nothing
            self.send_response(500)
            self.send_header("Content-Length", str(10 << 20))
            self.end_headers()
            self.wfile.write(state.body)
            self.wfile.flush()
            state.release.wait(STALL_CAP_S)
            self.close_connection = True
            return
        if status is not None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)
            return
        m = re.match(r"bytes=(\d+)-(\d+)$", self.headers.get("Range", ""))
        whole = state.whole or action == "whole"
        start, end = (int(m.group(1)), int(m.group(2))) if m and not whole else (0, -1)
        if state.overshoot:
            end = len(DATA) - 1
        chunk = DATA[start : end + 1] if end >= 0 else DATA
        self.send_response(200 if end < 0 else 206)
        self.send_header("Content-Length", str(len(chunk)))
        self.end_headers()
        if state.drops > 0 or action == "half":
            state.drops -= action != "half"
            self.wfile.write(chunk[: len(chunk) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(chunk)


def tls_context(directory: Path) -> tuple[ssl.SSLContext, Path]:
    """Return a server TLS context with a fresh self-signed certificate for 127.0.0.1, and
    the certificate's path (a client trusts it as its CA)."""
    from tests.fakes.pve_https import self_signed_cert

    cert, key = self_signed_cert(directory)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, cert


def start_servers(count: int, tls: ssl.SSLContext | None = None) -> list[Server]:
    """Start ``count`` servers (behind ``tls`` when given) in daemon threads."""
    made = []
    for _ in range(count):
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        httpd.daemon_threads = True
        state = Server(httpd, scheme="https" if tls else "http")
        if tls is not None:
            httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
        httpd.RequestHandlerClass = type("H", (_Handler,), {"server_state": state})
        threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True).start()
        made.append(state)
    return made


def stop_servers(made: list[Server]) -> None:
    """Release stalled answers, stop the servers and close their sockets."""
    for state in made:
        state.release.set()
        state.httpd.shutdown()
        state.httpd.server_close()


def download(
    hub: Server,
    tmp_path: Path,
    sizes: dict[str, int],
    token: str | None = "hf_tok",
    connections: int = 2,
    on_bytes_too: Callable[[str, int], None] | None = None,
    on_file_too: Callable[[str, Path], None] | None = None,
) -> tuple[list[str], dict[str, int], dict[str, bytes]]:
    """Fetch ``sizes`` ({path: bytes}) from ``hub`` into ``tmp_path/inc`` over ``connections``;
    return (the paths left for another way, bytes counted per path, finished files' bytes).
    ``on_bytes_too`` / ``on_file_too`` are called too, from the downloading threads."""
    incomplete = tmp_path / "inc"
    incomplete.mkdir(exist_ok=True)
    got: dict[str, int] = {}
    files: dict[str, bytes] = {}
    lock = threading.Lock()

    def on_bytes(path: str, n: int) -> None:
        with lock:
            got[path] = got.get(path, 0) + n
        if on_bytes_too is not None:
            on_bytes_too(path, n)

    def on_file(path: str, temp: Path) -> None:
        files[path] = temp.read_bytes()
        assert temp.stat().st_mode & 0o777 == 0o600
        if on_file_too is not None:
            on_file_too(path, temp)

    url_of = lambda p: fetch.resolve_url(hub.url + "/", "acme/x", "abc", p)  # noqa: E731
    downloader = fetch.RangedDownloader(url_of, token, connections)
    left = downloader.download(sizes, incomplete, on_bytes, on_file)
    return left, got, files


def open_files_under(root: Path) -> list[str]:
    """Return what this process holds open under ``root`` (``ls -l /proc/self/fd``)."""
    held = []
    for n in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{n}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if target.startswith(str(root)):
            held.append(target)
    return held
