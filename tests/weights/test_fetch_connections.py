"""The ranged downloader's connections against real misbehaving servers on loopback
(fast, in-process): every kind of redirect, keep-alive (one connection carries a
thread's ranges; one the server closed while idle costs no retry; one that broke or
was left with an unread answer is never reused), servers that hang up, stall, send more
than asked or an endless error page, HTTPS with certifi's CA bundle, the temp files
(no symlink followed, one flat name per path, closed before they are handed over), and
what Ctrl-C and an error leave running. The servers: tests/weights/range_server.py."""

from __future__ import annotations

import errno
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor.weights import fetch
from gpudoctor.weights.errors import WeightsError
from tests.weights.range_server import (
    DATA,
    Server,
    download,
    open_files_under,
    start_servers,
    stop_servers,
    tls_context,
)


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "RANGE_BYTES", 20_000)
    monkeypatch.setattr(fetch, "BUFFER_BYTES", 7_000)


@pytest.fixture
def tls_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Server]]:
    """Two HTTPS servers whose self-signed certificate is the bundle certifi names (the
    CA list a client uses when SSL_CERT_FILE and REQUESTS_CA_BUNDLE are unset)."""
    import certifi

    context, cert = tls_context(tmp_path)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.setattr(certifi, "where", lambda: str(cert))
    made = start_servers(2, tls=context)
    try:
        yield made
    finally:
        stop_servers(made)


def ports(server: Server) -> set[str]:
    """Return the client ports of the connections the server's requests came on."""
    return {r["port"] for r in server.requests}


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_every_redirect_status_is_followed(servers, tmp_path: Path, status: int) -> None:
    hub, cdn = servers
    hub.redirect_to, hub.redirect_status = cdn.url, status
    left, _, files = download(hub, tmp_path, {"w.bin": 30_000})
    assert left == [] and files == {"w.bin": DATA[:30_000]}
    assert len(cdn.requests) == 2


def test_a_signed_cdn_url_keeps_its_query(servers, tmp_path: Path) -> None:
    """The Hub sends big files to a pre-signed CDN URL: its query string is the signature."""
    hub, cdn = servers
    hub.redirect_to, hub.redirect_query = cdn.url, "?X-Amz-Signature=ab12&Expires=99"
    left, _, files = download(hub, tmp_path, {"w.bin": 50_000}, connections=1)
    assert left == [] and files == {"w.bin": DATA}
    assert [r["path"] for r in hub.requests] == ["/acme/x/resolve/abc/w.bin"]
    assert {r["path"] for r in cdn.requests} == {
        "/acme/x/resolve/abc/w.bin?X-Amz-Signature=ab12&Expires=99"
    }
    assert len(cdn.requests) == 3  # the redirect is remembered: one Hub request per file


def test_a_redirect_without_location_is_one_line(servers, tmp_path: Path) -> None:
    hub, cdn = servers
    hub.redirect_to, hub.redirect_status, hub.redirect_location = cdn.url, 307, False
    with pytest.raises(WeightsError) as err:
        download(hub, tmp_path, {"w.bin": 100})
    assert str(err.value) == "the Hub answered HTTP 307 without a Location for w.bin"
    assert len(hub.requests) == 1 and cdn.requests == []


def test_one_connection_carries_every_range_of_its_thread(servers, tmp_path: Path) -> None:
    """Keep-alive: with one connection asked for, three ranges go over one TCP connection,
    from a thread named ``range_N`` (what py-spy and faulthandler show)."""
    hub, _ = servers
    names: set[str] = set()
    left, got, files = download(
        hub,
        tmp_path,
        {"w.bin": 50_000},
        connections=1,
        on_bytes_too=lambda path, n: names.add(threading.current_thread().name),
    )
    assert left == [] and files == {"w.bin": DATA} and got == {"w.bin": 50_000}
    assert len(hub.requests) == 3 and len(ports(hub)) == 1
    assert names == {"range_0"}


def test_an_idle_connection_closed_by_the_server_costs_no_retry(servers, tmp_path: Path) -> None:
    """A server closing each kept-alive connection after its answer (an idle timeout): the
    next range's request on it is sent again on a fresh one at once, so the range keeps
    both of its retries for real failures (here, two answers that stop halfway)."""
    hub, _ = servers
    hub.close_after = True
    hub.script = ["ok", "half", "half"]
    left, got, files = download(hub, tmp_path, {"w.bin": 40_000}, connections=1)
    assert left == [] and files == {"w.bin": DATA[:40_000]} and got == {"w.bin": 40_000}
    assert [r["Range"] for r in hub.requests] == [
        "bytes=0-19999", "bytes=20000-39999", "bytes=30000-39999", "bytes=35000-39999"
    ]  # fmt: skip
    assert len(ports(hub)) == 4


