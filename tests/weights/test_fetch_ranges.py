"""Ranged, multi-connection download (gpudoctor.weights.fetch) against the loopback Hub."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudoctor.weights import fetch
from tests.weights.hub_server import HubServer


def _serve(hub: HubServer, files: dict[str, bytes]) -> str:
    return hub.add_repo("org/big").commit(files)


def _download(
    hub: HubServer, sha: str, files: dict[str, bytes], dest: Path, connections: int = 4
) -> tuple[list[str], dict[str, int]]:
    incomplete = dest / ".gpudoctor-incomplete"
    incomplete.mkdir(parents=True)
    got: dict[str, int] = {}
    done: list[str] = []

    def on_file(path: str, temp: Path) -> None:
        os.rename(temp, dest / path)
        done.append(path)

    def on_bytes(path: str, n: int) -> None:
        got[path] = got.get(path, 0) + n

    url_of = lambda p: fetch.resolve_url(hub.url, "org/big", sha, p)  # noqa: E731
    downloader = fetch.RangedDownloader(url_of, "hf_secret_token_value", connections)
    fallback = downloader.download(
        {p: len(b) for p, b in files.items()}, incomplete, on_bytes, on_file
    )
    return fallback, got | {"_done": len(done)}


def test_plan_ranges_round_robin() -> None:
    jobs = fetch.plan_ranges({"a": 25, "b": 12}, range_bytes=10)
    assert [(j.path, j.offset, j.length) for j in jobs] == [
        ("a", 0, 10),
        ("b", 0, 10),
        ("a", 10, 10),
        ("b", 10, 2),
        ("a", 20, 5),
    ]


def test_files_arrive_byte_identical_over_several_ranges(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file is fetched as several 206 ranges, and the bytes land at their offsets."""
    monkeypatch.setattr(fetch, "RANGE_BYTES", 1 << 20)
    monkeypatch.setattr(fetch, "BUFFER_BYTES", 300_000)
    files = {"a.safetensors": os.urandom(3_500_000), "b.safetensors": os.urandom(2_100_000)}
    sha = _serve(hub, files)
    fallback, got = _download(hub, sha, files, tmp_path / "dst")
    assert fallback == []
    for path, data in files.items():
        assert (tmp_path / "dst" / path).read_bytes() == data
        assert got[path] == len(data)
    gets = hub.file_gets()
    assert {r.status for r in gets} == {206}
    assert len(gets) == 4 + 3
    assert all(r.authorization == "Bearer hf_secret_token_value" for r in gets)


def test_redirect_to_the_cdn_is_followed(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Hub sends LFS bodies from another URL (302): ranges go there."""
    monkeypatch.setattr(fetch, "RANGE_BYTES", 1 << 20)
    hub.redirect_lfs = True
    files = {"a.safetensors": os.urandom(11_000_000)}
    sha = _serve(hub, files)
    fallback, _ = _download(hub, sha, files, tmp_path / "dst")
    assert fallback == []
    assert (tmp_path / "dst" / "a.safetensors").read_bytes() == files["a.safetensors"]
    cdn = [r for r in hub.requests if r.path.startswith("/cdn/")]
    assert len(cdn) == 11 and {r.status for r in cdn} == {206}


def test_server_without_ranges_is_reported_for_fallback(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that answers Range with 200 gets no half-written file: the caller falls back."""
    monkeypatch.setattr(fetch, "RANGE_BYTES", 1 << 20)
    hub.ignore_range = True
    files = {"a.safetensors": os.urandom(2_500_000)}
    sha = _serve(hub, files)
    fallback, _ = _download(hub, sha, files, tmp_path / "dst")
    assert fallback == ["a.safetensors"]
    assert not (tmp_path / "dst" / "a.safetensors").exists()
    assert list((tmp_path / "dst" / ".gpudoctor-incomplete").iterdir()) == []


def test_missing_file_is_one_line_error(hub: HubServer, tmp_path: Path) -> None:
    sha = _serve(hub, {"a.safetensors": b"x" * 10})
    from gpudoctor.weights.errors import WeightsError

    with pytest.raises(WeightsError, match=r"HTTP 404 for gone\.bin"):
        _download(hub, sha, {"gone.bin": b"y" * 10}, tmp_path / "dst")
