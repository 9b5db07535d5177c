"""The ranged downloader against small real HTTP servers on loopback (fast, in-process):
a token goes to the Hub's own host only, a redirect is followed once per file and then
remembered, a connection that drops mid-range is resumed where it stopped (twice at
most), and a server's refusal is one line. The servers are ``http.server`` instances
standing in for the Hub and its CDN (another host: another port here)."""

from __future__ import annotations

import os
import random
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpudoctor.weights import fetch
from gpudoctor.weights.errors import WeightsError

DATA = random.Random(5).randbytes(50_000)


@dataclass
class Server:
    """One loopback HTTP server serving ``DATA`` with ranges, and what it was asked."""

    httpd: ThreadingHTTPServer
    requests: list[dict[str, str]] = field(default_factory=list)
    redirect_to: str | None = None  # answer 302 to this URL (the Hub sending to its CDN)
    status: int | None = None  # answer this status with a body, instead of the bytes
    body: bytes = b"no such file\nsecond line\n"
    drops: int = 0  # this many answers stop halfway (the connection is closed)
    whole: bool = False  # ignore Range: 200 and the whole body

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server_state: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        state = self.server_state
        state.requests.append({"path": self.path, **dict(self.headers.items())})
        if state.redirect_to is not None:
            self.send_response(302)
            self.send_header("Location", state.redirect_to + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if state.status is not None:
            self.send_response(state.status)
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)
            return
        m = re.match(r"bytes=(\d+)-(\d+)$", self.headers.get("Range", ""))
        start, end = (int(m.group(1)), int(m.group(2))) if m and not state.whole else (0, -1)
        chunk = DATA[start : end + 1] if end >= 0 else DATA
        self.send_response(200 if end < 0 else 206)
        self.send_header("Content-Length", str(len(chunk)))
        self.end_headers()
        if state.drops > 0:
            state.drops -= 1
            self.wfile.write(chunk[: len(chunk) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(chunk)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []

    def make() -> Server:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        httpd.daemon_threads = True
        state = Server(httpd)
        httpd.RequestHandlerClass = type("H", (_Handler,), {"server_state": state})
        threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True).start()
        made.append(state)
        return state

    yield [make(), make()]  # the Hub and its CDN
    for state in made:
        state.httpd.shutdown()
        state.httpd.server_close()


def download(hub: Server, tmp_path: Path, sizes: dict[str, int], token: str | None = "hf_tok"):
    incomplete = tmp_path / "inc"
    incomplete.mkdir(exist_ok=True)
    got: dict[str, int] = {}
    files: dict[str, bytes] = {}
    lock = threading.Lock()

    def on_bytes(path: str, n: int) -> None:
        with lock:
            got[path] = got.get(path, 0) + n

    def on_file(path: str, temp: Path) -> None:
        files[path] = temp.read_bytes()
        assert temp.stat().st_mode & 0o777 == 0o600

    url_of = lambda p: fetch.resolve_url(hub.url + "/", "acme/x", "abc", p)  # noqa: E731
    left = fetch.RangedDownloader(url_of, token, 2).download(sizes, incomplete, on_bytes, on_file)
    return left, got, files


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "RANGE_BYTES", 20_000)
    monkeypatch.setattr(fetch, "BUFFER_BYTES", 7_000)


def test_resolve_url_quotes_the_path() -> None:
    assert fetch.resolve_url("https://hub/", "acme/x", "abc", "sub/a b#.json") == (
        "https://hub/acme/x/resolve/abc/sub/a%20b%23.json"
    )


def test_the_default_range_size_is_used_when_none_is_given() -> None:
    jobs = fetch.plan_ranges({"a": 45_000})
    assert [(j.offset, j.length) for j in jobs] == [(0, 20_000), (20_000, 20_000), (40_000, 5_000)]
    assert fetch.plan_ranges({}) == []


def test_proxies_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    assert not fetch.proxies_in_use("https://huggingface.co/x")
    monkeypatch.setenv("https_proxy", "http://proxy:3128")
    assert fetch.proxies_in_use("https://huggingface.co/x")
    assert not fetch.proxies_in_use("http://huggingface.co/x")
    monkeypatch.setenv("no_proxy", "huggingface.co")
    assert not fetch.proxies_in_use("https://huggingface.co/x")
    monkeypatch.delenv("no_proxy")
    monkeypatch.delenv("https_proxy")
    monkeypatch.setenv("all_proxy", "socks5://proxy:1080")
    assert fetch.proxies_in_use("http://127.0.0.1:1/x")


def test_the_ca_bundle_named_by_the_environment_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(OSError):  # the file named is really read
        fetch._ssl_context()
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with pytest.raises(OSError):
        fetch._ssl_context()
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    assert fetch._ssl_context().verify_mode.name == "CERT_REQUIRED"