@pytest.mark.parametrize("via_cdn", [False, True])
def test_a_connection_that_broke_mid_range_is_not_reused(
    servers, tmp_path: Path, via_cdn: bool
) -> None:
    """After an answer stopped halfway, the resumed request starts on a fresh connection
    (Hub or CDN, wherever the bytes come from): a server that then hangs up once is
    tried again at once, and the range still finishes."""
    hub, cdn = servers
    source = cdn if via_cdn else hub
    if via_cdn:
        hub.redirect_to = cdn.url
    source.script = ["half", "hangup", "half", "hangup"]
    left, got, files = download(hub, tmp_path, {"w.bin": 20_000}, connections=1)
    assert left == [] and files == {"w.bin": DATA[:20_000]} and got == {"w.bin": 20_000}
    assert len(source.requests) == 5 and len(ports(source)) == 5


def test_a_connection_left_with_an_unread_answer_is_not_reused(servers, tmp_path: Path) -> None:
    """A server that ignored Range for one file (its 200 answer left unread): the next
    file's request starts on a fresh connection, with both tries of each request."""
    hub, _ = servers
    hub.script = ["whole", "hangup", "half", "hangup", "half", "hangup"]
    left, _, files = download(hub, tmp_path, {"a.bin": 50_000, "b.bin": 20_000}, connections=1)
    assert left == ["a.bin"] and files == {"b.bin": DATA[:20_000]}
    assert len(hub.requests) == 7 and len(ports(hub)) == 7


