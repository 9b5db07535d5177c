"""The ranged downloader against small real HTTP servers on loopback (fast, in-process):
a token goes to the Hub's own host only, a redirect is followed once per file and then
remembered, a connection that drops mid-range is resumed where it stopped (twice at
most), and a server's refusal is one line. The servers are ``http.server`` instances
standing in for the Hub and its CDN (another host: another port here)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpudoctor.weights import fetch
from gpudoctor.weights.errors import WeightsError
from tests.weights.range_server import DATA, download, open_files_under


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


def test_the_biggest_file_s_ranges_come_first() -> None:
    """Round-robin starts with the biggest file, whatever the names' order."""
    jobs = fetch.plan_ranges({"a": 5, "b": 25}, range_bytes=10)
    assert [(j.path, j.offset) for j in jobs] == [("b", 0), ("a", 0), ("b", 10), ("b", 20)]


def test_an_endpoint_keeps_its_path_prefix() -> None:
    assert fetch.resolve_url("https://mirror.example/HF-BOX//", "acme/x", "abc", "w.bin") == (
        "https://mirror.example/HF-BOX/acme/x/resolve/abc/w.bin"
    )


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
    assert {r["path"] for r in hub.requests} == {
        "/acme/x/resolve/abc/w.bin",
        "/acme/x/resolve/abc/s.bin",
    }
    assert sorted(os.listdir(tmp_path / "inc")) == ["s.bin.incomplete", "w.bin.incomplete"]


def test_no_token_no_authorization(servers, tmp_path: Path) -> None:
    hub, _ = servers
    download(hub, tmp_path, {"w.bin": 100}, token=None)
    assert all("Authorization" not in r for r in hub.requests)


def test_the_cdn_gets_no_token_and_is_remembered(servers, tmp_path: Path) -> None:
    hub, cdn = servers
    hub.redirect_to = cdn.url
    left, _, files = download(hub, tmp_path, {"w.bin": 50_000}, connections=1)
    assert left == [] and files == {"w.bin": DATA}
    assert len(cdn.requests) == 3
    assert all("Authorization" not in r for r in cdn.requests)
    assert len(hub.requests) == 1  # later ranges go straight to the CDN


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
    with pytest.raises(ConnectionError) as err:  # 10000 + 5000 + 2500 bytes came
        download(hub, tmp_path, {"w.bin": 20_000})
    assert str(err.value) == "connection closed at byte 17500"
    hub.script = ["ok", "half", "half", "half"]  # the second range, from byte 20000
    with pytest.raises(ConnectionError) as err:
        download(hub, tmp_path, {"w.bin": 40_000}, connections=1)
    assert str(err.value) == "connection closed at byte 37500"


def test_a_server_without_ranges_leaves_no_temp_file(servers, tmp_path: Path) -> None:
    hub, _ = servers
    hub.whole = True
    left, _, files = download(hub, tmp_path, {"w.bin": 50_000, "s.bin": 30_000})
    assert left == ["s.bin", "w.bin"] and files == {}
    assert os.listdir(tmp_path / "inc") == []
    assert open_files_under(tmp_path) == []  # their descriptors closed too


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