def test_every_byte_lands_and_the_token_goes_to_the_hub(servers, tmp_path: Path) -> None:
    hub, _ = servers
    left, got, files = download(hub, tmp_path, {"w.bin": 50_000, "s.bin": 30_000})
    assert left == []
    assert files == {"w.bin": DATA, "s.bin": DATA[:30_000]}
    assert got == {"w.bin": 50_000, "s.bin": 30_000}
    ranges = sorted(r["Range"] for r in hub.requests)
    assert ranges == sorted(
        ["bytes=0-19999", "bytes=20000-39999", "bytes=40000-49999", "bytes=0-19999",
         "bytes=20000-29999"]
    )  # fmt: skip
    assert {r["Authorization"] for r in hub.requests} == {"Bearer hf_tok"}
    assert {r["User-Agent"] for r in hub.requests} == {"gpudoctor"}
    assert {r["path"].split("/resolve/")[0] for r in hub.requests} == {"/acme/x"}
    assert sorted(os.listdir(tmp_path / "inc")) == ["s.bin.incomplete", "w.bin.incomplete"]


def test_no_token_no_authorization(servers, tmp_path: Path) -> None:
    hub, _ = servers
    download(hub, tmp_path, {"w.bin": 100}, token=None)
    assert all("Authorization" not in r for r in hub.requests)


def test_the_cdn_gets_no_token_and_is_remembered(servers, tmp_path: Path) -> None:
    hub, cdn = servers
    hub.redirect_to = cdn.url
    left, _, files = download(hub, tmp_path, {"w.bin": 50_000})
    assert left == [] and files == {"w.bin": DATA}
    assert len(cdn.requests) == 3
    assert all("Authorization" not in r for r in cdn.requests)
    assert len(hub.requests) < 3 + 1  # later ranges go straight to the CDN


def test_a_redirect_loop_is_one_line(servers, tmp_path: Path) -> None:
    hub, cdn = servers
    hub.redirect_to = cdn.url
    cdn.redirect_to = hub.url
    with pytest.raises(WeightsError) as err:
        download(hub, tmp_path, {"w.bin": 100})
    assert str(err.value) == "too many redirects for w.bin"
    assert len(hub.requests) + len(cdn.requests) == fetch.MAX_REDIRECTS + 1


def test_a_refusal_is_one_line_with_the_server_s_first_line(servers, tmp_path: Path) -> None:
    hub, _ = servers
    hub.status = 403
    with pytest.raises(WeightsError) as err:
        download(hub, tmp_path, {"w.bin": 100})
    assert str(err.value) == "the Hub answered HTTP 403 for w.bin: no such file"
    hub.body = b""
    with pytest.raises(WeightsError) as err:
        download(hub, tmp_path, {"w.bin": 100})
    assert str(err.value) == "the Hub answered HTTP 403 for w.bin: Forbidden"


def test_a_dropped_connection_resumes_where_it_stopped(servers, tmp_path: Path) -> None:
    hub, _ = servers
    hub.drops = 2
    left, got, files = download(hub, tmp_path, {"w.bin": 20_000})
    assert left == [] and files == {"w.bin": DATA[:20_000]} and got == {"w.bin": 20_000}
    ranges = [r["Range"] for r in hub.requests]
    assert ranges == ["bytes=0-19999", "bytes=10000-19999", "bytes=15000-19999"]


def test_a_connection_that_keeps_dropping_fails(servers, tmp_path: Path) -> None:
    hub, _ = servers
    hub.drops = 3
    with pytest.raises(ConnectionError, match="connection closed at byte"):
        download(hub, tmp_path, {"w.bin": 20_000})


def test_a_server_without_ranges_leaves_no_temp_file(servers, tmp_path: Path) -> None:
    hub, _ = servers
    hub.whole = True
    left, _, files = download(hub, tmp_path, {"w.bin": 50_000, "s.bin": 30_000})
    assert left == ["s.bin", "w.bin"] and files == {}
    assert os.listdir(tmp_path / "inc") == []


def test_descriptors_and_threads_are_given_back(servers, tmp_path: Path) -> None:
    hub, _ = servers
    threads = {t for t in threading.enumerate() if t.name.startswith("range")}
    download(hub, tmp_path, {"w.bin": 50_000})
    assert {t for t in threading.enumerate() if t.name.startswith("range")} == threads
    assert open_files_under(tmp_path) == []
    hub.status = 500
    with pytest.raises(WeightsError):
        download(hub, tmp_path, {"w.bin": 50_000, "s.bin": 10})
    assert open_files_under(tmp_path) == []  # every temp file's descriptor closed


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