def test_a_server_that_hangs_up_on_every_request_fails_after_six_tries(
    servers, tmp_path: Path
) -> None:
    hub, _ = servers
    hub.script = ["hangup"] * 6
    with pytest.raises(ConnectionError) as err:
        download(hub, tmp_path, {"w.bin": 100}, connections=1)
    assert str(err.value) == "Remote end closed connection without response"
    assert len(hub.requests) == 6 and len(ports(hub)) == 6


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_server_that_never_answers_times_out(
    servers, tls_servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    """No answer at all: each of the six tries gives up after TIMEOUT_S (no endless hang)."""
    monkeypatch.setattr(fetch, "TIMEOUT_S", 0.2)
    hub = (tls_servers if scheme == "https" else servers)[0]
    hub.script = ["stall"] * 6
    with pytest.raises(TimeoutError):
        download(hub, tmp_path, {"w.bin": 100}, connections=1)
    assert len(hub.requests) == 6


def test_https_trusts_certifis_ca_bundle(tls_servers, tmp_path: Path) -> None:
    """Over HTTPS (the Hub and a CDN), the server's certificate is checked against
    certifi's bundle: one TLS connection per host, reused for every range."""
    hub, cdn = tls_servers
    hub.redirect_to = cdn.url
    left, _, files = download(hub, tmp_path, {"w.bin": 50_000, "s.bin": 10}, connections=1)
    assert left == [] and files == {"w.bin": DATA, "s.bin": DATA[:10]}
    assert len(cdn.requests) == 4 and len(ports(cdn)) == 1 and len(ports(hub)) == 1


def test_https_with_an_untrusted_certificate_fails(
    tls_servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """certifi's real bundle does not hold the server's self-signed certificate."""
    import certifi

    monkeypatch.setattr(
        certifi, "where", lambda: str(Path(certifi.__file__).with_name("cacert.pem"))
    )
    hub, _ = tls_servers
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
        download(hub, tmp_path, {"w.bin": 100})


def test_bytes_beyond_the_range_asked_are_not_taken(servers, tmp_path: Path) -> None:
    """A server sending more than the range asked (to the end of its file): each range
    takes its own bytes only, the file keeps its size and each byte is counted once."""
    hub, _ = servers
    hub.overshoot = True
    left, got, files = download(hub, tmp_path, {"s.bin": 30_000, "w.bin": 50_000})
    assert left == [] and files == {"s.bin": DATA[:30_000], "w.bin": DATA}
    assert got == {"s.bin": 30_000, "w.bin": 50_000}


def test_an_endless_error_page_is_not_read_to_its_end(
    servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 500 whose page never ends: its first line is told at once (the page is not read
    to its end, which would time out and be taken for a network failure)."""
    monkeypatch.setattr(fetch, "TIMEOUT_S", 5.0)
    hub, _ = servers
    hub.script, hub.body = ["endless"], b"quota exceeded\n" + b"." * 600
    with pytest.raises(WeightsError) as err:
        download(hub, tmp_path, {"w.bin": 100})
    assert str(err.value) == "the Hub answered HTTP 500 for w.bin: quota exceeded"


def test_a_refusal_closes_its_connection(servers, tmp_path: Path) -> None:
    """A refusal with a long page: the connection is closed, not left half read."""
    hub, _ = servers
    hub.status, hub.body = 403, b"forbidden\n" + b"." * 5000
    with pytest.raises(WeightsError) as err:
        download(hub, tmp_path, {"w.bin": 100})
    assert str(err.value) == "the Hub answered HTTP 403 for w.bin: forbidden"
    assert hub.wait_ended(int(hub.requests[0]["port"]))


def test_a_long_first_line_is_cut_at_200_characters(servers, tmp_path: Path) -> None:
    hub, _ = servers
    hub.status, hub.body = 451, b"x" * 300
    with pytest.raises(WeightsError) as err:
        download(hub, tmp_path, {"w.bin": 100})
    assert str(err.value) == "the Hub answered HTTP 451 for w.bin: " + "x" * 200


def test_a_symlink_planted_as_a_temp_file_is_not_followed(servers, tmp_path: Path) -> None:
    """Another user's symlink in the incomplete folder: refused, its target untouched."""
    hub, _ = servers
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "w.bin.incomplete").symlink_to(victim)
    with pytest.raises(OSError) as err:
        download(hub, tmp_path, {"w.bin": 100})
    assert err.value.errno == errno.ELOOP
    assert victim.read_bytes() == b"precious" and hub.requests == []


def test_a_nested_path_is_one_flat_temp_file(servers, tmp_path: Path) -> None:
    hub, _ = servers
    temps: list[str] = []
    left, _, files = download(
        hub, tmp_path, {"sub/dir/w.bin": 100}, on_file_too=lambda p, t: temps.append(t.name)
    )
    assert left == [] and files == {"sub/dir/w.bin": DATA[:100]}
    assert temps == ["sub%2Fdir%2Fw.bin.incomplete"]


def test_a_finished_file_is_closed_before_it_is_handed_over(servers, tmp_path: Path) -> None:
    hub, _ = servers
    held: dict[str, list[str]] = {}
    download(
        hub,
        tmp_path,
        {"w.bin": 50_000, "s.bin": 10},
        on_file_too=lambda p, temp: held.update({p: open_files_under(temp)}),
    )
    assert held == {"w.bin": [], "s.bin": []}


def _range_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("range") and t not in before]


def _close_files_under(root: Path) -> None:
    for target in open_files_under(root):
        for n in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{n}") == target:
                    os.close(int(n))
            except OSError:
                continue


def test_ctrl_c_returns_at_once_and_leaves_the_files_of_ranges_in_flight_open(
    servers, tmp_path: Path
) -> None:
    """Ctrl-C (KeyboardInterrupt) while another range is being written: ``download``
    returns at once without joining that thread, and does not close the descriptor it
    is still writing to (the process is about to exit; a closed descriptor's number
    could be reused by another file under the thread's pwrite)."""
    hub, _ = servers
    before = set(threading.enumerate())
    writing, checked = threading.Event(), threading.Event()

    def on_bytes(path: str, n: int) -> None:
        if path == "a.bin":
            writing.wait(10)
            raise KeyboardInterrupt
        writing.set()
        checked.wait(10)

    try:
        with pytest.raises(KeyboardInterrupt):
            download(hub, tmp_path, {"b.bin": 20_000, "a.bin": 10_000}, on_bytes_too=on_bytes)
        assert [t.is_alive() for t in _range_threads(before)].count(True) >= 1
        assert sorted(Path(p).name for p in open_files_under(tmp_path / "inc")) == [
            "a.bin.incomplete",
            "b.bin.incomplete",
        ]
    finally:
        checked.set()
        for thread in _range_threads(before):
            thread.join(10)
        _close_files_under(tmp_path / "inc")


def _waits_in_shutdown_or_left(ident: int) -> str | None:
    """Return "joining" while thread ``ident`` waits in a pool's shutdown, "left" once it
    is out of RangedDownloader.download, None otherwise."""
    frame = sys._current_frames().get(ident)
    names = []
    while frame is not None:
        names.append((frame.f_code.co_name, frame.f_code.co_filename))
        frame = frame.f_back
    if any(name == "shutdown" and file.endswith("thread.py") for name, file in names):
        return "joining"
    if not any(name == "download" and file.endswith("fetch.py") for name, file in names):
        return "left"
    return None


def test_an_error_returns_only_once_every_range_in_flight_has_stopped(
    servers, tmp_path: Path
) -> None:
    """One file refused while another's range is being written: ``download`` raises the
    refusal only after that range's thread has stopped (it then closes the descriptors:
    no thread writes into a file after the error is reported)."""
    hub, _ = servers
    hub.refuse = {"a.bin": 403}
    caller, before = threading.get_ident(), set(threading.enumerate())
    checked = threading.Event()

    def on_bytes(path: str, n: int) -> None:
        state = None
        for _ in range(2000):
            state = _waits_in_shutdown_or_left(caller)
            if state:
                break
            threading.Event().wait(0.005)
        if state == "left":
            checked.wait(10)

    try:
        with pytest.raises(WeightsError, match=r"HTTP 403 for a\.bin"):
            download(hub, tmp_path, {"b.bin": 20_000, "a.bin": 10_000}, on_bytes_too=on_bytes)
        assert [t for t in _range_threads(before) if t.is_alive()] == []
        assert open_files_under(tmp_path / "inc") == []
    finally:
        checked.set()
        for thread in _range_threads(before):
            thread.join(10)
